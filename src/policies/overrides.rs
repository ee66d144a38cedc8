//! Per-key overrides of a policy, kept as data in `rate_limit.key_overrides` (listed by the view
//! `rate_limit.overrides`): one key of a policy gets its own rate, period or burst, or is denied or
//! exempted, until a time or for ever.
//!
//! Read per key, where a key is used: a call of a key of a policy that has overrides reads that key's row
//! by the table's primary key ([`of_key`]; a batch reads its keys' rows in one statement, [`of_keys`]),
//! with the latest snapshot, as the policy cache reads a policy: an override committed before a call's
//! snapshot is taken is used by it, in every backend, whatever its isolation level. Nothing per key is
//! kept in a backend: its memory does not grow with the overrides, and a change costs the other backends
//! nothing for the keys they do not call. What a backend keeps is whether each policy it calls has any
//! overrides at all ([`any`]), so that a call of a policy without them reads nothing more; a change of
//! `rate_limit.key_overrides` invalidates that answer in every backend, by a relation-cache invalidation
//! of the table alone (sent by its statement trigger, `rate_limit.policies_changed`): each backend then
//! asks again, once per policy it calls (one primary-key probe), and replans its one lookup statement.
//!
//! Numbers. An override's missing rate, period or burst are the policy's; a window's burst is its rate. Its
//! numbers take effect when it was set (`set_at`) and the policy's again when it ends (`expires_at`): a
//! bucket carries its tokens over at that instant, as a policy change does, never gaining any. An
//! override set before its policy was created (left by a DELETE or TRUNCATE of `rate_limit.policies`, a
//! dropped namesake's) is never read.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiClient, SpiError, SpiHeapTupleData};
use pgrx::PgSqlErrorCode;

use super::{build, with_latest_snapshot, Named};
use crate::algorithm::{Algorithm, Policy};
use crate::error;
use crate::target::Verdict;

/// What an override gives its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Its own numbers, in effect from `changed_at` (µs).
    Limit {
        /// The numbers.
        policy: Policy,
        /// When they took effect: the later of the override's `set_at` and the policy's `changed_at`.
        changed_at: i64,
    },
    /// A fixed answer: denied or exempt.
    Fixed(Verdict),
}

/// One key's override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Override {
    /// What the key gets.
    pub effect: Effect,
    /// When the override ends (µs on the wall clock); `None`: it does not.
    pub expires_at: Option<i64>,
}

/// The overrides' actions, as the table's `action` column names them.
pub const ACTIONS: [&str; 3] = ["limit", "deny", "exempt"];

/// One row of `rate_limit.key_overrides`, as stored.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The key.
    pub key: String,
    /// `limit`, `deny` or `exempt`.
    pub action: String,
    /// Its rate, period and burst, where it has them (a `limit` only).
    pub rate: Option<i64>,
    /// Its period.
    pub per: Option<Interval>,
    /// Its burst.
    pub burst: Option<i64>,
    /// When it ends (µs).
    pub expires_at: Option<i64>,
    /// When it was set (µs).
    pub set_at: i64,
}

/// The override `stored` makes of policy `named`; 22023 when its numbers do not make a policy of the
/// policy's algorithm.
pub fn resolve(
    function: &'static str,
    named: &Named,
    stored: &Stored,
) -> Result<Override, ErrorReport> {
    let row = &named.row;
    let expires_at = stored.expires_at;
    let effect = match stored.action.as_str() {
        "deny" => Effect::Fixed(Verdict::Deny { until: expires_at }),
        "exempt" => Effect::Fixed(Verdict::Exempt),
        _ => {
            let windowed = named.policy.algorithm() != Algorithm::TokenBucket;
            let burst = match (stored.burst, windowed) {
                (Some(b), _) => Some(b),
                (None, true) => None,
                (None, false) => Some(row.burst),
            };
            let anchor_at = row
                .anchor
                .map(|a| crate::time::calendar::anchor_us(function, a))
                .transpose()?;
            let policy = build(
                function,
                row.algorithm,
                stored.rate.unwrap_or(row.rate),
                stored.per.unwrap_or(row.per),
                burst,
                row.time_zone.as_deref(),
                anchor_at,
            )?;
            Effect::Limit {
                policy,
                changed_at: stored.set_at.max(named.changed_at),
            }
        }
    };
    Ok(Override { effect, expires_at })
}

