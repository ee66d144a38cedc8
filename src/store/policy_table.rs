//! The table store of policy and ad-hoc buckets: one row per (policy, key) in `rate_limit.policy_state`,
//! durable, replicated and transactional (a ROLLBACK refunds).
//!
//! Concurrency contract (plans are prepared once per backend, schema-qualified, run by `SECURITY DEFINER`
//! functions with a pinned `search_path`, and executed through `SpiClient::select` so that a call that
//! changes nothing takes no transaction id; see `table.rs`).
//! - One bucket, cost > 0: one conditional `UPDATE … WHERE rate_limit.state_after_take(…) >= 0`. The
//!   arithmetic runs on the newest row version (READ COMMITTED re-checks after waiting; REPEATABLE READ and
//!   SERIALIZABLE raise 40001). If it updates nothing, a fresh read tells a denial (nothing written) from a
//!   missing row, which is inserted with `ON CONFLICT DO NOTHING`.
//! - Several buckets (all-or-nothing): a fresh read decides denials without writing. Otherwise missing rows
//!   are inserted as full buckets (lossless: a missing bucket is a full one), all rows are locked with
//!   `SELECT … ORDER BY policy, key FOR UPDATE` (one global order, so two multi-limit calls cannot
//!   deadlock), re-evaluated under the locks, and written with one `UPDATE … FROM unnest(…)` only if every
//!   bucket grants. Nothing is written anywhere when one denies.
//! - Cost 0 (peek) reads in the caller's snapshot and writes nothing. In a read-only transaction only reads
//!   run: denials and peeks work, a grant raises 25006.

use std::cell::Cell;

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiClient, SpiError, SpiTupleTable};
use pgrx::PgSqlErrorCode;

use crate::algorithm::{Algorithm, Outcome, Policy, State};
use crate::clock;
use crate::error;
use crate::store::spi_util::{oid, read_only, spi, timestamptz};
use crate::store::target::{stored_policy, Stored, Target};

const MAX_ATTEMPTS: usize = 16;

const READ: &str = "SELECT level, updated_at, algorithm, rate, per_us, burst \
     FROM rate_limit.policy_state WHERE policy = $1 AND key = $2";
const TAKE: &str = "UPDATE rate_limit.policy_state SET \
     level = rate_limit.state_after_take(level, updated_at, algorithm, rate, per_us, burst, \
                                         $3, $4, $5, $6, $7, $8, $9), \
     updated_at = greatest(updated_at, $8), algorithm = $3, rate = $4, per_us = $5, burst = $6 \
     WHERE policy = $1 AND key = $2 \
       AND rate_limit.state_after_take(level, updated_at, algorithm, rate, per_us, burst, \
                                       $3, $4, $5, $6, $7, $8, $9) >= 0 \
     RETURNING level, updated_at";
const INSERT: &str = "INSERT INTO rate_limit.policy_state \
     (policy, key, level, updated_at, algorithm, rate, per_us, burst) \
     SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[], $5::text[], \
                          $6::bigint[], $7::bigint[], $8::bigint[]) \
     ON CONFLICT (policy, key) DO NOTHING";
/// Statements over several buckets name them in a `VALUES` list of exactly as many rows as the call has
/// targets (one plan per count, prepared on first use): the planner then knows how few rows it joins and
/// looks each one up in the primary key. (An `unnest` of array parameters is estimated at 100 rows, and a
/// generic plan built while the table is small can settle on a sequential scan.)
const MANY_COLUMNS: &str =
    "s.policy, s.key, s.level, s.updated_at, s.algorithm, s.rate, s.per_us, s.burst";

/// The kinds of multi-bucket statement.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Many {
    /// Read in the caller's snapshot.
    Read,
    /// Read in a fresh snapshot.
    ReadFresh,
    /// Lock the rows in (policy, key) order and read them.
    Lock,
    /// Write new states.
    Write,
}

