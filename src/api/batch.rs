//! `rate_limit.take_batch(policy, keys, costs, all_or_nothing)`: decisions for many keys of one policy in
//! one statement (queue consumers, batch jobs), one row per key in the order given.
//!
//! Each key is decided as `take(policy, key, cost)` would decide it, in the order of the array, through the
//! same seam (blocks, penalty boxes, shadow mode, statistics): a key named twice is taken twice. Only the
//! per-call work is paid once: the policy's lookup, the arguments' checks, the function call and its
//! result row. Keys are independent unless `all_or_nothing` asks otherwise; then the batch is one
//! `take_many` over its keys (at most [`MAX_TARGETS`] distinct keys, one cost), granted whole or not at all.
//! Why that bound: an all-or-nothing call holds every bucket it names at once (the memory store's
//! partition locks, the table store's row locks), and one caller holding thousands would stall every other
//! caller of those partitions.

use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::Array;

use super::{policy_arg, policy_target, store_of};
use crate::algorithm::Outcome;
use crate::decision;
use crate::error::{self, MAX_ID_BYTES};
use crate::gucs::Store;
use crate::policies::Named;
use crate::store;
use crate::target::{granted, Target, MAX_TARGETS};

/// The most keys one batch may name: its outcomes stay in the caller's memory until the rows are
/// returned (about 60 bytes each, 60 MB at this bound); a larger job is several batches.
pub const MAX_BATCH: usize = 1_000_000;

/// How many keys ahead of the one decided a batch starts loading buckets into the CPU cache: enough for
/// a miss (a few hundred nanoseconds) to complete while the keys before it are decided.
const PREFETCH_DISTANCE: usize = 8;

/// How many keys are decided between two checks for a query cancel or `statement_timeout`.
const KEYS_BETWEEN_INTERRUPT_CHECKS: usize = 4096;

/// One key's row: its position in `keys` (from 1), the key, whether its tokens were granted, the whole
/// tokens left, and when denied the wait until they exist (NULL when allowed or never).
pub type BatchRow = (i32, String, bool, i64, Option<Interval>);

/// The keys of a batch, validated: no NULL element, at most [`MAX_BATCH`] keys of at most
/// [`MAX_ID_BYTES`] bytes each (an empty array is an empty batch).
fn keys_arg<'k>(
    function: &'static str,
    keys: &'k Array<'_, &str>,
) -> Result<Vec<&'k str>, ErrorReport> {
    if keys.len() > MAX_BATCH {
        return Err(error::invalid_value(
            function,
            format!("keys holds {} keys, more than {MAX_BATCH}", keys.len()),
            "Split the job into batches of at most 1000000 keys.",
        ));
    }
    let mut valid = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let key = key.ok_or_else(|| {
            error::null_argument(
                function,
                &format!("keys[{}]", i + 1),
                "Every element of keys must be a key; filter NULLs out first.",
            )
        })?;
        if key.len() > MAX_ID_BYTES {
            return Err(error::key_too_long(function, "keys", key.len()));
        }
        valid.push(key);
    }
    Ok(valid)
}

/// The cost of each key: 1 each when `costs` is NULL, else one cost (0 or more) per key.
fn costs_arg(
    function: &'static str,
    costs: Option<Array<'_, i32>>,
    keys: usize,
) -> Result<Vec<i64>, ErrorReport> {
    let Some(costs) = costs else {
        return Ok(vec![1; keys]);
    };
    if costs.len() != keys {
        return Err(error::invalid_value(
            function,
            format!("costs holds {} costs for {keys} keys", costs.len()),
            "Pass one cost per key in the same order, or NULL for 1 each.",
        ));
    }
    let mut valid = Vec::with_capacity(keys);
    for (i, cost) in costs.iter().enumerate() {
        let argument = format!("costs[{}]", i + 1);
        let cost = cost.ok_or_else(|| {
            error::null_argument(function, &argument, "Pass 0 or more tokens for every key.")
        })?;
        if cost < 0 {
            return Err(error::out_of_range(
                function,
                &argument,
                cost.into(),
                0,
                i32::MAX.into(),
            ));
        }
        valid.push(i64::from(cost));
    }
    Ok(valid)
}

/// Every key decided on its own: one outcome per key, `outcomes[i]` for `keys[i]`.
///
/// The memory store decides the keys in the order given, loading each key's bucket into the CPU cache a
/// few keys ahead. The table store holds each row it writes locked until the transaction ends, so it takes
/// the keys in key order, the seam's lock order (`store/mod.rs`): two batches naming the same keys in
/// different orders then never wait for each other in a cycle (40P01). A key named twice is still taken in
/// the order given (the sort is stable), and keys are independent, so the outcomes are those of the order
/// given.
fn take_each(
    function: &'static str,
    named: &Named,
    keys: &[&str],
    costs: &[i64],
) -> Result<Vec<Outcome>, ErrorReport> {
    let store = store_of(Some(named));
    let mut order: Vec<usize> = (0..keys.len()).collect();
    if store == Store::Table {
        order.sort_by_key(|&i| keys[i]);
    }
    let mut outcomes = vec![None; keys.len()];
    for &i in order.iter().take(PREFETCH_DISTANCE) {
        store::prefetch(store, &policy_target(named, keys[i]));
    }
    for (n, &i) in order.iter().enumerate() {
        if n % KEYS_BETWEEN_INTERRUPT_CHECKS == 0 {
            pg_sys::check_for_interrupts!();
        }
        if let Some(&ahead) = order.get(n + PREFETCH_DISTANCE) {
            store::prefetch(store, &policy_target(named, keys[ahead]));
        }
        let target = [policy_target(named, keys[i])];
        outcomes[i] = store::take(function, store, &target, costs[i])?
            .first()
            .copied();
    }
    outcomes
        .into_iter()
        .map(|o| o.ok_or_else(|| error::bug(function, "a key of a batch was not decided")))
        .collect()
}

