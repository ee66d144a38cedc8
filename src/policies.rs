//! Named policies: validation of their parameters, and a per-backend cache of `rate_limit.policies`.
//!
//! Policies are read like a catalog. A statement trigger on `rate_limit.policies` (any INSERT, UPDATE,
//! DELETE or TRUNCATE, whether through the owner functions or not) queues a relcache invalidation of the
//! table. PostgreSQL delivers it to this backend at its next command (its own changes) and to every other
//! backend after the changing transaction has committed (it is sent after the commit is visible), at the
//! latest when their next transaction starts; the callback registered here then empties the cache.
//!
//! Why a cached value never outlives a change: a miss reads the row with the *latest* snapshot (not the
//! caller's transaction snapshot, which in REPEATABLE READ may predate a change whose invalidation this
//! backend has already consumed), after accepting pending invalidations. A change that commits after that
//! snapshot was taken sends its invalidation later; if it arrives while the row is being read (the read's
//! own lock acquisition accepts it), the generation counter has moved and the value is used for this call
//! but not cached; if it arrives afterwards, it empties the cache. So once a change has committed, every
//! transaction that starts afterwards, in any backend, uses the new numbers; within a transaction, a call
//! may still see the numbers of a change that committed after the transaction began (never older ones
//! than its own snapshot sees).
//!
//! The lookup names its table and operator with their schema, so no caller's `search_path` can redirect it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use pgrx::datum::{DatumWithOid, Interval, Timestamp, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self};
use pgrx::spi::Spi;
use pgrx::PgSqlErrorCode;

use crate::algorithm::{Algorithm, DebtError, Policy, PolicyError, MAX_BLOCK_US, MAX_WINDOW_COUNT};
use crate::error;
use crate::gucs::Store;
use crate::target::Blocking;
use crate::time::calendar;

/// The longest policy name, in bytes.
pub const MAX_NAME_BYTES: usize = 63;

/// A policy as stored in `rate_limit.policies`.
#[derive(Clone, Debug)]
pub struct Named {
    /// Its name.
    pub name: String,
    /// Algorithm and numbers.
    pub policy: Policy,
    /// Where its buckets live; `None` follows `rate_limit.store`.
    pub store: Option<Store>,
    /// When it was created (µs): with the name, it identifies this incarnation in the memory store.
    pub created_at: i64,
    /// When its numbers last changed (µs): buckets stored under older numbers carry over at this instant.
    pub changed_at: i64,
    /// Shadow mode: its buckets never deny a call; would-be denials are reported and counted.
    pub shadow: bool,
    /// How far below zero a charge may drive a bucket, in tokens (`rate_limit.charge`).
    pub max_debt: i64,
    /// How its keys are blocked: their block buckets' numbers and its penalty box, if any.
    pub blocking: Blocking,
}

struct Cache {
    table: pg_sys::Oid,
    policies: HashMap<String, Rc<Named>>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache {
        table: pg_sys::InvalidOid,
        policies: HashMap::new(),
    });
    /// Counts relcache invalidations that may concern `rate_limit.policies` (all of them while its oid is
    /// unknown): a read during which it moves is not cached.
    static GENERATION: Cell<u64> = const { Cell::new(0) };
}

/// Registers the relcache callback that empties the cache. Called once per backend from `_PG_init`.
pub fn register_invalidation() {
    // SAFETY: registering a callback is allowed at any time in a backend; the function lives as long as the
    // library, which is never unloaded, and ignores its argument.
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(Some(on_relcache), pg_sys::Datum::from(0usize));
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_relcache(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    CACHE.with(|c| match c.try_borrow_mut() {
        Ok(mut c) => {
            if relid == pg_sys::InvalidOid || relid == c.table || c.table == pg_sys::InvalidOid {
                c.policies.clear();
                c.table = pg_sys::InvalidOid;
                GENERATION.with(|g| g.set(g.get().wrapping_add(1)));
            }
        }
        // borrowed by a lookup on this stack: count it, so that the lookup does not cache its value
        Err(_) => GENERATION.with(|g| g.set(g.get().wrapping_add(1))),
    });
    crate::decision::forget_type_if(relid);
}

/// Queues the invalidation of every backend's cache (from the trigger on `rate_limit.policies`).
pub fn invalidate(table: pg_sys::Oid) {
    // SAFETY: a plain call into the invalidation machinery inside a transaction (trigger context).
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(table) }
}

