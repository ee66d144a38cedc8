//! The table store: one row per id in `rate_limit.bucket_state`, durable, replicated and transactional.
//!
//! Concurrency contract. Every statement below is an SPI plan prepared once per backend and kept
//! (`SPI_keepplan`); all of them name `rate_limit.bucket_state` with its schema, and the SQL functions that
//! run them are `SECURITY DEFINER` with `search_path = pg_catalog, pg_temp`, so a caller cannot redirect them.
//!
//! 1. `READ` the row without a lock. If, refilled to the clock read just after, it holds fewer tokens than
//!    asked, the call is denied and nothing is written: no row lock, no WAL, no dirty page. This is sound
//!    because the read sees committed state, and between refills other sessions can only remove tokens: a
//!    bucket that is short now stays short whatever commits concurrently. (A concurrent `reset` that
//!    commits after the read is ordered after this call.)
//! 2. A granted call on an existing row writes with compare-and-set: `UPDATE … WHERE id = $1 AND level = read
//!    AND updated_at = read`. One round trip when uncontended. If another transaction changed the row first,
//!    READ COMMITTED re-checks the newest version, the condition fails and no row is updated; REPEATABLE READ
//!    and SERIALIZABLE raise 40001 instead, which the caller retries.
//! 3. A missing row is created with `INSERT … ON CONFLICT (id) DO NOTHING`: two sessions creating the same
//!    id never see a unique_violation; the loser updates no row (READ COMMITTED) or gets 40001.
//! 4. After a lost race (2 or 3), `LOCK` the row with `SELECT … FOR UPDATE`, recompute from the locked
//!    version with the clock read after the lock was granted, and `UPDATE` it. If the row vanished in between
//!    (a concurrent reset or purge), start again from 1.
//!
//! Because the writes are ordinary row changes in the caller's transaction, a ROLLBACK refunds the token.

use std::cell::Cell;

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiClient, SpiError};
use pgrx::PgSqlErrorCode;

use crate::bucket::{Bucket, Limit, Take};
use crate::clock;
use crate::error;

/// How often a call starts again because its row was deleted under it before it gives up with 40001.
const MAX_ATTEMPTS: usize = 16;

const READ: &str = "SELECT level, updated_at FROM rate_limit.bucket_state WHERE id = $1";
const LOCK: &str = "SELECT level, updated_at FROM rate_limit.bucket_state WHERE id = $1 FOR UPDATE";
const COMPARE_AND_SET: &str = "UPDATE rate_limit.bucket_state \
     SET level = $2, updated_at = $3, refill_per_sec = $4, capacity = $5 \
     WHERE id = $1 AND level = $6 AND updated_at = $7";
const UPDATE: &str = "UPDATE rate_limit.bucket_state \
     SET level = $2, updated_at = $3, refill_per_sec = $4, capacity = $5 WHERE id = $1";
const INSERT: &str =
    "INSERT INTO rate_limit.bucket_state (id, level, updated_at, refill_per_sec, capacity) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING";
const DELETE: &str = "DELETE FROM rate_limit.bucket_state WHERE id = $1";
const PURGE: &str = "DELETE FROM rate_limit.bucket_state s \
     WHERE rate_limit.bucket_level_at(s.level, s.updated_at, s.refill_per_sec, s.capacity, $1) \
           >= s.capacity * 1000000";

/// The saved plans of this backend.
struct Plans {
    read: OwnedPreparedStatement,
    lock: OwnedPreparedStatement,
    compare_and_set: OwnedPreparedStatement,
    update: OwnedPreparedStatement,
    insert: OwnedPreparedStatement,
    delete: OwnedPreparedStatement,
}

thread_local! {
    /// Prepared on first use and kept for the life of the backend (PostgreSQL's plan cache revalidates them
    /// if the table is altered or recreated).
    static PLANS: Cell<Option<&'static Plans>> = const { Cell::new(None) };
}

fn oid(o: pg_sys::Oid) -> PgOid {
    PgOid::from(o)
}