/// One key's override, by the primary key: `$1` policy, `$2` key, `$3` the policy's `created_at`.
const OF_KEY: &str = "SELECT key, action, rate, per, burst, expires_at, set_at \
     FROM rate_limit.key_overrides \
     WHERE policy OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
       AND set_at OPERATOR(pg_catalog.>=) $3";

/// Whether a policy has any override: `$1` policy, `$2` its `created_at`.
const ANY: &str = "SELECT true FROM rate_limit.key_overrides \
     WHERE policy OPERATOR(pg_catalog.=) $1 AND set_at OPERATOR(pg_catalog.>=) $2 LIMIT 1";

/// The overrides of many keys of one policy: `$1` policy, `$2` the keys, `$3` its `created_at`.
const OF_KEYS: &str = "SELECT key, action, rate, per, burst, expires_at, set_at \
     FROM rate_limit.key_overrides \
     WHERE policy OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) ANY ($2) \
       AND set_at OPERATOR(pg_catalog.>=) $3";

thread_local! {
    /// [`OF_KEY`], prepared on first use and kept for the life of the backend (PostgreSQL's plan cache
    /// replans it when the table changes or is recreated).
    static OF_KEY_PLAN: Cell<Option<&'static OwnedPreparedStatement>> = const { Cell::new(None) };
    /// Whether each policy this backend called has overrides, by (name, created_at): valid until an
    /// invalidation of `rate_limit.key_overrides` (see [`on_relcache`]).
    static HAS_ANY: RefCell<HashMap<(String, i64), bool>> = RefCell::new(HashMap::new());
    /// The oid of `rate_limit.key_overrides` when [`HAS_ANY`] was filled (`InvalidOid`: not known yet, so
    /// every relation-cache invalidation empties it).
    static TABLE: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    /// Counts the invalidations that emptied [`HAS_ANY`]: an answer read while it moved is not kept.
    static GENERATION: Cell<u64> = const { Cell::new(0) };
}

/// Called for every relation-cache invalidation (by the policy cache's callback): one of
/// `rate_limit.key_overrides` (or of every relation, or any while the table's oid is unknown) forgets
/// which policies have overrides.
pub fn on_relcache(relid: pg_sys::Oid) {
    let table = TABLE.with(Cell::get);
    if relid == pg_sys::InvalidOid || table == pg_sys::InvalidOid || relid == table {
        if let Ok(mut has) =
            HAS_ANY.with(|h| h.try_borrow_mut().map(|mut h| std::mem::take(&mut *h)))
        {
            has.clear();
        }
        TABLE.with(|t| t.set(pg_sys::InvalidOid));
        GENERATION.with(|g| g.set(g.get().wrapping_add(1)));
    }
}

/// The oid of `rate_limit.key_overrides` (under Citus, the table every node has, whose shard holds the
/// rows); `InvalidOid` if there is none.
pub fn table_oid() -> pg_sys::Oid {
    // SAFETY: catalog lookups by name inside a transaction; both return InvalidOid when nothing is found
    // (missing_ok), and the names are NUL-terminated literals.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"rate_limit".as_ptr(), true);
        if schema == pg_sys::InvalidOid {
            return pg_sys::InvalidOid;
        }
        pg_sys::get_relname_relid(c"key_overrides".as_ptr(), schema)
    }
}