/// `($1, $2), ($3, $4), …` for `n` rows of `width` parameters.
fn values_list(n: usize, width: usize) -> String {
    (0..n)
        .map(|row| {
            let params: Vec<String> = (1..=width)
                .map(|c| format!("${}", row * width + c))
                .collect();
            format!("({})", params.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn many_sql(kind: Many, n: usize) -> String {
    match kind {
        Many::Read | Many::ReadFresh => format!(
            "SELECT {MANY_COLUMNS} FROM (VALUES {}) AS u(policy, key) \
             JOIN rate_limit.policy_state AS s ON s.policy = u.policy AND s.key = u.key",
            values_list(n, 2)
        ),
        Many::Lock => format!(
            "SELECT {MANY_COLUMNS} FROM (VALUES {}) AS u(policy, key) \
             JOIN rate_limit.policy_state AS s ON s.policy = u.policy AND s.key = u.key \
             ORDER BY s.policy, s.key FOR UPDATE OF s",
            values_list(n, 2)
        ),
        Many::Write => format!(
            "UPDATE rate_limit.policy_state AS s SET level = u.level, updated_at = u.updated_at, \
             algorithm = u.algorithm, rate = u.rate, per_us = u.per_us, burst = u.burst \
             FROM (VALUES {}) AS u(policy, key, level, updated_at, algorithm, rate, per_us, burst) \
             WHERE s.policy = u.policy AND s.key = u.key",
            values_list(n, 8)
        ),
    }
}

thread_local! {
    /// Multi-bucket plans by kind and number of buckets (at most 4 × MAX_TARGETS), kept for the backend.
    static MANY_PLANS: std::cell::RefCell<std::collections::HashMap<(Many, usize), &'static OwnedPreparedStatement>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

fn many_plan(
    client: &SpiClient<'_>,
    kind: Many,
    n: usize,
) -> Result<&'static OwnedPreparedStatement, SpiError> {
    if let Some(plan) = MANY_PLANS.with(|m| m.borrow().get(&(kind, n)).copied()) {
        return Ok(plan);
    }
    let text = oid(pg_sys::TEXTOID);
    let int8 = oid(pg_sys::INT8OID);
    let tstz = oid(pg_sys::TIMESTAMPTZOID);
    let row: &[PgOid] = match kind {
        Many::Write => &[text, text, int8, tstz, text, int8, int8, int8],
        _ => &[text, text],
    };
    let types: Vec<PgOid> = (0..n).flat_map(|_| row.iter().copied()).collect();
    let sql = many_sql(kind, n);
    let prepared = match kind {
        Many::Read => client.prepare(&sql, &types)?,
        _ => client.prepare_mut(&sql, &types)?,
    };
    // Leaked on purpose: a bounded number of plans per backend, alive as long as the backend.
    let plan: &'static OwnedPreparedStatement = Box::leak(Box::new(prepared.keep()));
    MANY_PLANS.with(|m| m.borrow_mut().insert((kind, n), plan));
    Ok(plan)
}

const DELETE: &str = "DELETE FROM rate_limit.policy_state WHERE policy = $1 AND key = $2";

struct Plans {
    read: OwnedPreparedStatement,
    read_fresh: OwnedPreparedStatement,
    take: OwnedPreparedStatement,
    insert: OwnedPreparedStatement,
    delete: OwnedPreparedStatement,
}

thread_local! {
    static PLANS: Cell<Option<&'static Plans>> = const { Cell::new(None) };
}

fn prepare_plans(client: &SpiClient<'_>) -> Result<Plans, SpiError> {
    let text = oid(pg_sys::TEXTOID);
    let int8 = oid(pg_sys::INT8OID);
    let tstz = oid(pg_sys::TIMESTAMPTZOID);
    let texts = oid(pg_sys::TEXTARRAYOID);
    let int8s = oid(pg_sys::INT8ARRAYOID);
    let tstzs = oid(pg_sys::TIMESTAMPTZARRAYOID);
    let rows = [texts, texts, int8s, tstzs, texts, int8s, int8s, int8s];
    Ok(Plans {
        read: client.prepare(READ, &[text, text])?.keep(),
        read_fresh: client.prepare_mut(READ, &[text, text])?.keep(),
        take: client
            .prepare_mut(
                TAKE,
                &[text, text, text, int8, int8, int8, tstz, tstz, int8],
            )?
            .keep(),
        insert: client.prepare_mut(INSERT, &rows)?.keep(),
        delete: client.prepare_mut(DELETE, &[text, text])?.keep(),
    })
}

fn plans(client: &SpiClient<'_>) -> Result<&'static Plans, SpiError> {
    if let Some(plans) = PLANS.with(Cell::get) {
        return Ok(plans);
    }
    // Leaked on purpose: one small struct per backend, alive as long as the backend.
    let plans: &'static Plans = Box::leak(Box::new(prepare_plans(client)?));
    PLANS.with(|cell| cell.set(Some(plans)));
    Ok(plans)
}

/// Decodes `level, updated_at, algorithm, rate, per_us, burst` starting at column `first`.
fn stored_at(
    function: &'static str,
    row: &pgrx::spi::SpiHeapTupleData<'_>,
    first: usize,
) -> Result<Stored, ErrorReport> {
    let corrupt = || error::corrupt_row(function, "rate_limit.policy_state has an invalid row");
    let level: Option<i64> = spi(function, row.get(first))?;
    let at: Option<TimestampWithTimeZone> = spi(function, row.get(first + 1))?;
    let algorithm: Option<String> = spi(function, row.get(first + 2))?;
    let rate: Option<i64> = spi(function, row.get(first + 3))?;
    let per: Option<i64> = spi(function, row.get(first + 4))?;
    let burst: Option<i64> = spi(function, row.get(first + 5))?;
    let (Some(level), Some(at), Some(algorithm), Some(rate), Some(per), Some(burst)) =
        (level, at, algorithm, rate, per, burst)
    else {
        return Err(corrupt());
    };
    let algorithm = Algorithm::parse(&algorithm).ok_or_else(corrupt)?;
    let policy = stored_policy(algorithm, rate, per, burst).ok_or_else(corrupt)?;
    Ok(Stored {
        state: State {
            level,
            at: at.into_inner(),
        },
        policy,
    })
}

fn read_one(
    client: &SpiClient<'_>,
    plan: &OwnedPreparedStatement,
    function: &'static str,
    target: &Target<'_>,
) -> Result<Option<Stored>, ErrorReport> {
    let args: [DatumWithOid<'_>; 2] = [target.policy_name.into(), target.key.into()];
    let table = spi(function, client.select(plan, Some(1), &args))?;
    match table.into_iter().next() {
        Some(row) => Ok(Some(stored_at(function, &row, 1)?)),
        None => Ok(None),
    }
}

/// Rows of READ_MANY / LOCK_MANY, matched back to the targets.
fn collect_many(
    function: &'static str,
    table: SpiTupleTable<'_>,
    targets: &[Target<'_>],
) -> Result<Vec<Option<Stored>>, ErrorReport> {
    let mut found: Vec<Option<Stored>> = vec![None; targets.len()];
    for row in table {
        let policy: Option<String> = spi(function, row.get(1))?;
        let key: Option<String> = spi(function, row.get(2))?;
        let stored = stored_at(function, &row, 3)?;
        if let Some(i) = targets
            .iter()
            .position(|t| Some(t.policy_name) == policy.as_deref() && Some(t.key) == key.as_deref())
        {
            found[i] = Some(stored);
        }
    }
    Ok(found)
}

/// Runs a `Many::Read`, `ReadFresh` or `Lock` statement for the targets and matches the rows back.
fn read_many(
    client: &SpiClient<'_>,
    function: &'static str,
    kind: Many,
    targets: &[Target<'_>],
) -> Result<Vec<Option<Stored>>, ErrorReport> {
    let plan = spi(function, many_plan(client, kind, targets.len()))?;
    let mut args: Vec<DatumWithOid<'_>> = Vec::with_capacity(2 * targets.len());
    for t in targets {
        args.push(t.policy_name.into());
        args.push(t.key.into());
    }
    let table = spi(function, client.select(plan, None, &args))?;
    collect_many(function, table, targets)
}

/// Writes new states of existing rows with one `Many::Write` statement.
fn write_many(
    client: &SpiClient<'_>,
    function: &'static str,
    targets: &[&Target<'_>],
    states: &[State],
) -> Result<(), ErrorReport> {
    let plan = spi(function, many_plan(client, Many::Write, targets.len()))?;
    let mut args: Vec<DatumWithOid<'_>> = Vec::with_capacity(8 * targets.len());
    for (t, s) in targets.iter().zip(states) {
        args.push(t.policy_name.into());
        args.push(t.key.into());
        args.push(s.level.into());
        args.push(timestamptz(s.at, function)?.into());
        args.push(t.policy.algorithm().name().into());
        args.push(t.policy.rate().into());
        args.push(t.policy.period_us().into());
        args.push(t.policy.burst().into());
    }
    spi(function, client.select(plan, None, &args))?;
    Ok(())
}

/// Arguments of INSERT for the given targets and states.
fn row_args(
    function: &'static str,
    targets: &[&Target<'_>],
    states: &[State],
) -> Result<[DatumWithOid<'static>; 8], ErrorReport> {
    let mut ats = Vec::with_capacity(states.len());
    for s in states {
        ats.push(timestamptz(s.at, function)?);
    }
    let policies: Vec<String> = targets.iter().map(|t| t.policy_name.to_string()).collect();
    let keys: Vec<String> = targets.iter().map(|t| t.key.to_string()).collect();
    let levels: Vec<i64> = states.iter().map(|s| s.level).collect();
    let algorithms: Vec<String> = targets
        .iter()
        .map(|t| t.policy.algorithm().name().to_string())
        .collect();
    let rates: Vec<i64> = targets.iter().map(|t| t.policy.rate()).collect();
    let pers: Vec<i64> = targets.iter().map(|t| t.policy.period_us()).collect();
    let bursts: Vec<i64> = targets.iter().map(|t| t.policy.burst()).collect();
    Ok([
        policies.into(),
        keys.into(),
        levels.into(),
        ats.into(),
        algorithms.into(),
        rates.into(),
        pers.into(),
        bursts.into(),
    ])
}

fn gave_up(function: &'static str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        "could not take tokens: the buckets kept changing under this call",
        function,
    )
    .set_hint("Retry the call.")
}

/// Asks every target for `cost` tokens, all or nothing; returns each target's outcome (all allowed, or the
/// evaluation that denied, with nothing written).
pub fn take(
    function: &'static str,
    targets: &[Target<'_>],
    cost: i64,
) -> Result<Vec<Outcome>, ErrorReport> {
    Spi::connect_mut(|client| {
        let plans = spi(function, plans(client))?;
        if cost == 0 || read_only() {
            let read = if targets.len() == 1 {
                let plan = if cost == 0 {
                    &plans.read
                } else {
                    &plans.read_fresh
                };
                vec![read_one(client, plan, function, &targets[0])?]
            } else {
                let kind = if cost == 0 {
                    Many::Read
                } else {
                    Many::ReadFresh
                };
                read_many(client, function, kind, targets)?
            };
            let now = clock::now_us();
            let outcomes: Vec<Outcome> = targets
                .iter()
                .zip(read)
                .map(|(t, s)| t.evaluate(s, now, cost))
                .collect();
            if cost > 0 && outcomes.iter().all(|o| o.allowed) {
                return Err(error::read_only(function));
            }
            return Ok(outcomes);
        }
        if targets.len() == 1 {
            take_one(client, plans, function, &targets[0], cost).map(|o| vec![o])
        } else {
            take_many(client, plans, function, targets, cost)
        }
    })
}

fn take_one(
    client: &SpiClient<'_>,
    plans: &Plans,
    function: &'static str,
    target: &Target<'_>,
    cost: i64,
) -> Result<Outcome, ErrorReport> {
    let p = &target.policy;
    for _ in 0..MAX_ATTEMPTS {
        let now = clock::now_us();
        let args: [DatumWithOid<'_>; 9] = [
            target.policy_name.into(),
            target.key.into(),
            p.algorithm().name().into(),
            p.rate().into(),
            p.period_us().into(),
            p.burst().into(),
            timestamptz(target.changed_at.max(0), function)?.into(),
            timestamptz(now, function)?.into(),
            cost.into(),
        ];
        let table = spi(function, client.select(&plans.take, None, &args))?;
        if !table.is_empty() {
            let row = table.first();
            let level: Option<i64> = spi(function, row.get(1))?;
            let at: Option<TimestampWithTimeZone> = spi(function, row.get(2))?;
            let (Some(level), Some(at)) = (level, at) else {
                return Err(error::corrupt_row(function, "level is NULL"));
            };
            let state = State {
                level,
                at: at.into_inner(),
            };
            let mut outcome = p.take(state, now, 0);
            outcome.state = state;
            return Ok(outcome);
        }
        let stored = read_one(client, &plans.read_fresh, function, target)?;
        let now = clock::now_us();
        let outcome = target.evaluate(stored, now, cost);
        if !outcome.allowed {
            return Ok(outcome);
        }
        if stored.is_some() {
            continue; // tokens arrived since TAKE looked: take them with TAKE
        }
        let args = row_args(function, &[target], &[outcome.state])?;
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
    cost: i64,
) -> Result<Vec<Outcome>, ErrorReport> {
    let all: Vec<&Target<'_>> = targets.iter().collect();
    for _ in 0..MAX_ATTEMPTS {
        // 1. decide denials from a fresh read, writing nothing
        let stored = read_many(client, function, Many::ReadFresh, targets)?;
        let now = clock::now_us();
        let outcomes: Vec<Outcome> = targets
            .iter()
            .zip(&stored)
            .map(|(t, s)| t.evaluate(*s, now, cost))
            .collect();
        if !outcomes.iter().all(|o| o.allowed) {
            return Ok(outcomes);
        }
        // 2. missing rows become full rows (lossless)
        let missing: Vec<&Target<'_>> = targets
            .iter()
            .zip(&stored)
            .filter(|(_, s)| s.is_none())
            .map(|(t, _)| t)
            .collect();
        if !missing.is_empty() {
            let fulls: Vec<State> = missing.iter().map(|t| t.policy.full(now)).collect();
            let args = row_args(function, &missing, &fulls)?;
            spi(function, client.select(&plans.insert, None, &args))?;
        }
        // 3. lock every row in one global order, then decide for real
        let locked = read_many(client, function, Many::Lock, targets)?;
        if locked.iter().any(Option::is_none) {
            continue; // a row was deleted (reset or purge) between insert and lock
        }
        let now = clock::now_us();
        let outcomes: Vec<Outcome> = targets
            .iter()
            .zip(&locked)
            .map(|(t, s)| t.evaluate(*s, now, cost))
            .collect();
        if !outcomes.iter().all(|o| o.allowed) {
            return Ok(outcomes);
        }
        let states: Vec<State> = outcomes.iter().map(|o| o.state).collect();
        write_many(client, function, &all, &states)?;
        return Ok(outcomes);
    }
    Err(gave_up(function))
}

/// Puts up to `tokens` back into the bucket (capped at its capacity); returns the bucket afterwards.
pub fn refund(
    function: &'static str,
    target: &Target<'_>,
    tokens: i64,
) -> Result<Outcome, ErrorReport> {
    if read_only() {
        return Err(error::read_only(function));
    }
    Spi::connect_mut(|client| {
        let targets = std::slice::from_ref(target);
        let Some(stored) = read_many(client, function, Many::Lock, targets)?.remove(0) else {
            // no row: the bucket is full, nothing to put back
            let now = clock::now_us();
            return Ok(target.evaluate(None, now, 0));
        };
        let now = clock::now_us();
        let state = target
            .policy
            .refund(target.current(Some(stored), now), now, tokens);
        write_many(client, function, &[target], &[state])?;
        Ok(target.policy.take(state, now, 0))
    })
}

/// Deletes the bucket (it is full again); true if there was one.
pub fn reset(function: &'static str, policy_name: &str, key: &str) -> Result<bool, ErrorReport> {
    Spi::connect_mut(|client| {
        let plans = spi(function, plans(client))?;
        let args: [DatumWithOid<'_>; 2] = [policy_name.into(), key.into()];
        Ok(!spi(function, client.select(&plans.delete, None, &args))?.is_empty())
    })
}

/// The level after taking `cost` at `at` from a stored row, converted to the current numbers, or -1 when
/// denied: the arithmetic inside `TAKE`.
pub fn state_after_take(
    stored: Stored,
    current: Policy,
    changed_at: i64,
    at: i64,
    cost: i64,
) -> i64 {
    let state = current.carry_over(stored.state, &stored.policy, changed_at, at);
    let outcome = current.take(state, at, cost);
    if outcome.allowed {
        outcome.state.level
    } else {
        -1
    }
}
