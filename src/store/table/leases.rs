//! The table store's concurrency leases: each slot of a key is a row of `rate_limit.bucket_state` (its
//! namespace names the policy and the slot, its key is the caller's, so a key's slots share its Citus
//! shard), written in the caller's transaction: a lease acquired in a transaction that rolls back is
//! released with it.
//!
//! An acquire never waits for another transaction, and never makes a release wait. It locks only a free
//! slot's row (released, or its lease expired), with `FOR UPDATE SKIP LOCKED`, so a row another
//! transaction is changing (acquiring, releasing) is passed over and counted as held; a
//! slot without a row is created under a transaction-scoped advisory lock taken with
//! `pg_try_advisory_xact_lock` on a hash of (namespace, key), so that two transactions never insert the
//! same slot (a plain `INSERT … ON CONFLICT` would wait for the other's uncommitted row). One advisory lock
//! is held per slot this transaction created, until it ends; any role may take advisory locks anyway. A
//! hash shared with an unrelated advisory lock can only make a free slot look busy: a denial, never a
//! lease too many. In a read-only transaction an acquire reads only: it is denied when every slot is
//! held, and raises 25006 when one is free (a grant would write).

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiClient, SpiError};
use std::cell::Cell;

use super::{
    plans, read, read_only, read_with, row_args, spi, timestamptz, write, COLUMNS, WHERE_BUCKET,
};
use crate::algorithm::{lease_id, State};
use crate::clock;
use crate::error;
use crate::store::target::{Ask, Target};

/// The leases' own saved plans.
struct LeasePlans {
    /// Read and lock one row if its slot is free at `$3` (released, or its lease expired), unless another
    /// transaction holds the row: a held lease's row is never locked, so its release never waits.
    lock_skip: OwnedPreparedStatement,
    /// Take the advisory lock of one (namespace, key) if nobody holds it.
    try_lock: OwnedPreparedStatement,
}

thread_local! {
    /// Prepared on first use and kept for the life of the backend.
    static LEASE_PLANS: Cell<Option<&'static LeasePlans>> = const { Cell::new(None) };
}

fn prepare(client: &SpiClient<'_>) -> Result<LeasePlans, SpiError> {
    let text = PgOid::from(pg_sys::TEXTOID);
    let tstz = PgOid::from(pg_sys::TIMESTAMPTZOID);
    Ok(LeasePlans {
        lock_skip: client
            .prepare_mut(
                &format!(
                    "SELECT {COLUMNS} FROM rate_limit.bucket_state {WHERE_BUCKET} \
                     AND rate_limit.state_is_full(level, updated_at, algorithm, rate, per_us, burst, $3) \
                     FOR UPDATE SKIP LOCKED"
                ),
                &[text, text, tstz],
            )?
            .keep(),
        try_lock: client
            .prepare_mut(
                "SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended(\
                 $1 OPERATOR(pg_catalog.||) pg_catalog.chr(31) OPERATOR(pg_catalog.||) $2, 7))",
                &[text, text],
            )?
            .keep(),
    })
}

fn lease_plans(
    function: &'static str,
    client: &SpiClient<'_>,
) -> Result<&'static LeasePlans, ErrorReport> {
    if let Some(p) = LEASE_PLANS.with(Cell::get) {
        return Ok(p);
    }
    // Leaked on purpose: one small struct per backend, alive as long as the backend.
    let p: &'static LeasePlans = Box::leak(Box::new(spi(function, prepare(client))?));
    LEASE_PLANS.with(|cell| cell.set(Some(p)));
    Ok(p)
}

/// Whether this transaction got the advisory lock of the slot `target`.
fn try_lock(
    client: &SpiClient<'_>,
    plans: &LeasePlans,
    function: &'static str,
    target: &Target<'_>,
) -> Result<bool, ErrorReport> {
    let args: [DatumWithOid<'_>; 2] = [target.namespace.stored_name().into(), target.key.into()];
    let table = spi(function, client.select(&plans.try_lock, Some(1), &args))?;
    let got: Option<bool> = match table.into_iter().next() {
        Some(row) => spi(function, row.get(1))?,
        None => None,
    };
    Ok(got == Some(true))
}

/// Acquires a lease in the first slot of `slots` (one key's, in order) that is free, with the id
/// `lease_id(random, slot)`; returns every slot's state as this call saw it (a slot another transaction
/// is changing counts as held until a lease would expire), the granted slot's state, and the instant.
pub fn acquire(
    function: &'static str,
    slots: &[Target<'_>],
    random: u64,
) -> Result<(Vec<State>, Option<State>, i64), ErrorReport> {
    Spi::connect_mut(|client| {
        let plans = plans(function, client)?;
        let lease_plans = lease_plans(function, client)?;
        let now = clock::table_now_us();
        let ro = read_only();
        let mut states = Vec::with_capacity(slots.len());
        let mut granted = None;
        for (slot, t) in (0_i64..).zip(slots) {
            let in_flight = State {
                level: 1,
                at: now.saturating_add(t.policy.period_us()),
            };
            if granted.is_some() || ro {
                // report only
                let o = t.answer(
                    read(client, &plans.read_fresh, function, t)?,
                    now,
                    Ask::Take(0),
                );
                if ro && o.allowed {
                    return Err(error::read_only(function));
                }
                states.push(o.state);
                continue;
            }
            let ask = Ask::Acquire {
                lease: lease_id(random, slot),
            };
            let args: [DatumWithOid<'_>; 3] = [
                t.namespace.stored_name().into(),
                t.key.into(),
                timestamptz(function, now)?.into(),
            ];
            if let Some(stored) = read_with(client, &lease_plans.lock_skip, function, &args)? {
                let o = t.answer(Some(stored), now, ask);
                if o.allowed {
                    write(client, plans, function, t, o.state)?;
                    granted = Some(o.state);
                }
                states.push(o.state);
                continue;
            }
            // no free row this call could lock: the slot is held, another transaction is changing it,
            // or it has no row yet
            if let Some(stored) = read(client, &plans.read_fresh, function, t)? {
                let o = t.answer(Some(stored), now, Ask::Take(0));
                // free, yet not lockable: another transaction is taking or releasing it
                states.push(if o.allowed { in_flight } else { o.state });
                continue;
            }
            if !try_lock(client, lease_plans, function, t)? {
                states.push(in_flight);
                continue;
            }
            let o = t.answer(None, now, ask);
            let args = row_args(function, t, o.state)?;
            if spi(function, client.select(&plans.insert, None, &args))?.len() == 1 {
                granted = Some(o.state);
                states.push(o.state);
            } else {
                // committed by another transaction since this call looked
                states.push(in_flight);
            }
        }
        Ok((states, granted, now))
    })
}