/// 42704 for an unknown policy name.
pub fn unknown(function: &'static str, name: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        format!("rate limit policy \"{name}\" does not exist"),
        function,
    )
    .set_hint(
        "Create it with rate_limit.create_policy(name, rate, per), or see rate_limit.policies.",
    )
}

/// The policy called `name`, from the cache or `rate_limit.policies` (see the module comment).
pub fn get(function: &'static str, name: &str) -> Result<Rc<Named>, ErrorReport> {
    if let Some(found) = CACHE.with(|c| c.borrow().policies.get(name).cloned()) {
        return Ok(found);
    }
    // SAFETY: accepting invalidation messages is allowed anywhere inside a transaction; it may run the
    // relcache callback above, which only touches this module's thread-locals.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    let generation = GENERATION.with(Cell::get);
    let (named, table) = load_latest(function, name)?.ok_or_else(|| unknown(function, name))?;
    let named = Rc::new(named);
    if GENERATION.with(Cell::get) == generation {
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            c.table = table;
            c.policies.insert(name.to_string(), named.clone());
        });
    }
    Ok(named)
}

/// [`load`] under the latest snapshot, which sees every change committed before it was taken.
fn load_latest(
    function: &'static str,
    name: &str,
) -> Result<Option<(Named, pg_sys::Oid)>, ErrorReport> {
    // SAFETY: inside a transaction (an SQL function call), taking the latest snapshot and pushing it as the
    // active one is what PostgreSQL's own code does around catalog-like reads; it is popped on return, and
    // on error the transaction's abort pops every snapshot pushed since.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetLatestSnapshot()) };
    let loaded = load(function, name);
    // SAFETY: pops the snapshot pushed above (the read-only SPI call pushes and pops its own).
    unsafe { pg_sys::PopActiveSnapshot() };
    loaded
}

type Row = (
    Option<String>,
    Option<i64>,
    Option<Interval>,
    Option<i64>,
    Option<String>,
    Option<TimestampWithTimeZone>,
    Option<TimestampWithTimeZone>,
    Option<pg_sys::Oid>,
    Option<bool>,
    Option<i64>,
    Option<String>,
    Option<Timestamp>,
    Option<i64>,
    Option<Interval>,
);

