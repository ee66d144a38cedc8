//! The table store: one row per bucket in `rate_limit.bucket_state`, keyed `(namespace, key)`, durable,
//! replicated and transactional (a ROLLBACK refunds).
//!
//! Every statement is an SPI plan prepared once per backend and kept. Each names every table, function and
//! operator with its schema (`OPERATOR(pg_catalog.=)`, as PostgreSQL's RI triggers build their queries), so
//! no caller's `search_path`, whoever prepared the plan first, can redirect it; the SQL functions that run
//! them are `SECURITY DEFINER` without any `SET` clause. Every kept statement touches one row through the
//! primary key and runs with sequential scans off ([`connect`], [`kept_plans`]): no plan depends on the
//! table's size when it was planned (a batch's statements, [`batch`], name many rows and are planned for
//! each batch). Statements that
//! may write are prepared as mutating (SPI runs them in a fresh snapshot) but run with `SpiClient::select`:
//! pgrx's `update` would force a transaction id, so that every denied call would commit a WAL record.
//!
//! Concurrency contract.
//! - One bucket, cost > 0: one conditional `UPDATE … WHERE rate_limit.state_after_take(…) >= 0` (`TAKE`).
//!   The arithmetic runs on the newest row version, once per version (its `WHERE` and `SET` share one
//!   evaluation, see [`sql`]): READ COMMITTED waits for a concurrent update and re-checks;
//!   REPEATABLE READ and SERIALIZABLE raise 40001. If it updates nothing, a fresh read tells a
//!   denial (nothing written) from a missing row, which is inserted with `ON CONFLICT DO NOTHING` (two
//!   creators never see a unique violation: the loser starts again).
//! - Several buckets, all or nothing: fresh reads decide denials without writing anything. Otherwise each
//!   bucket is taken with `TAKE`, one by one in one global `(namespace, key)` order (so two multi-limit calls
//!   cannot deadlock); a row updated by `TAKE` stays locked until the transaction ends. If a bucket turns
//!   out short after all (another session took its tokens between the read and `TAKE`), the buckets already
//!   taken are given back exactly (their rows are locked by this call) and the call is denied.
//! - Cost 0 (peek) reads in the caller's snapshot and writes nothing. In a read-only transaction only reads
//!   run: denials and peeks work, a grant raises 25006.
//! - Time: the caller reads the clock once and passes it; `TAKE` evaluates a row at the later of that
//!   reading and the row's instant (a row written after the reading counts no time as elapsed), with pure,
//!   IMMUTABLE helpers, so Citus can route it to the key's shard. A row found ahead of the clock after the
//!   call (the clock stepped back) is rebased on the clock, so that refill resumes from the step and the
//!   bucket never freezes: by the granting call, which holds the row; after a denial, conditionally on
//!   nobody having changed the row. That rebase is the one write a denied call may make.

mod batch;
mod leases;
mod plans;
mod purge;
mod sql;

use plans::{one_key, plans_for, Plans};

pub use batch::each_of_batch;
pub use leases::acquire;
pub use purge::{purge, purge_span, targets as purge_targets, Position, Span, STATE_TABLE};

#[cfg(any(test, feature = "pg_test"))]
pub use sql::evaluations;

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiClient, SpiError};
use pgrx::PgSqlErrorCode;

use crate::error;
use crate::kept_plans;
use crate::time::clock;
use rate_limit_model::algorithm::{Algorithm, Outcome, Policy, State};
use rate_limit_model::target::{evaluate_all, evaluate_costs, granted, Namespace, Stored, Target};

/// How often a call starts again (its row changed, vanished or appeared under it) before it gives up with
/// 40001.
const MAX_ATTEMPTS: usize = 16;

const WHERE_BUCKET: &str =
    "WHERE namespace OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2";
