//! Many keys of one policy decided in one call, each alone (`take_batch`): in the table store in key
//! order (its lock order), in the memory store in the order of their buckets in memory. Either way a key
//! named twice is taken in the order given, and every outcome is returned in the order given.

use pgrx::pg_sys::panic::ErrorReport;

use super::{memory, short, stats, table, take};
use crate::gucs::Store;
use rate_limit_model::algorithm::Outcome;
use rate_limit_model::target::Target;

/// Decides each of `keys` alone under the policy of `template` (`template` with each key), `costs[i]`
/// tokens for `keys[i]`, as [`take`] decides one target: one outcome per key, in the order given
/// (`take_batch`). A cancel or `statement_timeout` is checked for between keys.
///
/// The table store holds every row it writes locked until the transaction ends, so it locks the keys in
/// key order, the lock order (see [`super`]): two batches over the same keys never wait for each other in
/// a cycle. When nothing but the bucket applies to a key, the whole batch is three statements
/// ([`table`]'s `batch`: lock or create every row in key order, read them, write the granted ones);
/// otherwise each key is taken alone, in key order. A key named twice is still taken in the order given
/// (the sort is stable), and keys are independent, so the outcomes are those of the order given.
///
/// The memory store takes them in runs of at most [`RUN_KEYS`] keys, each in the order of the keys'
/// buckets in memory (a key named twice in the order given; see [`memory::Run`]), each bucket loaded into
/// the CPU cache a few keys ahead. A key whose bucket exists and has the tokens is taken with the
/// lock-free swap straight away when nothing else could apply to it: no block (the policy has no penalty
/// box, and no block by hand may have been made under it), no shadow mode, no Citus (a key may live on
/// another node). Every other key, and every denial, goes through [`take`].
pub fn take_each(
    function: &'static str,
    store: Store,
    template: &Target<'_>,
    keys: &[&str],
    costs: &[i64],
) -> Result<Vec<Outcome>, ErrorReport> {
    if store == Store::Table && table::batch_applies(template, costs) {
        if let Some(decided) = table::take_each(function, template, keys, costs)? {
            count_batch(template, keys, costs, &decided);
            return Ok(decided);
        }
    }
    let mut taken = vec![None; keys.len()];
    match store {
        Store::Table => {
            let mut order: Vec<usize> = (0..keys.len()).collect();
            order.sort_by_key(|&i| keys[i]);
            for (n, &i) in order.iter().enumerate() {
                check_interrupts_every(n);
                taken[i] = Some(take_one(function, store, template, keys[i], costs[i])?);
            }
        }
        Store::Memory => {
            for start in (0..keys.len()).step_by(RUN_KEYS) {
                let end = keys.len().min(start + RUN_KEYS);
                let run = memory::Run::plan(
                    function,
                    &template.namespace,
                    &keys[start..end],
                    &costs[start..end],
                )?;
                take_run(function, &run, template, &mut taken[start..end])?;
            }
        }
    }
    every_key_decided(function, taken)
}

/// The most keys the memory store puts in one order ([`memory::Run`]): enough for a run's neighbouring
/// keys to share pages of the store, few enough to keep a run's memory small (its keys' places, about 50
/// bytes each).
const RUN_KEYS: usize = 65_536;

/// Takes the keys of `run` (`template` with each key) of the memory store into `taken` (`taken[i]` for
/// the run's key `i`), a group of keys of one partition under one lock at a time.
fn take_run(
    function: &'static str,
    run: &memory::Run<'_>,
    template: &Target<'_>,
    taken: &mut [Option<Outcome>],
) -> Result<(), ErrorReport> {
    let short_path = !template.shadow
        && template.blocking.is_none_or(|b| !b.may_be_blocked())
        && !crate::cluster::citus::citus_installed();
    let hand_block_bit = run.hand_block_bit(&template.namespace);
    // the grants of the short path, counted in the statistics at once when the run ends or fails
    let (mut grants, mut tokens) = (0u64, 0u64);
    let mut decide_from = |from: usize| -> Result<usize, ErrorReport> {
        // interrupts are checked between groups (a group holds a partition's lock)
        let end = taken.len().min(next_interrupt_check(from));
        let stop = if short_path && !run.blocks_by_hand(hand_block_bit) {
            run.take_group(from, end, template, |n, o| {
                let (i, key, cost) = run.key(n);
                short::forget_taken(&template.namespace, key);
                grants += 1;
                tokens += cost as u64;
                taken[i] = Some(o);
            })
        } else {
            memory::Stop::NotGranted(from)
        };
        match stop {
            memory::Stop::Ended(next) => Ok(next),
            memory::Stop::NotGranted(n) => {
                let (i, key, cost) = run.key(n);
                taken[i] = Some(take_one(function, Store::Memory, template, key, cost)?);
                Ok(n + 1)
            }
        }
    };
    let mut n = 0;
    let decided = loop {
        if n >= run.len() {
            break Ok(());
        }
        check_interrupts_every(n);
        match decide_from(n) {
            Ok(next) => n = next,
            Err(e) => break Err(e),
        }
    };
    stats::record_grants(template, grants, tokens);
    decided
}

/// [`take`] of `cost` tokens for one key (`template` with `key`).
fn take_one(
    function: &'static str,
    store: Store,
    template: &Target<'_>,
    key: &str,
    cost: i64,
) -> Result<Outcome, ErrorReport> {
    let t = Target { key, ..*template };
    let outcomes = take(function, store, std::slice::from_ref(&t), cost)?;
    outcomes
        .first()
        .copied()
        .ok_or_else(|| crate::error::bug(function, "a take of one key has no outcome"))
}

/// The outcomes of a batch whose keys were decided in another order than given: `taken[i]` that of key
/// `i` (an internal error if one was left undecided).
fn every_key_decided(
    function: &'static str,
    taken: Vec<Option<Outcome>>,
) -> Result<Vec<Outcome>, ErrorReport> {
    taken
        .into_iter()
        .map(|o| o.ok_or_else(|| crate::error::bug(function, "a key was not decided")))
        .collect()
}

/// Counts a batch decided by the table store in two statements as its keys' takes would have been
/// counted (statistics), and remembers its short buckets as [`super::take_from_store`] does.
fn count_batch(template: &Target<'_>, keys: &[&str], costs: &[i64], outcomes: &[Outcome]) {
    let (mut grants, mut tokens) = (0u64, 0u64);
    for ((key, &cost), o) in keys.iter().zip(costs).zip(outcomes) {
        if o.allowed {
            short::forget_taken(&template.namespace, key);
            grants += 1;
            tokens += cost as u64;
        } else {
            let t = Target { key, ..*template };
            short::remember(Store::Table, &t, o.state);
            stats::record(std::slice::from_ref(&t), std::slice::from_ref(o), cost);
        }
    }
    stats::record_grants(template, grants, tokens);
}

/// Checks for a cancel or `statement_timeout` every [`KEYS_BETWEEN_INTERRUPT_CHECKS`] keys of a batch.
fn check_interrupts_every(n: usize) {
    if n.is_multiple_of(KEYS_BETWEEN_INTERRUPT_CHECKS) {
        pgrx::pg_sys::check_for_interrupts!();
    }
}

/// The number of the next key after `n` at which [`check_interrupts_every`] checks.
fn next_interrupt_check(n: usize) -> usize {
    (n / KEYS_BETWEEN_INTERRUPT_CHECKS + 1) * KEYS_BETWEEN_INTERRUPT_CHECKS
}

/// How many keys a batch decides between two checks for a cancel or `statement_timeout`.
const KEYS_BETWEEN_INTERRUPT_CHECKS: usize = 4096;
