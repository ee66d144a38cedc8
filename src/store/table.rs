//! The table store: one row per id in `rate_limit.bucket_state`, durable, replicated and transactional.
//!
//! Concurrency contract. Every statement below is an SPI plan prepared once per backend and kept
//! (`SPI_keepplan`); all of them name their objects with their schema, and the SQL functions that run them
//! are `SECURITY DEFINER` with `search_path = pg_catalog, pg_temp`, so a caller cannot redirect them.
//!
//! 0. A bucket this backend recently saw short is denied from memory, without any SQL (see `short.rs`).
//! 1. `TAKE`: one conditional `UPDATE … WHERE id = $1 AND rate_limit.level_after_take(…) >= 0`. The
//!    arithmetic runs inside the statement on the newest row version: in READ COMMITTED a concurrent update
//!    is waited for and re-checked, so concurrent callers serialise on the row and no token is granted
//!    twice; REPEATABLE READ and SERIALIZABLE raise 40001 instead, which the caller retries. A granted call
//!    on an existing bucket is this one statement. A denied one matches no row: it locks and writes nothing.
//! 2. If `TAKE` updated nothing, `READ` (a fresh snapshot) tells a short bucket (denied: remembered until the
//!    instant a token can exist) from a missing one.
//! 3. A missing row is created with `INSERT … ON CONFLICT (id) DO NOTHING`: two sessions creating the same
//!    id never see a unique_violation; the loser updates no row (READ COMMITTED, and starts again at 1) or
//!    gets 40001.
//!
//! In a read-only transaction, only `READ` runs: a denial needs no write, a grant raises 25006.
//!
//! Because the writes are ordinary row changes in the caller's transaction, a ROLLBACK refunds the token.

use std::cell::Cell;

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiClient, SpiError};
use pgrx::PgSqlErrorCode;

use crate::bucket::{Bucket, Limit, Take};
use crate::clock;
use crate::error;
use crate::store::short;
use crate::store::spi_util::{oid, read_only, spi, timestamptz};

/// How often a call starts again (its row changed, vanished or appeared under it) before it gives up
/// with 40001.
const MAX_ATTEMPTS: usize = 16;

const READ: &str = "SELECT level, updated_at FROM rate_limit.bucket_state WHERE id = $1";
const TAKE: &str = "UPDATE rate_limit.bucket_state \
     SET level = rate_limit.level_after_take(level, updated_at, $2, $3, $4, $5), \
         updated_at = greatest(updated_at, $4), refill_per_sec = $2, capacity = $3 \
     WHERE id = $1 AND rate_limit.level_after_take(level, updated_at, $2, $3, $4, $5) >= 0 \
     RETURNING level";
const INSERT: &str =
    "INSERT INTO rate_limit.bucket_state (id, level, updated_at, refill_per_sec, capacity) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING";
const DELETE: &str = "DELETE FROM rate_limit.bucket_state WHERE id = $1";
const PURGE: &str = "DELETE FROM rate_limit.bucket_state s \
     WHERE rate_limit.bucket_level_at(s.level, s.updated_at, s.refill_per_sec, s.capacity, $1) \
           >= s.capacity * 1000000";
const PURGE_POLICY_STATE: &str = "DELETE FROM rate_limit.policy_state s \
     WHERE rate_limit.policy_state_is_full(s.level, s.updated_at, s.algorithm, s.rate, s.per_us, s.burst, $1)";

/// The saved plans of this backend. The statements that may write are prepared as mutating (SPI runs them
/// in a fresh snapshot, not read-only) but executed with `SpiClient::select`, never `update`: pgrx's
/// `update` forces a transaction id to be assigned, which would make every denied call commit a WAL record.
/// PostgreSQL assigns one itself when a row is really changed.
struct Plans {
    /// `READ` in the caller's snapshot (peek: it never writes).
    read: OwnedPreparedStatement,
    /// `READ` in a fresh snapshot, after `TAKE` in the same call.
    read_fresh: OwnedPreparedStatement,
    take: OwnedPreparedStatement,
    insert: OwnedPreparedStatement,
    delete: OwnedPreparedStatement,
}

thread_local! {
    /// Prepared on first use and kept for the life of the backend (PostgreSQL's plan cache revalidates them
    /// if the table is altered or recreated).
    static PLANS: Cell<Option<&'static Plans>> = const { Cell::new(None) };
}