/// Reads one policy from the table, with the active snapshot.
pub fn load(
    function: &'static str,
    name: &str,
) -> Result<Option<(Named, pg_sys::Oid)>, ErrorReport> {
    const QUERY: &str =
        "SELECT algorithm, rate, per, burst, store, created_at, changed_at, tableoid, shadow, max_debt, \
         time_zone, anchor, block_after, block_for FROM rate_limit.policies \
         WHERE name OPERATOR(pg_catalog.=) $1";
    let row: Option<Row> = Spi::connect(|client| {
        let args: [DatumWithOid<'_>; 1] = [name.into()];
        let table = client.select(QUERY, Some(1), &args)?;
        if table.is_empty() {
            return Ok(None);
        }
        let r = table.first();
        Ok::<_, pgrx::spi::SpiError>(Some((
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
            r.get(8)?,
            r.get(9)?,
            r.get(10)?,
            r.get(11)?,
            r.get(12)?,
            r.get(13)?,
            r.get(14)?,
        )))
    })
    .map_err(|e| error::internal(function, e))?;
    let Some((
        alg,
        rate,
        per,
        burst,
        store,
        created,
        changed,
        oid,
        shadow,
        max_debt,
        zone,
        anchor,
        block_after,
        block_for,
    )) = row
    else {
        return Ok(None);
    };
    let corrupt = |what: &str| error::corrupt_row(function, what);
    let algorithm = alg
        .as_deref()
        .and_then(Algorithm::parse)
        .ok_or_else(|| corrupt("policy algorithm is unknown"))?;
    let per = per.ok_or_else(|| corrupt("policy per is NULL"))?;
    let policy = build(
        function,
        algorithm,
        rate.ok_or_else(|| corrupt("policy rate is NULL"))?,
        per,
        Some(burst.ok_or_else(|| corrupt("policy burst is NULL"))?),
        zone.as_deref(),
        anchor.map(Timestamp::into_inner),
    )?;
    let store = match store.as_deref() {
        None => None,
        Some(s) => Some(parse_store(function, s)?),
    };
    let named = Named {
        name: name.to_string(),
        policy,
        store,
        created_at: created
            .ok_or_else(|| corrupt("policy created_at is NULL"))?
            .into_inner(),
        changed_at: changed
            .ok_or_else(|| corrupt("policy changed_at is NULL"))?
            .into_inner(),
        shadow: shadow.ok_or_else(|| corrupt("policy shadow is NULL"))?,
        max_debt: max_debt.ok_or_else(|| corrupt("policy max_debt is NULL"))?,
        blocking: blocking(function, &policy, block_after, block_for)?,
    };
    Ok(Some((named, oid.unwrap_or(pg_sys::InvalidOid))))
}

/// Validates a policy's numbers; `burst` `None` means "the same as rate". `time_zone` and `anchor` (a
/// wall-clock time) belong to calendar windows only, whose zone defaults to [`calendar::DEFAULT_ZONE`] and
/// anchor to the start of their step's unit.
pub fn build(
    function: &'static str,
    algorithm: Algorithm,
    rate: i64,
    per: Interval,
    burst: Option<i64>,
    time_zone: Option<&str>,
    anchor: Option<i64>,
) -> Result<Policy, ErrorReport> {
    if algorithm == Algorithm::CalendarWindow {
        if burst.is_some_and(|b| b != rate) {
            return Err(policy_error(function, PolicyError::WindowBurstNotRate));
        }
        let zone = time_zone.unwrap_or(calendar::DEFAULT_ZONE);
        let calendar = calendar::calendar(function, per, zone, anchor)?;
        return Policy::calendar(rate, calendar).map_err(|e| policy_error(function, e));
    }
    if time_zone.is_some() || anchor.is_some() {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "time_zone and anchor belong to calendar windows, not to algorithm '{}'",
                algorithm.name()
            ),
            function,
        )
        .set_hint(
            "Use algorithm => 'calendar_window' for windows that turn at dates, or omit them.",
        ));
    }
    let period = period_us(function, "per", per)?;
    Policy::new(algorithm, rate, period, burst.unwrap_or(rate))
        .map_err(|e| policy_error(function, e))
}

/// How the keys of `policy` are blocked, with the penalty box `block_after` denials within one of its
/// windows block a key for `block_for`: both NULL (no penalty box: blocks by hand only) or both given
/// (22023 otherwise, and for values out of range).
pub fn blocking(
    function: &'static str,
    policy: &Policy,
    block_after: Option<i64>,
    block_for: Option<Interval>,
) -> Result<Blocking, ErrorReport> {
    let hint = "Pass both block_after (denials within one window of the policy) and block_for (how long \
                the key is then blocked), e.g. block_after => 10, block_for => interval '15 minutes'; \
                or neither, for blocks by hand only.";
    let (block_after, penalty_for) = match (block_after, block_for) {
        (None, None) => (None, None),
        (Some(n), Some(d)) => {
            if !(1..=MAX_WINDOW_COUNT).contains(&n) {
                return Err(error::out_of_range(
                    function,
                    "block_after",
                    n,
                    1,
                    MAX_WINDOW_COUNT,
                ));
            }
            (Some(n), Some(block_duration_us(function, "block_for", d)?))
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(error::invalid_value(
                function,
                "block_after and block_for go together".to_string(),
                hint,
            ))
        }
    };
    let bucket = Policy::block_bucket(block_after, policy.period_us())
        .map_err(|e| policy_error(function, e))?;
    Ok(Blocking {
        bucket,
        penalty_for,
    })
}

/// A block's length as microseconds: positive, without months, at most 100 years (22023 otherwise).
pub fn block_duration_us(
    function: &'static str,
    argument: &str,
    duration: Interval,
) -> Result<i64, ErrorReport> {
    let us = period_us(function, argument, duration)?;
    if us > MAX_BLOCK_US {
        return Err(error::invalid_value(
            function,
            format!("{argument} must be at most 100 years"),
            "Pass a shorter interval; a key blocked for good is better refused by the application.",
        ));
    }
    Ok(us)
}