/// Whether policy `named` has any override (one set since it was created): from this backend's memory,
/// else one probe of the table with the latest snapshot.
pub fn any(function: &'static str, named: &Named) -> Result<bool, ErrorReport> {
    let id = (named.name.clone(), named.created_at);
    if let Some(known) = HAS_ANY.with(|h| h.borrow().get(&id).copied()) {
        return Ok(known);
    }
    // SAFETY: accepting invalidation messages is allowed anywhere inside a transaction; it may run the
    // relcache callbacks, which only touch thread-locals (no borrow is held here).
    unsafe { pg_sys::AcceptInvalidationMessages() };
    let generation = GENERATION.with(Cell::get);
    let created_at = timestamptz(function, named.created_at)?;
    let args: [DatumWithOid<'_>; 2] = [named.name.as_str().into(), created_at.into()];
    let found = with_latest_snapshot(|| {
        as_table_owner(function, || {
            Spi::connect(|client| Ok(!client.select(ANY, Some(1), &args)?.is_empty()))
                .map_err(|e: SpiError| error::internal(function, e))
        })
    })?;
    if GENERATION.with(Cell::get) == generation {
        TABLE.with(|t| t.set(table_oid()));
        HAS_ANY.with(|h| h.borrow_mut().insert(id, found));
    }
    Ok(found)
}

/// The override of `key` under policy `named`, if it has one: one primary-key read with the latest
/// snapshot (call it only when [`any`] says the policy has overrides).
pub fn of_key(
    function: &'static str,
    named: &Named,
    key: &str,
) -> Result<Option<Override>, ErrorReport> {
    let created_at = timestamptz(function, named.created_at)?;
    let args: [DatumWithOid<'_>; 3] = [named.name.as_str().into(), key.into(), created_at.into()];
    let stored = with_latest_snapshot(|| {
        as_table_owner(function, || {
            Spi::connect(|client| {
                let plan = of_key_plan(client)?;
                let mut rows = client.select(plan, Some(1), &args)?;
                rows.next().map(|row| stored(&row)).transpose()
            })
            .map_err(|e: SpiError| error::internal(function, e))
        })
    })?;
    stored.map(|s| resolve(function, named, &s)).transpose()
}

/// The overrides of those of `keys` that have one under policy `named`, by key: one statement.
pub fn of_keys(
    function: &'static str,
    named: &Named,
    keys: &[&str],
) -> Result<HashMap<String, Override>, ErrorReport> {
    let created_at = timestamptz(function, named.created_at)?;
    let keys: Vec<&str> = keys.to_vec();
    let args: [DatumWithOid<'_>; 3] = [named.name.as_str().into(), keys.into(), created_at.into()];
    let rows = with_latest_snapshot(|| {
        as_table_owner(function, || {
            Spi::connect(|client| {
                client
                    .select(OF_KEYS, None, &args)?
                    .map(|row| stored(&row))
                    .collect::<Result<Vec<Stored>, SpiError>>()
            })
            .map_err(|e: SpiError| error::internal(function, e))
        })
    })?;
    rows.into_iter()
        .map(|s| Ok((s.key.clone(), resolve(function, named, &s)?)))
        .collect()
}

/// [`OF_KEY`]'s kept plan.
fn of_key_plan(client: &SpiClient<'_>) -> Result<&'static OwnedPreparedStatement, SpiError> {
    if let Some(plan) = OF_KEY_PLAN.with(Cell::get) {
        return Ok(plan);
    }
    let text = pgrx::pg_sys::PgOid::from(pg_sys::TEXTOID);
    let tstz = pgrx::pg_sys::PgOid::from(pg_sys::TIMESTAMPTZOID);
    // Leaked on purpose: one small plan per backend, alive as long as the backend.
    let plan: &'static OwnedPreparedStatement = Box::leak(Box::new(
        client.prepare(OF_KEY, &[text, text, tstz])?.keep(),
    ));
    OF_KEY_PLAN.with(|p| p.set(Some(plan)));
    Ok(plan)
}

/// The row `row` is on, as stored (the columns of [`OF_KEY`], in [`Stored`]'s order).
fn stored(row: &SpiHeapTupleData<'_>) -> Result<Stored, SpiError> {
    Ok(Stored {
        key: row.get(1)?.unwrap_or_default(),
        action: row.get(2)?.unwrap_or_default(),
        rate: row.get(3)?,
        per: row.get(4)?,
        burst: row.get(5)?,
        expires_at: row
            .get::<TimestampWithTimeZone>(6)?
            .map(TimestampWithTimeZone::into_inner),
        // NOT NULL in the table
        set_at: row
            .get::<TimestampWithTimeZone>(7)?
            .map_or(i64::MIN, TimestampWithTimeZone::into_inner),
    })
}

/// Microseconds as a `timestamptz` argument.
fn timestamptz(function: &'static str, us: i64) -> Result<TimestampWithTimeZone, ErrorReport> {
    TimestampWithTimeZone::try_from(us)
        .map_err(|_| error::bug(function, "a policy's created_at is out of range"))
}

/// Runs `read` as the owner of `rate_limit.key_overrides` (the extension's owner), as PostgreSQL's
/// referential-integrity triggers run their queries as the table's owner: the calls that read overrides
/// are SECURITY DEFINER and run as the owner already (nothing to switch, the common case); any other
/// caller reads them as the owner too, never with its own rights, so what a call decides does not depend
/// on who calls it.
fn as_table_owner<T>(
    function: &'static str,
    read: impl FnOnce() -> Result<T, ErrorReport>,
) -> Result<T, ErrorReport> {
    let owner = table_owner();
    let (mut user, mut context) = (pg_sys::InvalidOid, 0);
    // SAFETY: reads the current user id and security context, as ri_triggers.c does.
    unsafe { pg_sys::GetUserIdAndSecContext(&mut user, &mut context) };
    if owner == user {
        return read();
    }
    if owner == pg_sys::InvalidOid {
        return Err(error::bug(
            function,
            "rate_limit.key_overrides has no owner",
        ));
    }
    // SAFETY: setting the current user id and security context is what PostgreSQL's own ri_triggers.c
    // does around its queries; an error inside `read` aborts the (sub)transaction, which restores both
    // (AbortTransaction / AbortSubTransaction), and on return they are restored here.
    unsafe {
        pg_sys::SetUserIdAndSecContext(
            owner,
            context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
        );
    }
    let result = read();
    // SAFETY: restores what was read above.
    unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
    result
}

/// The owner of `rate_limit.key_overrides` (`InvalidOid` if there is no such table), from the catalog
/// cache: no statement, so a hot standby reads it too.
fn table_owner() -> pg_sys::Oid {
    let relid = table_oid();
    if relid == pg_sys::InvalidOid {
        return pg_sys::InvalidOid;
    }
    // SAFETY: a catalog-cache lookup by oid inside a transaction; the tuple is released before return and
    // its relowner field read while it is held.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            pg_sys::Datum::from(relid),
        );
        if tuple.is_null() {
            return pg_sys::InvalidOid;
        }
        let owner = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_class>(tuple)).relowner;
        pg_sys::ReleaseSysCache(tuple);
        owner
    }
}

/// What applies to a key of `named` with override `o` at `now`: the override's effect while it lasts,
/// else the policy's numbers from the override's end on.
pub fn in_effect(named: &Named, o: &Override, now: i64) -> Effect {
    match o.expires_at {
        Some(end) if now >= end => Effect::Limit {
            policy: named.policy,
            changed_at: named.changed_at.max(end),
        },
        _ => o.effect,
    }
}

/// 22023 for an action that is not one of [`ACTIONS`].
pub fn unknown_action(function: &'static str, action: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("unknown override action {}", error::quoted(action)),
        function,
    )
    .set_hint("Use 'limit' (with rate, per or burst), 'deny' or 'exempt'.")
}