const COLUMNS: &str = "level, updated_at, algorithm, rate, per_us, burst";
const TAKE: &str = "UPDATE rate_limit.bucket_state SET \
     level = rate_limit.state_after_take(level, updated_at, algorithm, rate, per_us, burst, \
                                         $3, $4, $5, $6, $7, $8, $9, $10), \
     updated_at = GREATEST($8, updated_at), \
     algorithm = $3, rate = $4, per_us = $5, burst = $6 \
     WHERE namespace OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
       AND rate_limit.state_after_take(level, updated_at, algorithm, rate, per_us, burst, \
                                       $3, $4, $5, $6, $7, $8, $9, $10) OPERATOR(pg_catalog.>=) 0 \
     RETURNING level, updated_at";
const INSERT: &str = "INSERT INTO rate_limit.bucket_state \
     (namespace, key, level, updated_at, algorithm, rate, per_us, burst) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (namespace, key) DO NOTHING";
const SET_STATE: &str = "UPDATE rate_limit.bucket_state SET \
     level = $3, updated_at = $4, algorithm = $5, rate = $6, per_us = $7, burst = $8";
const DELETE: &str = "DELETE FROM rate_limit.bucket_state";
/// `Spi::connect_mut` for statements run with the kept [`plans`], which the planner plans for lookups by
/// key ([`kept_plans::by_key`]).
fn connect<R>(
    f: impl FnOnce(&mut SpiClient<'_>) -> Result<R, ErrorReport>,
) -> Result<R, ErrorReport> {
    kept_plans::by_key(|| Spi::connect_mut(f))
}

/// An SPI failure as XX000 (only a bug or a damaged installation can cause one).
fn spi<T>(function: &'static str, r: Result<T, SpiError>) -> Result<T, ErrorReport> {
    r.map_err(|e| error::internal(function, e))
}

/// Microseconds on the server clock as a `timestamptz` argument.
fn timestamptz(function: &'static str, us: i64) -> Result<TimestampWithTimeZone, ErrorReport> {
    TimestampWithTimeZone::try_from(us)
        .map_err(|_| error::corrupt_row(function, "updated_at is out of range"))
}

/// Whether the current transaction is read-only (the table store can then only read).
pub fn read_only() -> bool {
    // SAFETY: XactReadOnly is a plain global of the backend, read on the backend's only thread.
    unsafe { pg_sys::XactReadOnly }
}

/// The row arguments `namespace, key, level, updated_at, algorithm, rate, per_us, burst`.
fn row_args(
    function: &'static str,
    target: &Target<'_>,
    state: State,
) -> Result<[DatumWithOid<'static>; 8], ErrorReport> {
    let p = &target.policy;
    Ok([
        target.namespace.stored_name().to_string().into(),
        target.key.to_string().into(),
        state.level.into(),
        timestamptz(function, state.at)?.into(),
        p.algorithm().name().into(),
        p.rate().into(),
        p.period_us().into(),
        p.burst().into(),
    ])
}

/// Reads the row of `target` with a read plan (`read`, `read_fresh` or `lock`).
fn read(
    client: &SpiClient<'_>,
    plan: &OwnedPreparedStatement,
    function: &'static str,
    target: &Target<'_>,
) -> Result<Option<Stored>, ErrorReport> {
    let args: [DatumWithOid<'_>; 2] = [target.namespace.stored_name().into(), target.key.into()];
    read_with(client, plan, function, &args)
}

/// Reads one row ([`COLUMNS`]) with `plan` and its arguments.
fn read_with(
    client: &SpiClient<'_>,
    plan: &OwnedPreparedStatement,
    function: &'static str,
    args: &[DatumWithOid<'_>],
) -> Result<Option<Stored>, ErrorReport> {
    let table = spi(function, client.select(plan, Some(1), args))?;
    let Some(row) = table.into_iter().next() else {
        return Ok(None);
    };
    let corrupt = || error::corrupt_row(function, "rate_limit.bucket_state has an invalid row");
    let level: Option<i64> = spi(function, row.get(1))?;
    let at: Option<TimestampWithTimeZone> = spi(function, row.get(2))?;
    let algorithm: Option<String> = spi(function, row.get(3))?;
    let rate: Option<i64> = spi(function, row.get(4))?;
    let per: Option<i64> = spi(function, row.get(5))?;
    let burst: Option<i64> = spi(function, row.get(6))?;
    let (Some(level), Some(at), Some(algorithm), Some(rate), Some(per), Some(burst)) =
        (level, at, algorithm, rate, per, burst)
    else {
        return Err(corrupt());
    };
    let algorithm = Algorithm::parse(&algorithm).ok_or_else(corrupt)?;
    let policy = Policy::new(algorithm, rate, per, burst).map_err(|_| corrupt())?;
    Ok(Some(Stored {
        state: State {
            level,
            at: at.into_inner(),
        },
        policy,
    }))
}

/// Writes `state` as the row of `target` with the `write` plan (the row is locked by this call).
fn write(
    client: &SpiClient<'_>,
    plans: &Plans,
    function: &'static str,
    target: &Target<'_>,
    state: State,
) -> Result<(), ErrorReport> {
    let args = row_args(function, target, state)?;
    spi(function, client.select(&plans.write, None, &args))?;
    Ok(())
}

/// After a denial: if the stored row's instant lies ahead of `now` (the clock stepped back), rebases it on
/// `now` (`outcome.state`, which grants nothing), unless another session changed the row meanwhile.
fn rebase_if_behind(
    client: &SpiClient<'_>,
    plans: &Plans,
    function: &'static str,
    target: &Target<'_>,
    stored: Option<Stored>,
    outcome: &Outcome,
    now: i64,
) -> Result<(), ErrorReport> {
    let Some(stored) = stored.filter(|s| now < s.state.at) else {
        return Ok(());
    };
    if read_only() {
        return Ok(()); // nothing can be written; the next read-write call rebases
    }
    let [a, b, c, d, e, f, g, h] = row_args(function, target, outcome.state)?;
    let args = [
        a,
        b,
        c,
        d,
        e,
        f,
        g,
        h,
        stored.state.level.into(),
        timestamptz(function, stored.state.at)?.into(),
    ];
    spi(function, client.select(&plans.rebase, None, &args))?;
    Ok(())
}

fn gave_up(function: &'static str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        "could not take tokens: the buckets kept changing under this call",
        function,
    )
    .set_hint("Retry the call.")
}

/// Asks `targets[i]` for `costs[i]` tokens, every target, all or nothing (every cost above 0, or every cost
/// 0: a report); returns each target's outcome (all allowed, or with at least one denial and nothing taken).
pub fn take(
    function: &'static str,
    targets: &[Target<'_>],
    costs: &[i64],
) -> Result<Vec<Outcome>, ErrorReport> {
    let reports = costs.iter().all(|c| *c == 0);
    connect(|client| {
        let plans = plans_for(function, client, one_key(targets))?;
        if reports || read_only() {
            let plan = if reports {
                &plans.read
            } else {
                &plans.read_fresh
            };
            let mut stored = Vec::with_capacity(targets.len());
            for t in targets {
                stored.push(read(client, plan, function, t)?);
            }
            let now = clock::table_now_us();
            let outcomes = evaluate_costs(targets, &stored, now, costs);
            // a grant would write (unless only buckets in shadow mode denying it were asked)
            if !reports && granted(targets, &outcomes) && outcomes.iter().any(|o| o.allowed) {
                return Err(error::read_only(function));
            }
            return Ok(outcomes);
        }
        if let ([target], [cost]) = (targets, costs) {
            return take_one(client, plans, function, target, *cost).map(|o| vec![o]);
        }
        take_many(client, plans, function, targets, costs)
    })
}

/// Reports every target's bucket as it is now, in a fresh snapshot (so a change committed since the
/// caller's transaction began is seen, as [`take`] sees it), writing nothing.
pub fn peek_fresh(
    function: &'static str,
    targets: &[Target<'_>],
) -> Result<Vec<Outcome>, ErrorReport> {
    connect(|client| {
        let plans = plans_for(function, client, one_key(targets))?;
        let mut stored = Vec::with_capacity(targets.len());
        for t in targets {
            stored.push(read(client, &plans.read_fresh, function, t)?);
        }
        Ok(evaluate_all(targets, &stored, clock::table_now_us(), 0))
    })
}

/// Takes from one bucket: `Ok(outcome)`; the outcome is denied when it is short (nothing taken).
fn take_one(
    client: &SpiClient<'_>,
    plans: &Plans,
    function: &'static str,
    target: &Target<'_>,
    cost: i64,
) -> Result<Outcome, ErrorReport> {
    let p = &target.policy;
    for _ in 0..MAX_ATTEMPTS {
        // 1. one conditional UPDATE: granted if it returns the new state
        let now = clock::table_now_us();
        let args: [DatumWithOid<'_>; 10] = [
            target.namespace.stored_name().into(),
            target.key.into(),
            p.algorithm().name().into(),
            p.rate().into(),
            p.period_us().into(),
            p.burst().into(),
            timestamptz(function, target.changed_at.max(0))?.into(),
            timestamptz(function, now)?.into(),
            cost.into(),
            // a calendar window's end, from the caller's calendar; ignored by the other algorithms
            timestamptz(function, p.window_end(now).unwrap_or(now))?.into(),
        ];
        let table = spi(function, client.select(&plans.take, None, &args))?;
        if let Some(row) = table.into_iter().next() {
            let level: Option<i64> = spi(function, row.get(1))?;
            let at: Option<TimestampWithTimeZone> = spi(function, row.get(2))?;
            let (Some(level), Some(at)) = (level, at) else {
                return Err(error::corrupt_row(function, "level is NULL"));
            };
            let mut state = State {
                level,
                at: at.into_inner(),
            };
            // TAKE evaluated at max(now, the row's instant). A row still ahead of the clock after the
            // statement was not written by a concurrent call (whose instant is a clock reading taken
            // before now): the clock stepped back. Rebase the row, locked by this call, on the clock.
            let after = clock::table_now_us();
            if after < state.at {
                state = p.take(state, after, 0).state;
                write(client, plans, function, target, state)?;
            }
            let mut outcome = p.take(state, state.at, 0);
            outcome.state = state;
            return Ok(outcome);
        }
        // 2. nothing updated: short, or missing?
        let stored = read(client, &plans.read_fresh, function, target)?;
        let now = clock::table_now_us();
        let outcome = target.evaluate(stored, now, cost);
        if !outcome.allowed {
            rebase_if_behind(client, plans, function, target, stored, &outcome, now)?;
            return Ok(outcome);
        }
        if stored.is_some() {
            continue; // tokens arrived since TAKE looked: take them with TAKE
        }
        // 3. create the row; a concurrent creator makes this a no-op and we start again
        let args = row_args(function, target, outcome.state)?;
        if spi(function, client.select(&plans.insert, None, &args))?.len() == 1 {
            return Ok(outcome);
        }
    }
    Err(gave_up(function))
}

fn take_many(
    client: &SpiClient<'_>,
    plans: &Plans,
    function: &'static str,
    targets: &[Target<'_>],
    costs: &[i64],
) -> Result<Vec<Outcome>, ErrorReport> {
    // 1. decide denials from fresh reads, writing nothing
    let mut stored = Vec::with_capacity(targets.len());
    for t in targets {
        stored.push(read(client, &plans.read_fresh, function, t)?);
    }
    let now = clock::table_now_us();
    let mut outcomes = evaluate_costs(targets, &stored, now, costs);
    if !granted(targets, &outcomes) {
        for ((t, s), o) in targets.iter().zip(&stored).zip(&outcomes) {
            if !o.allowed {
                rebase_if_behind(client, plans, function, t, *s, o, now)?;
            }
        }
        return Ok(outcomes);
    }
    // 2. take bucket by bucket in the global (namespace, key) order
    let mut order: Vec<usize> = (0..targets.len()).collect();
    order.sort_by(|&a, &b| {
        let (ta, tb) = (&targets[a], &targets[b]);
        (ta.namespace.stored_name().as_bytes(), ta.key.as_bytes())
            .cmp(&(tb.namespace.stored_name().as_bytes(), tb.key.as_bytes()))
    });
    let mut taken: Vec<usize> = Vec::with_capacity(targets.len());
    for &i in &order {
        if !outcomes[i].allowed {
            continue; // a bucket in shadow mode that would deny: it keeps its state
        }
        let outcome = take_one(client, plans, function, &targets[i], costs[i])?;
        outcomes[i] = outcome;
        if !outcome.allowed && targets[i].shadow {
            continue; // short after all, in shadow mode: it takes nothing, the call goes on
        }
        if !outcome.allowed {
            // 3. short after all: give back what this call took (rows locked by it), exactly
            for &j in &taken {
                let after = outcomes[j].state;
                let before = targets[j].policy.refund(after, after.at, costs[j]);
                write(client, plans, function, &targets[j], before)?;
            }
            return Ok(outcomes);
        }
        taken.push(i);
    }
    Ok(outcomes)
}

/// The table store's lock-read-write step on one bucket: reads and locks its row (`FOR UPDATE`, until the
/// transaction ends), asks `step` what to write given the stored bucket and the clock, and writes that
/// state over the row if it exists (a missing row is a full bucket: nothing is inserted). 25006 in a
/// read-only transaction.
pub fn update<R>(
    function: &'static str,
    target: &Target<'_>,
    step: impl FnOnce(Option<Stored>, i64) -> (Option<State>, R),
) -> Result<R, ErrorReport> {
    if read_only() {
        return Err(error::read_only(function));
    }
    connect(|client| {
        let plans = plans_for(function, client, Some(target.key))?;
        let stored = read(client, &plans.lock, function, target)?;
        let (state, result) = step(stored, clock::table_now_us());
        if let Some(state) = state {
            write(client, plans, function, target, state)?;
        }
        Ok(result)
    })
}

/// Locks the row of `target`'s bucket (`FOR UPDATE`, until the transaction ends; waits for a transaction
/// that holds it), if it has one: the first step of the seam's lock order before its block bucket.
pub fn lock_row(function: &'static str, target: &Target<'_>) -> Result<(), ErrorReport> {
    connect(|client| {
        let plans = plans_for(function, client, Some(target.key))?;
        read(client, &plans.lock, function, target).map(|_| ())
    })
}

/// The table store's lock-read-write-or-insert step on one bucket (a charge): reads and locks its row,
/// asks `step` for the outcome given the stored bucket and the clock, and writes the outcome's state over
/// the row, or inserts it when the row is missing (a concurrent creator makes the insert a no-op: the call
/// starts again and locks that row). A reservation's or booking's bucket, made under a fresh random id,
/// is inserted first, in one statement; only a row already there (an id drawn twice) is read and locked.
/// 25006 in a read-only transaction.
pub fn upsert(
    function: &'static str,
    target: &Target<'_>,
    step: impl Fn(Option<Stored>, i64) -> Outcome,
) -> Result<Outcome, ErrorReport> {
    if read_only() {
        return Err(error::read_only(function));
    }
    connect(|client| {
        let plans = plans_for(function, client, Some(target.key))?;
        if target.policy.algorithm() == Algorithm::Reservation {
            let outcome = step(None, clock::table_now_us());
            let args = row_args(function, target, outcome.state)?;
            if spi(function, client.select(&plans.insert, None, &args))?.len() == 1 {
                return Ok(outcome);
            }
        }
        for _ in 0..MAX_ATTEMPTS {
            let stored = read(client, &plans.lock, function, target)?;
            let outcome = step(stored, clock::table_now_us());
            if stored.is_some() {
                write(client, plans, function, target, outcome.state)?;
                return Ok(outcome);
            }
            let args = row_args(function, target, outcome.state)?;
            if spi(function, client.select(&plans.insert, None, &args))?.len() == 1 {
                return Ok(outcome);
            }
        }
        Err(gave_up(function))
    })
}

/// Deletes the bucket (it is full again); true if there was one. 25006 in a read-only transaction.
pub fn reset(
    function: &'static str,
    namespace: &Namespace<'_>,
    key: &str,
) -> Result<bool, ErrorReport> {
    if read_only() {
        return Err(error::read_only(function));
    }
    connect(|client| {
        let plans = plans_for(function, client, Some(key))?;
        let args: [DatumWithOid<'_>; 2] = [namespace.stored_name().into(), key.into()];
        Ok(!spi(function, client.select(&plans.delete, None, &args))?.is_empty())
    })
}
