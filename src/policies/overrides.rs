//! Per-key overrides of a policy, kept as data in `rate_limit.key_overrides` (listed by the view
//! `rate_limit.overrides`): one key of a policy gets its own rate, period or burst, or is denied or
//! exempted, until a time or for ever.
//!
//! Read with the policy: the policy cache ([`super::get`]) loads a policy's overrides when it loads its row,
//! under the same latest snapshot, into a map kept with the cached policy. A policy with none keeps no map,
//! so its calls read nothing more; a key of a policy with some costs one lookup in that map. The table has
//! the policies' statement trigger, which invalidates every backend's policy cache: a change is seen as a
//! policy change is (the next transaction of every backend), and the policy's map is read again then.
//!
//! Numbers. An override's missing rate, period or burst are the policy's; a window's burst is its rate. Its
//! numbers take effect when it was set (`set_at`) and the policy's again when it ends (`expires_at`): a
//! bucket carries its tokens over at that instant, as a policy change does, never gaining any.

use std::collections::HashMap;
use std::rc::Rc;

use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::Spi;
use pgrx::PgSqlErrorCode;

use super::{build, Named, Row};
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

/// A policy's overrides by key.
pub type Overrides = HashMap<Box<str>, Override>;

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

/// The override `stored` makes of policy `named` (whose row is `row`); 22023 when its numbers do not
/// make a policy of the policy's algorithm.
pub fn resolve(
    function: &'static str,
    row: &Row,
    named: &Named,
    stored: &Stored,
) -> Result<Override, ErrorReport> {
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

/// Reads the overrides of policy `named` (row `row`) with the active snapshot: `None` when it has none.
pub fn load(
    function: &'static str,
    row: &Row,
    named: &Named,
) -> Result<Option<Rc<Overrides>>, ErrorReport> {
    // (an override set before the policy was created is a dropped namesake's: never read)
    let query =
        "SELECT key, action, rate, per, burst, expires_at, set_at FROM rate_limit.key_overrides \
                 WHERE policy OPERATOR(pg_catalog.=) $1 AND set_at OPERATOR(pg_catalog.>=) $2";
    let created_at = TimestampWithTimeZone::try_from(named.created_at)
        .map_err(|_| error::bug(function, "a policy's created_at is out of range"))?;
    let args: [DatumWithOid<'_>; 2] = [named.name.as_str().into(), created_at.into()];
    let rows = as_table_owner(function, || {
        Spi::connect(|client| {
            client
                .select(query, None, &args)?
                .map(|r| {
                    Ok(Stored {
                        key: r.get(1)?.unwrap_or_default(),
                        action: r.get(2)?.unwrap_or_default(),
                        rate: r.get(3)?,
                        per: r.get(4)?,
                        burst: r.get(5)?,
                        expires_at: r
                            .get::<TimestampWithTimeZone>(6)?
                            .map(TimestampWithTimeZone::into_inner),
                        // NOT NULL in the table
                        set_at: r
                            .get::<TimestampWithTimeZone>(7)?
                            .map_or(i64::MIN, TimestampWithTimeZone::into_inner),
                    })
                })
                .collect::<Result<Vec<Stored>, pgrx::spi::SpiError>>()
        })
        .map_err(|e| error::internal(function, e))
    })?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut map = Overrides::with_capacity(rows.len());
    for stored in &rows {
        map.insert(
            stored.key.as_str().into(),
            resolve(function, row, named, stored)?,
        );
    }
    Ok(Some(Rc::new(map)))
}

/// Runs `read` as the owner of `rate_limit.key_overrides` (the extension's owner), as PostgreSQL's
/// referential-integrity triggers run their queries as the table's owner: a policy is read into the cache
/// by whatever call needs it first, and a call that is not SECURITY DEFINER (`headers`) runs as a role that
/// may not read the overrides (they name customers' keys; the policies are readable by every role). What
/// is read is the same whoever calls, so the cache is.
fn as_table_owner<T>(
    function: &'static str,
    read: impl FnOnce() -> Result<T, ErrorReport>,
) -> Result<T, ErrorReport> {
    // a read-only statement: a hot standby reads its policies too (Spi::get_one would run it read-write,
    // which assigns a transaction id, refused during recovery)
    let owner = Spi::connect(|client| {
        client
            .select(
                "SELECT c.relowner FROM pg_catalog.pg_class AS c \
                 WHERE c.oid OPERATOR(pg_catalog.=) 'rate_limit.key_overrides'::pg_catalog.regclass",
                Some(1),
                &[],
            )?
            .first()
            .get_one::<pg_sys::Oid>()
    })
    .map_err(|e| error::internal(function, e))?
    .ok_or_else(|| error::bug(function, "rate_limit.key_overrides has no owner"))?;
    let (mut user, mut context) = (pg_sys::InvalidOid, 0);
    // SAFETY: reading and setting the current user id and security context is what PostgreSQL's own
    // ri_triggers.c does around its queries; an error inside `read` aborts the (sub)transaction, which
    // restores both (AbortTransaction / AbortSubTransaction), and on return they are restored here.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
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
        format!("unknown override action \"{action}\""),
        function,
    )
    .set_hint("Use 'limit' (with rate, per or burst), 'deny' or 'exempt'.")
}
