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
use std::rc::Rc;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self};
use pgrx::PgSqlErrorCode;

use crate::gucs::Store;
use crate::name_map::{self, NameMap};
use crate::time::calendar;
use rate_limit_model::algorithm::{Adaptive, Policy};
use rate_limit_model::target::Blocking;

mod checks;
pub mod family;
pub mod options;
pub mod overrides;
pub mod row;

pub use checks::{
    adaptive, block_duration_us, blocking, build, check_name, debt_error, hold_us, parse_algorithm,
    parse_store, period_us, policy_error, wrong_kind,
};
pub use row::{Lock, Row};

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
    /// Its adaptive settings, for a concurrency policy whose limit adapts (option `latency_target`).
    pub adaptive: Option<Adaptive>,
    /// Its row as stored (an override's missing numbers are this row's, [`overrides::resolve`]).
    pub row: Row,
}

struct Cache {
    table: pg_sys::Oid,
    policies: NameMap<String, Rc<Named>>,
}

thread_local! {
    static CACHE: RefCell<Cache> = const {
        RefCell::new(Cache {
            table: pg_sys::InvalidOid,
            policies: name_map::new(),
        })
    };
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
    overrides::on_relcache(relid);
    crate::decision::forget_type_if(relid);
}

/// Queues the invalidation of every backend's cache (from the trigger on `rate_limit.policies`).
pub fn invalidate(table: pg_sys::Oid) {
    // SAFETY: a plain call into the invalidation machinery inside a transaction (trigger context).
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(table) }
}

/// Queues the invalidation of `rate_limit.key_overrides` alone in every backend (from its statement
/// trigger): each forgets which policies have overrides ([`overrides::any`]) and rebuilds that one
/// relation's cache entry, whatever the number of overrides. Once per transaction (see
/// [`overrides::changed`]).
pub fn invalidate_overrides() {
    if overrides::changed() {
        let table = overrides::table_oid();
        if table != pg_sys::InvalidOid {
            invalidate(table);
        }
    }
}

/// 42704 for an unknown policy name.
pub fn unknown(function: &'static str, name: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        format!(
            "rate limit policy {} does not exist",
            crate::error::quoted(name)
        ),
        function,
    )
    .set_hint(
        "Create it with rate_limit.create_policy(name, rate, per), or see rate_limit.policies.",
    )
}

/// The policy called `name`, from the cache or `rate_limit.policies` (see the module comment).
pub fn get(function: &'static str, name: &str) -> Result<Rc<Named>, ErrorReport> {
    if let Some(found) = CACHE.with(|c| c.borrow().policies.get(name).cloned()) {
        if found.blocking.may_be_blocked() || !changed_since_cached() {
            return Ok(found);
        }
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

/// Whether a change of `rate_limit.policies` committed since the cache was filled (which empties it), such
/// as the first block by hand of a policy's key: a policy's calls read no block while its cached row says
/// none can exist, and a block must apply to the next call of every backend, as it did when every call
/// read it (in a fresh snapshot). A cheap check: PostgreSQL's shared invalidation queue is read without
/// a lock when it holds nothing for this backend.
fn changed_since_cached() -> bool {
    let generation = GENERATION.with(Cell::get);
    // SAFETY: accepting invalidation messages is allowed anywhere inside a transaction; it may run the
    // relcache callback above, which only touches this module's thread-locals (no borrow is held here).
    unsafe { pg_sys::AcceptInvalidationMessages() };
    GENERATION.with(Cell::get) != generation
}

/// [`load`] under the latest snapshot, which sees every change committed before it was taken.
fn load_latest(
    function: &'static str,
    name: &str,
) -> Result<Option<(Named, pg_sys::Oid)>, ErrorReport> {
    with_latest_snapshot(|| load(function, name))
}

/// Runs `read` (read-only statements) with the latest snapshot as the active one: it sees every change
/// committed before it was taken, whatever the caller's isolation level.
pub fn with_latest_snapshot<T>(read: impl FnOnce() -> T) -> T {
    // SAFETY: inside a transaction (an SQL function call), taking the latest snapshot and pushing it as the
    // active one is what PostgreSQL's own code does around catalog-like reads; it is popped on return, and
    // on error the transaction's abort pops every snapshot pushed since.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetLatestSnapshot()) };
    let result = read();
    // SAFETY: pops the snapshot pushed above (a read-only SPI call pushes and pops its own).
    unsafe { pg_sys::PopActiveSnapshot() };
    result
}

/// Reads one policy from the table, with the active snapshot, and checks it as a caller's would be.
pub fn load(
    function: &'static str,
    name: &str,
) -> Result<Option<(Named, pg_sys::Oid)>, ErrorReport> {
    let Some((row, table)) = Row::read(function, name, Lock::None)? else {
        return Ok(None);
    };
    let (named, _) = checked(function, row)?;
    Ok(Some((named, table)))
}

/// Checks every parameter of `row` (22023 for one that does not make a policy) and returns the policy it
/// makes, with the row as it is stored: the numbers the policy keeps (a window's burst is its rate), a
/// calendar's canonical zone name, no zone or anchor without a calendar.
pub fn checked(function: &'static str, row: Row) -> Result<(Named, Row), ErrorReport> {
    let anchor_at = row
        .anchor
        .map(|a| calendar::anchor_us(function, a))
        .transpose()?;
    let policy = build(
        function,
        row.algorithm,
        row.rate,
        row.per,
        Some(row.burst),
        row.time_zone.as_deref(),
        anchor_at,
    )?;
    policy
        .check_max_debt(row.max_debt)
        .map_err(|e| debt_error(function, e))?;
    let blocking = blocking(
        function,
        &policy,
        row.block_after,
        row.block_for,
        row.blocks_by_hand,
    )?;
    let adaptive = adaptive(function, &policy, row.adaptive_min, row.latency_target)?;
    let (time_zone, anchor) = match policy.calendar_of() {
        Some(c) => (Some(c.zone_name().to_string()), row.anchor),
        None => (None, None),
    };
    let row = Row {
        rate: policy.rate(),
        burst: policy.burst(),
        time_zone,
        anchor,
        ..row
    };
    let named = Named {
        name: row.name.clone(),
        policy,
        store: row.store,
        created_at: row.created_at.into_inner(),
        changed_at: row.changed_at.into_inner(),
        shadow: row.shadow,
        max_debt: row.max_debt,
        blocking,
        adaptive,
        row: row.clone(),
    };
    Ok((named, row))
}
