//! Per-key overrides of a policy, kept as data in `rate_limit.key_overrides` (listed by the view
//! `rate_limit.overrides`): one key of a policy gets its own rate, period or burst, or is denied or
//! exempted, until a time or for ever.
//!
//! Read per key, where a key is used: a call of a key of a policy that has overrides reads that key's row
//! by the table's primary key ([`of_key`]; a batch reads its keys' rows in one statement, [`of_keys`]),
//! with the call's own snapshot: an override committed before the call's statement began (in REPEATABLE
//! READ and SERIALIZABLE, before its transaction began) is used, in every backend. Nothing per key is
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

use pgrx::datum::Interval;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

use super::{build, Named};

pub mod filter;
mod read;
use crate::error;
use crate::name_map::{self, NameMap};
use rate_limit_model::algorithm::{Algorithm, Policy};
use rate_limit_model::target::Verdict;

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

thread_local! {
    /// Whether each policy this backend called has overrides, by name: (its `created_at`, the answer),
    /// valid until an invalidation of `rate_limit.key_overrides` (see [`on_relcache`]).
    static HAS_ANY: RefCell<NameMap<String, (i64, bool)>> = const { RefCell::new(name_map::new()) };
    /// Counts the invalidations that emptied [`HAS_ANY`]: an answer read while it moved is not kept.
    static GENERATION: Cell<u64> = const { Cell::new(0) };
    /// Whether this transaction has queued the invalidation of the table for the other backends.
    static INVALIDATION_QUEUED: Cell<bool> = const { Cell::new(false) };
}

/// A statement of this transaction changed the overrides: this backend forgets at once which policies have
/// any (its next call, in this transaction, reads them again). True the first time in the transaction:
/// the caller then queues the table's invalidation for the other backends, which one message per
/// transaction tells (a statement setting 100 000 overrides, one call each, queues one; before, each
/// call made this backend rebuild the table's relation cache and replan the statement, for every call).
pub fn changed() -> bool {
    forget_policies();
    !INVALIDATION_QUEUED.with(|q| q.replace(true))
}

/// At the end of a transaction, or the abort of a subtransaction (whose queued invalidations are
/// discarded): the next change queues the invalidation again.
pub fn on_transaction_end() {
    INVALIDATION_QUEUED.with(|q| q.set(false));
}

/// Forgets which policies have overrides (a lookup under way on this stack, which holds the map, does not
/// keep what it reads: the generation moved).
fn forget_policies() {
    HAS_ANY.with(|h| {
        if let Ok(mut h) = h.try_borrow_mut() {
            h.clear();
        }
    });
    GENERATION.with(|g| g.set(g.get().wrapping_add(1)));
}

/// Called for every relation-cache invalidation (by the policy cache's callback): one of
/// `rate_limit.key_overrides` (or of every relation, or any while the table's oid is unknown) forgets
/// which policies have overrides, and where the table is.
pub fn on_relcache(relid: pg_sys::Oid) {
    if read::forget_table_if(relid) {
        if let Ok(mut has) =
            HAS_ANY.with(|h| h.try_borrow_mut().map(|mut h| std::mem::take(&mut *h)))
        {
            has.clear();
        }
        GENERATION.with(|g| g.set(g.get().wrapping_add(1)));
    }
}

/// The oid of `rate_limit.key_overrides` (under Citus, the table every node has, whose shard holds the
/// rows); `InvalidOid` if there is none.
pub fn table_oid() -> pg_sys::Oid {
    read::table_oid()
}

/// Whether policy `named` has any override (one set since it was created): from this backend's memory,
/// else one probe of the table with the latest snapshot.
pub fn any(function: &'static str, named: &Named) -> Result<bool, ErrorReport> {
    let known = HAS_ANY.with(|h| {
        h.borrow()
            .get(named.name.as_str())
            .and_then(|&(created_at, has)| (created_at == named.created_at).then_some(has))
    });
    if let Some(known) = known {
        return Ok(known);
    }
    // SAFETY: accepting invalidation messages is allowed anywhere inside a transaction; it may run the
    // relcache callbacks, which only touch thread-locals (no borrow is held here).
    unsafe { pg_sys::AcceptInvalidationMessages() };
    let generation = GENERATION.with(Cell::get);
    let found = read::any(function, &named.name, named.created_at)?;
    if GENERATION.with(Cell::get) == generation {
        HAS_ANY.with(|h| {
            h.borrow_mut()
                .insert(named.name.clone(), (named.created_at, found))
        });
    }
    Ok(found)
}

/// The override of `key` under policy `named`, if it has one: nothing read when the shared filter says
/// the key has none ([`filter`]), else one primary-key read with the call's snapshot (call it only when
/// [`any`] says the policy has overrides).
pub fn of_key(
    function: &'static str,
    named: &Named,
    key: &str,
) -> Result<Option<Override>, ErrorReport> {
    if filter::may_have(function, &named.name, key)? == Some(false) {
        return Ok(None);
    }
    read::of_key(function, &named.name, named.created_at, key)?
        .map(|s| resolve_read(function, named, s))
        .transpose()
}

/// The overrides of those of `keys` that have one under policy `named`, by key: one statement.
pub fn of_keys(
    function: &'static str,
    named: &Named,
    keys: &[&str],
) -> Result<HashMap<String, Override>, ErrorReport> {
    read::of_keys(function, &named.name, named.created_at, keys)?
        .into_iter()
        .map(|s| Ok((s.key.clone(), resolve_read(function, named, s)?)))
        .collect()
}

/// [`resolve`] for an override read where its key is used. A window's (and a concurrency policy's) burst is
/// its rate, so a burst stored with the override is not read for such a policy: it was set equal to the rate
/// then (`set_override` refuses another), and the policy's rate or algorithm may have changed since; read,
/// it would make every call of the key fail with 22023.
fn resolve_read(
    function: &'static str,
    named: &Named,
    mut stored: Stored,
) -> Result<Override, ErrorReport> {
    if named.policy.algorithm() != Algorithm::TokenBucket {
        stored.burst = None;
    }
    resolve(function, named, &stored)
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
