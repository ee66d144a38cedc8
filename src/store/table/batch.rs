//! A batch of one policy's keys in the table store (`take_batch`) in three statements instead of one or
//! two per key: an upsert that creates every missing row (full, which is what a missing row means) and
//! locks every existing one without writing it, in key order; a read of those rows; then the model
//! decides every key in the order given, in Rust, and one UPDATE writes the rows whose keys were granted.
//!
//! Why this is exact. The upsert (`INSERT … ON CONFLICT … DO UPDATE … WHERE false`) takes each row's lock
//! as the per-key path's `TAKE` would, key by key in key order, waiting for a concurrent writer (READ
//! COMMITTED; REPEATABLE READ and SERIALIZABLE raise 40001 for a row changed since the snapshot, as
//! `TAKE` does), so two batches, or a batch and single takes, lock in one order and never deadlock. From
//! there until the transaction ends nobody else can change those rows: deciding them in Rust on what the
//! read returns and writing the result is what `TAKE` does row by row.
//!
//! When it applies ([`applies`]): every cost between 1 and the policy's capacity (so that every created
//! row is then written, and no denial of an impossible cost leaves a row behind), no block, shadow mode or
//! Citus, a writable transaction. A row found ahead of the clock (the clock stepped back) sends the batch
//! to the per-key path, which rebases such rows. A denied key's row is locked, as a per-key denial's is
//! not: a batch holds every row it names until its transaction ends.

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::{Spi, SpiClient};

use super::super::interrupts;
use super::sql::stored_row;
use super::{read_only, spi, timestamptz};
use crate::time::clock;
use rate_limit_model::algorithm::Outcome;
use rate_limit_model::pipeline::batch::{Each, Key, Visit};
use rate_limit_model::target::{Ask, Stored, Target};

/// Creates the missing rows of `$2` (sorted, distinct) full, and locks every existing one, key by key in
/// key order; returns the keys it created. `DO UPDATE … WHERE false` locks a conflicting row (waiting for
/// a concurrent writer, and raising 40001 in REPEATABLE READ for a row changed since the snapshot) and
/// writes nothing to it.
const LOCK_OR_CREATE: &str = "INSERT INTO rate_limit.bucket_state AS b \
     (namespace, key, level, updated_at, algorithm, rate, per_us, burst) \
     SELECT $1, k.key, $3, $4, $5, $6, $7, $8 \
     FROM pg_catalog.unnest($2::pg_catalog.text[]) WITH ORDINALITY AS k(key, n) ORDER BY k.n \
     ON CONFLICT (namespace, key) DO UPDATE SET level = b.level WHERE false \
     RETURNING b.key";

/// The rows of keys `$2`, which this call holds locked: nobody can have changed them since.
const READ_HELD: &str = "SELECT key, level, updated_at, algorithm, rate, per_us, burst \
     FROM rate_limit.bucket_state \
     WHERE namespace OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.text[])";

/// Writes the new state of the granted keys `$2` (levels `$3`, instants `$4`) under the policy's numbers.
const WRITE_GRANTED: &str = "UPDATE rate_limit.bucket_state AS b \
     SET level = u.level, updated_at = u.at, algorithm = $5, rate = $6, per_us = $7, burst = $8 \
     FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.int8[]), \
                     pg_catalog.unnest($4::pg_catalog.timestamptz[])) AS u(key, level, at) \
     WHERE b.namespace OPERATOR(pg_catalog.=) $1 AND b.key OPERATOR(pg_catalog.=) u.key";

/// Whether a batch with these costs may be taken by [`take_each`] here and now (see the module comment;
/// the model has ruled out blocks and shadow mode before asking for a bulk path); the per-key path takes
/// it otherwise.
pub fn applies(template: &Target<'_>, costs: &[i64]) -> bool {
    let capacity = template.policy.burst();
    !crate::cluster::citus::citus_installed()
        && !read_only()
        && costs.iter().all(|&c| (1..=capacity).contains(&c))
}

/// Takes `costs[i]` tokens from the bucket of `keys[i]` under `template`'s policy, for every key in the
/// order given: one outcome per key. `None` when a row is ahead of the clock (the per-key path then
/// takes the batch, over rows this call now holds).
pub fn take_each(
    function: &'static str,
    template: &Target<'_>,
    keys: &[&str],
    costs: &[i64],
) -> Result<Option<Vec<Outcome>>, ErrorReport> {
    let mut distinct: Vec<&str> = keys.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    Spi::connect_mut(|client| {
        let now = clock::table_now_us();
        let mut held = lock_or_create(client, function, template, &distinct, now)?;
        if held.iter().flatten().any(|s| s.state.at > now) {
            return Ok(None);
        }
        let mut outcomes = Vec::with_capacity(keys.len());
        let mut granted = vec![false; distinct.len()];
        for (key, &cost) in keys.iter().zip(costs) {
            let i = distinct
                .binary_search(key)
                .map_err(|_| crate::error::bug(function, "a key of the batch has no row"))?;
            let target = Target { key, ..*template };
            let o = target.answer(held[i], now, Ask::Take(cost));
            if o.allowed {
                held[i] = Some(Stored {
                    state: o.state,
                    policy: template.policy,
                });
                granted[i] = true;
            }
            outcomes.push(o);
        }
        write_granted(client, function, template, &distinct, &held, &granted)?;
        Ok(Some(outcomes))
    })
}