fn prepare_plans(client: &SpiClient<'_>) -> Result<Plans, SpiError> {
    let text = oid(pg_sys::TEXTOID);
    let int8 = oid(pg_sys::INT8OID);
    let int4 = oid(pg_sys::INT4OID);
    let tstz = oid(pg_sys::TIMESTAMPTZOID);
    let write_args = [text, int8, tstz, int4, int8];
    Ok(Plans {
        read: client.prepare(READ, &[text])?.keep(),
        lock: client.prepare_mut(LOCK, &[text])?.keep(),
        compare_and_set: client
            .prepare_mut(COMPARE_AND_SET, &[text, int8, tstz, int4, int8, int8, tstz])?
            .keep(),
        update: client.prepare_mut(UPDATE, &write_args)?.keep(),
        insert: client.prepare_mut(INSERT, &write_args)?.keep(),
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

fn timestamptz(us: i64, function: &'static str) -> Result<TimestampWithTimeZone, ErrorReport> {
    TimestampWithTimeZone::try_from(us)
        .map_err(|_| error::corrupt_row(function, "updated_at is out of range"))
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
    fn write_args(&self, next: &Bucket) -> Result<[DatumWithOid<'static>; 5], ErrorReport> {
        // The refill rate of a per-second limit is at most i32::MAX: api.rs builds limits from int arguments.
        let refill = i32::try_from(self.limit.rate())
            .map_err(|_| error::corrupt_row(self.function, "refill_per_sec does not fit in int"))?;
        Ok([
            self.id.into(),
            next.level.into(),
            timestamptz(next.updated_at, self.function)?.into(),
            refill.into(),
            self.limit.burst().into(),
        ])
    }
}

fn spi<T>(function: &'static str, r: Result<T, SpiError>) -> Result<T, ErrorReport> {
    r.map_err(|e| error::internal(function, e))
}

/// Reads a bucket's row with the given plan (`READ` or `LOCK`).
fn load(
    client: &mut SpiClient<'_>,
    plan: &OwnedPreparedStatement,
    mutating: bool,
    id: &str,
    function: &'static str,
) -> Result<Option<Bucket>, ErrorReport> {
    let args: [DatumWithOid<'_>; 1] = [id.into()];
    let table = if mutating {
        spi(function, client.update(plan, Some(1), &args))?
    } else {
        spi(function, client.select(plan, Some(1), &args))?
    };
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

/// Raises 25006 if this transaction cannot write: the granted call could not be recorded.
fn ensure_writable(function: &'static str) -> Result<(), ErrorReport> {
    // SAFETY: XactReadOnly is a plain global of the backend, read on the backend's only thread.
    let read_only = unsafe { pg_sys::XactReadOnly };
    if read_only {
        Err(error::read_only(function))
    } else {
        Ok(())
    }
}

/// Takes `cost` tokens from the bucket of `id`: `Some(remaining)` when granted, `None` when denied.
pub fn take(request: &Request<'_>) -> Result<Option<i64>, ErrorReport> {
    let function = request.function;
    Spi::connect_mut(|client| {
        let plans = spi(function, plans(client))?;
        for _ in 0..MAX_ATTEMPTS {
            // 1. unlocked read: a denial ends here and writes nothing
            let stored = load(client, &plans.read, false, request.id, function)?;
            let now = clock::now_us();
            let current = stored.unwrap_or_else(|| Bucket::full(&request.limit, now));
            let (next, remaining) = match current.take(&request.limit, now, request.cost) {
                Take::Denied { .. } => return Ok(None),
                Take::Granted { bucket, remaining } => (bucket, remaining),
            };
            ensure_writable(function)?;
            let mut args: Vec<DatumWithOid<'_>> = request.write_args(&next)?.into();
            let written = match stored {
                // 2. compare-and-set against what was read
                Some(read) => {
                    args.push(read.level.into());
                    args.push(timestamptz(read.updated_at, function)?.into());
                    spi(function, client.update(&plans.compare_and_set, None, &args))?.len()
                }
                // 3. create; a concurrent creator makes this a no-op
                None => spi(function, client.update(&plans.insert, None, &args))?.len(),
            };
            if written == 1 {
                return Ok(Some(remaining));
            }
            // 4. lost a race: lock the newest version and decide on it
            let Some(locked) = load(client, &plans.lock, true, request.id, function)? else {
                continue; // deleted under us by a reset or purge: start again
            };
            let now = clock::now_us();
            return match locked.take(&request.limit, now, request.cost) {
                Take::Denied { .. } => Ok(None),
                Take::Granted { bucket, remaining } => {
                    let args = request.write_args(&bucket)?;
                    spi(function, client.update(&plans.update, None, &args))?;
                    Ok(Some(remaining))
                }
            };
        }
        Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            "could not take a token: the bucket was deleted concurrently too often",
            function,
        )
        .set_hint("Retry the call."))
    })
}

/// Whole tokens in the bucket of `id` now, without taking any and without writing.
pub fn peek(function: &'static str, id: &str, limit: &Limit) -> Result<i64, ErrorReport> {
    Spi::connect_mut(|client| {
        let plans = spi(function, plans(client))?;
        let stored = load(client, &plans.read, false, id, function)?;
        let now = clock::now_us();
        Ok(stored
            .map(|b| b.tokens_at(limit, now))
            .unwrap_or_else(|| limit.burst()))
    })
}

/// Deletes the bucket of `id` (it is full again); true if there was one.
pub fn reset(function: &'static str, id: &str) -> Result<bool, ErrorReport> {
    Spi::connect_mut(|client| {
        let plans = spi(function, plans(client))?;
        let args: [DatumWithOid<'_>; 1] = [id.into()];
        Ok(!spi(function, client.update(&plans.delete, None, &args))?.is_empty())
    })
}

/// Deletes every bucket that is full now, losslessly (a missing bucket is a full one); returns how many.
pub fn purge(function: &'static str) -> Result<i64, ErrorReport> {
    let now = timestamptz(clock::now_us(), function)?;
    Spi::connect_mut(|client| {
        let args: [DatumWithOid<'_>; 1] = [now.into()];
        let deleted = spi(function, client.update(PURGE, None, &args))?.len();
        Ok(i64::try_from(deleted).unwrap_or(i64::MAX))
    })
}