/// The keys decided together, all or nothing: at most [`MAX_TARGETS`] distinct keys and one cost; every
/// row says whether the batch was granted.
fn take_all_or_nothing(
    function: &'static str,
    named: &Named,
    keys: &[&str],
    costs: &[i64],
) -> Result<Vec<Outcome>, ErrorReport> {
    if keys.len() > MAX_TARGETS {
        return Err(error::invalid_value(
            function,
            format!(
                "an all-or-nothing batch names at most {MAX_TARGETS} keys, got {}",
                keys.len()
            ),
            "Hold fewer buckets at once: split the batch, or pass all_or_nothing => false.",
        ));
    }
    let cost = costs.first().copied().unwrap_or(1);
    if costs.iter().any(|&c| c != cost) {
        return Err(error::invalid_value(
            function,
            "an all-or-nothing batch takes one cost from every key".to_string(),
            "Pass the same cost for every key, or all_or_nothing => false.",
        ));
    }
    let targets: Vec<Target<'_>> = keys.iter().map(|k| policy_target(named, k)).collect();
    if let Some((i, _)) = keys
        .iter()
        .enumerate()
        .find(|(i, k)| keys[..*i].contains(k))
    {
        return Err(error::invalid_value(
            function,
            format!(
                "key \"{}\" is named twice in an all-or-nothing batch",
                keys[i]
            ),
            "Name each key once; pass a higher cost to take more tokens.",
        ));
    }
    let store = store_of(Some(named));
    let mut outcomes = store::take(function, store, &targets, cost)?;
    if granted(&targets, &outcomes) {
        return Ok(outcomes);
    }
    // nothing was taken: the keys that would have granted report what they hold (a denied call may not
    // even have looked at them), read as `peek` reads them
    let open: Vec<usize> = (0..targets.len())
        .filter(|&i| outcomes[i].allowed)
        .collect();
    let open_targets: Vec<Target<'_>> = open.iter().map(|&i| targets[i]).collect();
    let held = store::take(function, store, &open_targets, 0)?;
    for (i, o) in open.into_iter().zip(held) {
        outcomes[i] = o;
    }
    for o in &mut outcomes {
        o.allowed = false;
    }
    Ok(outcomes)
}

/// The rows of a batch: `outcomes[i]` is `keys[i]`'s.
fn rows(keys: &[&str], outcomes: Vec<Outcome>) -> impl Iterator<Item = BatchRow> {
    let keys: Vec<String> = keys.iter().map(|k| (*k).to_string()).collect();
    keys.into_iter()
        .zip(outcomes)
        .enumerate()
        .map(|(i, (key, o))| {
            let retry_after = o
                .retry_after
                .filter(|_| !o.allowed)
                .and_then(decision::interval);
            (i as i32 + 1, key, o.allowed, o.remaining, retry_after)
        })
}

/// The function, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Takes `costs[i]` tokens (1 each when `costs` is NULL; 0 only reports) from the bucket of `keys[i]`
    /// under `policy`, for every key in order, as many `take` calls would; one row per key, in the order
    /// given. With `all_or_nothing`, at most 16 distinct keys with one cost are granted together or not at
    /// all, as `take_many` grants them.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    fn take_batch<'a>(
        policy: Option<&str>,
        keys: Option<Array<'a, &'a str>>,
        costs: default!(Option<Array<'a, i32>>, "NULL"),
        all_or_nothing: default!(Option<bool>, false),
    ) -> Result<
        TableIterator<
            'static,
            (
                name!(ordinality, i32),
                name!(key, String),
                name!(allowed, bool),
                name!(remaining, i64),
                name!(retry_after, Option<Interval>),
            ),
        >,
        ErrorReport,
    > {
        const F: &str = "rate_limit.take_batch";
        let named = policy_arg(F, policy)?;
        let keys = keys.ok_or_else(|| {
            error::null_argument(
                F,
                "keys",
                "Pass an array of keys, e.g. ARRAY['user1', 'user2'].",
            )
        })?;
        let keys = keys_arg(F, &keys)?;
        let costs = costs_arg(F, costs, keys.len())?;
        let all_or_nothing = all_or_nothing.ok_or_else(|| {
            error::null_argument(
                F,
                "all_or_nothing",
                "Pass true to grant the batch whole or not at all, false to decide each key.",
            )
        })?;
        let outcomes = if keys.is_empty() {
            Vec::new()
        } else if all_or_nothing {
            take_all_or_nothing(F, &named, &keys, &costs)?
        } else {
            take_each(F, &named, &keys, &costs)?
        };
        Ok(TableIterator::new(rows(&keys, outcomes)))
    }
}