/// Runs [`LOCK_OR_CREATE`] over `distinct` (sorted), then [`READ_HELD`]: every row's stored state, in
/// that order; `None` for a row this call created, which the model reads as the missing bucket it was
/// (what the per-key path decides on before it inserts).
fn lock_or_create(
    client: &mut SpiClient<'_>,
    function: &'static str,
    template: &Target<'_>,
    distinct: &[&str],
    now: i64,
) -> Result<Vec<Option<Stored>>, ErrorReport> {
    let p = &template.policy;
    let full = p.full(now);
    let args: [DatumWithOid<'_>; 8] = [
        template.namespace.stored_name().into(),
        distinct.to_vec().into(),
        full.level.into(),
        timestamptz(function, full.at)?.into(),
        p.algorithm().name().into(),
        p.rate().into(),
        p.period_us().into(),
        p.burst().into(),
    ];
    let mut created = Vec::new();
    for row in spi(function, client.update(LOCK_OR_CREATE, None, &args))? {
        if let Some(key) = spi(function, row.get::<String>(1))? {
            created.push(key);
        }
    }
    created.sort_unstable();
    let args: [DatumWithOid<'_>; 2] = [
        template.namespace.stored_name().into(),
        distinct.to_vec().into(),
    ];
    let mut held: Vec<(String, Option<Stored>)> = Vec::with_capacity(distinct.len());
    for row in spi(function, client.update(READ_HELD, None, &args))? {
        let cell = |n: usize| spi(function, row.get::<i64>(n));
        let key: Option<String> = spi(function, row.get(1))?;
        let at: Option<TimestampWithTimeZone> = spi(function, row.get(3))?;
        let algorithm: Option<String> = spi(function, row.get(4))?;
        let (Some(key), Some(level), Some(at), Some(algorithm), Some(rate), Some(per), Some(burst)) =
            (key, cell(2)?, at, algorithm, cell(5)?, cell(6)?, cell(7)?)
        else {
            return Err(crate::error::corrupt_row(
                function,
                "rate_limit.bucket_state has an invalid row",
            ));
        };
        let stored = stored_row(function, level, at, &algorithm, rate, per, burst)?;
        let new = created.binary_search(&key).is_ok();
        held.push((key, (!new).then_some(stored)));
    }
    held.sort_unstable_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    if held.len() != distinct.len() || held.iter().zip(distinct).any(|(h, k)| h.0 != *k) {
        return Err(crate::error::bug(
            function,
            "the batch did not find every key's row once",
        ));
    }
    Ok(held.into_iter().map(|(_, s)| s).collect())
}

/// Runs [`WRITE_GRANTED`] for the keys of `distinct` marked in `granted`, with their state in `held`.
fn write_granted(
    client: &mut SpiClient<'_>,
    function: &'static str,
    template: &Target<'_>,
    distinct: &[&str],
    held: &[Option<Stored>],
    granted: &[bool],
) -> Result<(), ErrorReport> {
    let mut keys = Vec::new();
    let mut levels = Vec::new();
    let mut instants = Vec::new();
    for ((key, s), _) in distinct.iter().zip(held).zip(granted).filter(|(_, g)| **g) {
        let Some(s) = s else { continue };
        keys.push(*key);
        levels.push(s.state.level);
        instants.push(timestamptz(function, s.state.at)?);
    }
    if keys.is_empty() {
        return Ok(());
    }
    let p = &template.policy;
    let args: [DatumWithOid<'_>; 8] = [
        template.namespace.stored_name().into(),
        keys.into(),
        levels.into(),
        instants.into(),
        p.algorithm().name().into(),
        p.rate().into(),
        p.period_us().into(),
        p.burst().into(),
    ];
    spi(function, client.update(WRITE_GRANTED, None, &args))?;
    Ok(())
}

/// The table store's way through a batch (the seam's `Buckets::take_each`): in three statements
/// ([`take_each`]) when `bulk` and [`applies`], else each key left to the model, in key order.
pub fn each_of_batch(
    function: &'static str,
    template: &Target<'_>,
    keys: &[&str],
    costs: &[i64],
    bulk: bool,
    each: &mut impl Visit<ErrorReport>,
) -> Result<(), ErrorReport> {
    if bulk && applies(template, costs) {
        if let Some(decided) = take_each(function, template, keys, costs)? {
            for (index, o) in decided.into_iter().enumerate() {
                let (key, cost) = (keys[index], costs[index]);
                each.visit(Key { index, key, cost }, Each::Decided(o))?;
            }
            return Ok(());
        }
    }
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&i| keys[i]);
    for (n, &index) in order.iter().enumerate() {
        interrupts::check_every(n);
        let (key, cost) = (keys[index], costs[index]);
        each.visit(Key { index, key, cost }, Each::Alone)?;
    }
    Ok(())
}