fn prepare_plans(client: &SpiClient<'_>) -> Result<Plans, SpiError> {
    let text = oid(pg_sys::TEXTOID);
    let int8 = oid(pg_sys::INT8OID);
    let int4 = oid(pg_sys::INT4OID);
    let tstz = oid(pg_sys::TIMESTAMPTZOID);
    Ok(Plans {
        read: client.prepare(READ, &[text])?.keep(),
        read_fresh: client.prepare_mut(READ, &[text])?.keep(),
        take: client
            .prepare_mut(TAKE, &[text, int4, int8, tstz, int8])?
            .keep(),
        insert: client
            .prepare_mut(INSERT, &[text, int8, tstz, int4, int8])?
            .keep(),
        delete: client.prepare_mut(DELETE, &[text])?.keep(),
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

/// What one SQL call asks of the store.
pub struct Request<'a> {
    /// The SQL function, for error reports.
    pub function: &'static str,
    /// The bucket's key.
    pub id: &'a str,
    /// The limit of this call.
    pub limit: Limit,
    /// Tokens to take.
    pub cost: i64,
}

impl Request<'_> {
    fn refill_per_sec(&self) -> Result<i32, ErrorReport> {
        // The refill rate of a per-second limit is at most i32::MAX: api.rs builds limits from int arguments.
        i32::try_from(self.limit.rate())
            .map_err(|_| error::corrupt_row(self.function, "refill_per_sec does not fit in int"))
    }
}

/// Reads a bucket's row with a `READ` plan: `plans.read` runs in the caller's snapshot, `plans.read_fresh`
/// (prepared as mutating) in a fresh one.
fn load(
    client: &SpiClient<'_>,
    plan: &OwnedPreparedStatement,
    id: &str,
    function: &'static str,
) -> Result<Option<Bucket>, ErrorReport> {
    let args: [DatumWithOid<'_>; 1] = [id.into()];
    let table = spi(function, client.select(plan, Some(1), &args))?;
    if table.is_empty() {
        return Ok(None);
    }
    let (level, updated_at) = spi(
        function,
        table.first().get_two::<i64, TimestampWithTimeZone>(),
    )?;
    match (level, updated_at) {
        (Some(level), Some(updated_at)) => Ok(Some(Bucket {
            level,
            updated_at: updated_at.into_inner(),
        })),
        _ => Err(error::corrupt_row(function, "level or updated_at is NULL")),
    }
}

/// Takes `cost` tokens from the bucket of `id`: `Some(remaining)` when granted, `None` when denied.
pub fn take(request: &Request<'_>) -> Result<Option<i64>, ErrorReport> {
    let function = request.function;
    let (id, limit, cost) = (request.id, &request.limit, request.cost);
    // 0. known short: deny without SQL
    if short::is_short(false, id, limit.rate(), limit.burst(), clock::now_us()) {
        return Ok(None);
    }
    let read_only = read_only();
    let refill = request.refill_per_sec()?;
    Spi::connect_mut(|client| {
        let plans = spi(function, plans(client))?;
        for _ in 0..MAX_ATTEMPTS {
            let now = clock::now_us();
            if !read_only {
                // 1. one conditional UPDATE: granted if it returns the new level
                let args: [DatumWithOid<'_>; 5] = [
                    id.into(),
                    refill.into(),
                    limit.burst().into(),
                    timestamptz(now, function)?.into(),
                    cost.into(),
                ];
                let table = spi(function, client.select(&plans.take, None, &args))?;
                if !table.is_empty() {
                    let level = spi(function, table.first().get_one::<i64>())?
                        .ok_or_else(|| error::corrupt_row(function, "level is NULL"))?;
                    return Ok(Some(level / limit.ticks_per_token()));
                }
            }
            // 2. nothing updated: short, or missing?
            let plan = if read_only {
                &plans.read
            } else {
                &plans.read_fresh
            };
            let stored = load(client, plan, id, function)?;
            let now = clock::now_us();
            let current = stored.unwrap_or_else(|| Bucket::full(limit, now));
            let (next, remaining) = match current.take(limit, now, cost) {
                Take::Denied { .. } => {
                    if let Some(until) = current.available_at(limit, now, cost) {
                        short::remember(false, id, limit.rate(), limit.burst(), until);
                    }
                    return Ok(None);
                }
                Take::Granted { bucket, remaining } => (bucket, remaining),
            };
            if read_only {
                return Err(error::read_only(function));
            }
            if stored.is_some() {
                continue; // a token arrived since TAKE looked: take it with TAKE
            }
            // 3. create the row; a concurrent creator makes this a no-op and we start again
            let args: [DatumWithOid<'_>; 5] = [
                id.into(),
                next.level.into(),
                timestamptz(next.updated_at, function)?.into(),
                refill.into(),
                limit.burst().into(),
            ];
            if spi(function, client.select(&plans.insert, None, &args))?.len() == 1 {
                return Ok(Some(remaining));
            }
        }
        Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            "could not take a token: the bucket kept changing under this call",
            function,
        )
        .set_hint("Retry the call."))
    })
}

/// The level (millionths of a token) of the bucket of `id` now, without taking any and without writing.
pub fn level_now(function: &'static str, id: &str, limit: &Limit) -> Result<i64, ErrorReport> {
    Spi::connect_mut(|client| {
        let plans = spi(function, plans(client))?;
        let stored = load(client, &plans.read, id, function)?;
        let now = clock::now_us();
        Ok(stored
            .map(|b| b.level_at(limit, now))
            .unwrap_or_else(|| limit.full_level()))
    })
}

/// Deletes the bucket of `id` (it is full again); true if there was one.
pub fn reset(function: &'static str, id: &str) -> Result<bool, ErrorReport> {
    short::forget(id);
    Spi::connect_mut(|client| {
        let plans = spi(function, plans(client))?;
        let args: [DatumWithOid<'_>; 1] = [id.into()];
        Ok(!spi(function, client.select(&plans.delete, None, &args))?.is_empty())
    })
}

/// Deletes every bucket (of `rate_limiting_request`, policies and ad-hoc limits) that is full now,
/// losslessly (a missing bucket is a full one); returns how many.
pub fn purge(function: &'static str) -> Result<i64, ErrorReport> {
    let now = timestamptz(clock::now_us(), function)?;
    Spi::connect_mut(|client| {
        let args: [DatumWithOid<'_>; 1] = [now.into()];
        let deleted = spi(function, client.update(PURGE, None, &args))?.len()
            + spi(function, client.update(PURGE_POLICY_STATE, None, &args))?.len();
        Ok(i64::try_from(deleted).unwrap_or(i64::MAX))
    })
}