/// 42809 for a policy of the wrong kind: a concurrency policy named by a call that takes tokens, or
/// another policy named by `acquire` or `release`.
pub fn wrong_kind(function: &'static str, named: &Named) -> ErrorReport {
    let concurrency = named.policy.algorithm() == Algorithm::Concurrency;
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
        if concurrency {
            format!("policy \"{}\" limits leases held at once, not tokens", named.name)
        } else {
            format!("policy \"{}\" limits tokens, not leases held at once", named.name)
        },
        function,
    )
    .set_hint(if concurrency {
        "Take a lease with rate_limit.acquire(policy, key) and give it back with rate_limit.release."
    } else {
        "rate_limit.acquire and release need a policy created with algorithm => 'concurrency'."
    })
}

/// 22023 for parameters that do not make a policy.
pub fn policy_error(function: &'static str, e: PolicyError) -> ErrorReport {
    let hint = match e {
        PolicyError::WindowBurstNotRate => {
            "Omit burst (it defaults to rate), or use algorithm => 'token_bucket' for a burst above the rate."
        }
        PolicyError::WindowTooLarge => "Use a shorter window with a proportionally lower rate.",
        PolicyError::TooManyLeases => "Allow at most 1000 leases per key (rate), or split the key.",
        PolicyError::LeasesBurstNotRate => "Omit burst: rate is the number of leases a key may hold at once.",
        PolicyError::Limit(_) => {
            "Pass rate >= 1, burst >= 1 and a positive per; burst × per (in microseconds) must fit in bigint."
        }
    };
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        e.to_string(),
        function,
    )
    .set_hint(hint)
}

/// 22023 for a `max_debt` the policy's numbers cannot count.
pub fn debt_error(function: &'static str, e: DebtError) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        e.to_string(),
        function,
    )
    .set_hint(
        "max_debt is in tokens: how far below zero rate_limit.charge may drive a bucket (0: not at all).",
    )
}

/// An interval argument as microseconds: positive, and without months (whose length varies).
pub fn period_us(
    function: &'static str,
    argument: &str,
    per: Interval,
) -> Result<i64, ErrorReport> {
    if per.months() != 0 {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{argument} must not contain months or years, whose length varies"),
            function,
        )
        .set_hint(
            "Use days, hours, minutes or seconds, e.g. interval '30 days'; for a quota that resets on \
             the first of the month, create_policy(..., algorithm => 'calendar_window').",
        ));
    }
    let micros = per.as_micros();
    if micros < 1 {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{argument} must be a positive interval"),
            function,
        )
        .set_hint("Pass an interval of at least 1 microsecond, e.g. interval '1 minute'."));
    }
    i64::try_from(micros).map_err(|_| {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{argument} is too long"),
            function,
        )
    })
}

/// `'table'` or `'memory'`.
pub fn parse_store(function: &'static str, s: &str) -> Result<Store, ErrorReport> {
    match s {
        "table" => Ok(Store::Table),
        "memory" => Ok(Store::Memory),
        _ => Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("store must be 'table', 'memory' or NULL, got '{s}'"),
            function,
        )
        .set_hint("NULL follows the rate_limit.store setting of the calling session.")),
    }
}

/// `'token_bucket'`, `'fixed_window'`, `'sliding_window'`, `'calendar_window'` or `'concurrency'`.
pub fn parse_algorithm(function: &'static str, s: &str) -> Result<Algorithm, ErrorReport> {
    Algorithm::parse(s).filter(|a| a.makes_policies()).ok_or_else(|| {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("unknown algorithm '{s}'"),
            function,
        )
        .set_hint(
            "Use 'token_bucket', 'fixed_window', 'sliding_window', 'calendar_window' or 'concurrency'.",
        )
    })
}

/// A policy name: 1 to [`MAX_NAME_BYTES`] bytes of letters, digits and `_ . : / -`, so that it can be
/// printed unquoted in logs and as an HTTP structured-field string.
pub fn check_name(function: &'static str, name: &str) -> Result<(), ErrorReport> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:/-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("invalid policy name \"{name}\""),
            function,
        )
        .set_hint(format!(
            "Use 1 to {MAX_NAME_BYTES} ASCII letters, digits, '_', '.', ':', '/' or '-'."
        )))
    }
}
