//! Per-key overrides (owner only): `set_override` gives one key of a policy its own rate, period or burst,
//! or denies or exempts it, until a time or for ever; `clear_override` removes it. Kept in
//! `rate_limit.key_overrides` (listed by the view `rate_limit.overrides`); what a call does with them:
//! [`crate::policies::overrides`].

use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self, PgOid};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiClient};
use std::cell::Cell;

use super::{key_arg, policy_arg};
use crate::error;
use crate::kept_plans;
use crate::policies;
use crate::policies::overrides::{self, Effect, Stored, ACTIONS};
use crate::time::clock;

/// Checks an override's arguments against its policy (22023, with what to pass instead) and returns the
/// override they make.
fn checked(
    function: &'static str,
    named: &policies::Named,
    stored: &Stored,
) -> Result<(), ErrorReport> {
    if !ACTIONS.contains(&stored.action.as_str()) {
        return Err(overrides::unknown_action(function, &stored.action));
    }
    let numbers = stored.rate.is_some() || stored.per.is_some() || stored.burst.is_some();
    match (stored.action.as_str(), numbers) {
        ("limit", false) => {
            return Err(error::invalid_value(
                function,
                "an override of action 'limit' needs a rate, a period or a burst".to_string(),
                "Pass rate, per or burst (those left out are the policy's), or action => 'deny' or 'exempt'.",
            ))
        }
        ("deny" | "exempt", true) => {
            return Err(error::invalid_value(
                function,
                format!("an override of action '{}' takes no rate, period or burst", stored.action),
                "Leave rate, per and burst out, or use action => 'limit'.",
            ))
        }
        _ => {}
    }
    if let Some(until) = stored.expires_at {
        if until <= clock::now_us() {
            return Err(error::invalid_value(
                function,
                "until is not in the future".to_string(),
                "Pass a time to come, or NULL for an override without end; clear_override removes one.",
            ));
        }
    }
    let o = overrides::resolve(function, named, stored)?;
    if let Effect::Limit { policy, .. } = o.effect {
        crate::bounds::policy(function, &policy, named.max_debt, &named.blocking)?;
    }
    Ok(())
}

/// Writes one override, replacing the key's earlier one.
const UPSERT: &str = "INSERT INTO rate_limit.key_overrides \
       (policy, key, action, rate, per, burst, expires_at, set_at, note) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
     ON CONFLICT (policy, key) DO UPDATE SET action = EXCLUDED.action, \
       rate = EXCLUDED.rate, per = EXCLUDED.per, burst = EXCLUDED.burst, \
       expires_at = EXCLUDED.expires_at, set_at = EXCLUDED.set_at, note = EXCLUDED.note";

/// [`UPSERT`]'s parameter types.
const SET_TYPES: [pg_sys::Oid; 9] = [
    pg_sys::TEXTOID,
    pg_sys::TEXTOID,
    pg_sys::TEXTOID,
    pg_sys::INT8OID,
    pg_sys::INTERVALOID,
    pg_sys::INT8OID,
    pg_sys::TIMESTAMPTZOID,
    pg_sys::TIMESTAMPTZOID,
    pg_sys::TEXTOID,
];

/// Deletes one override.
const DELETE: &str = "DELETE FROM rate_limit.key_overrides \
     WHERE policy OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 RETURNING 1";

/// [`DELETE`]'s parameter types.
const CLEAR_TYPES: [pg_sys::Oid; 2] = [pg_sys::TEXTOID, pg_sys::TEXTOID];

thread_local! {
    /// [`UPSERT`] and [`DELETE`], prepared on first use and kept for the life of the backend: a statement
    /// that sets or clears many overrides plans each once, so that it costs the same per override whether
    /// it sets ten or a million.
    static SET: Cell<Option<&'static OwnedPreparedStatement>> = const { Cell::new(None) };
    static CLEAR: Cell<Option<&'static OwnedPreparedStatement>> = const { Cell::new(None) };
}

/// The kept plan of `query` in `cell`, prepared on first use.
fn kept(
    client: &SpiClient<'_>,
    cell: &'static std::thread::LocalKey<Cell<Option<&'static OwnedPreparedStatement>>>,
    query: &str,
    types: &[pg_sys::Oid],
) -> Result<&'static OwnedPreparedStatement, pgrx::spi::SpiError> {
    if let Some(plan) = cell.with(Cell::get) {
        return Ok(plan);
    }
    let types: Vec<PgOid> = types.iter().map(|&t| PgOid::from(t)).collect();
    // Leaked on purpose: two small plans per backend, alive as long as the backend.
    let plan: &'static OwnedPreparedStatement =
        Box::leak(Box::new(client.prepare_mut(query, &types)?.keep()));
    cell.with(|c| c.set(Some(plan)));
    Ok(plan)
}

/// Per-key override SQL functions, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Gives `key` of `policy` its own numbers (`action => 'limit'`: `rate`, `per` and `burst`, each
    /// defaulting to the policy's), or denies it (`'deny'`) or exempts it (`'exempt'`), until `until` or
    /// for ever; replaces the key's earlier override. Seen by the next transaction of every backend. A
    /// key's bucket carries its tokens over to new numbers, never gaining any. Owner only.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[allow(clippy::too_many_arguments)] // SQL's named arguments, each with its default
    fn set_override(
        policy: Option<&str>,
        key: Option<&str>,
        rate: default!(Option<i64>, "NULL"),
        per: default!(Option<Interval>, "NULL"),
        burst: default!(Option<i64>, "NULL"),
        action: default!(Option<&str>, "'limit'"),
        until: default!(Option<TimestampWithTimeZone>, "NULL"),
        note: default!(Option<&str>, "NULL"),
    ) -> Result<(), ErrorReport> {
        const F: &str = "rate_limit.set_override";
        let named = policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let action = action.unwrap_or("limit");
        let stored = Stored {
            key: key.to_string(),
            action: action.to_string(),
            rate,
            per,
            burst,
            expires_at: until.map(TimestampWithTimeZone::into_inner),
            set_at: clock::table_now_us(),
        };
        checked(F, &named, &stored)?;
        if note.is_some_and(|n| n.chars().count() > 1000) {
            return Err(error::invalid_value(
                F,
                "note is longer than 1000 characters".to_string(),
                "Keep the note short; link to a ticket for more.",
            ));
        }
        let set_at = TimestampWithTimeZone::try_from(stored.set_at)
            .map_err(|_| error::bug(F, "the clock is out of timestamptz's range"))?;
        let args: [DatumWithOid<'_>; 9] = [
            named.name.as_str().into(),
            key.into(),
            action.into(),
            rate.into(),
            per.into(),
            burst.into(),
            until.into(),
            set_at.into(),
            note.into(),
        ];
        kept_plans::by_key(|| {
            Spi::connect_mut(|client| {
                let plan = kept(client, &SET, UPSERT, &SET_TYPES)?;
                client.update(plan, None, &args)?;
                Ok::<_, pgrx::spi::SpiError>(())
            })
        })
        .map_err(|e| error::internal(F, e))
    }

    /// Removes the override of `key` under `policy`: the key follows the policy again (its bucket carries
    /// its tokens over). True if there was one. Owner only.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn clear_override(policy: Option<&str>, key: Option<&str>) -> Result<bool, ErrorReport> {
        const F: &str = "rate_limit.clear_override";
        let policy =
            policy.ok_or_else(|| error::null_argument(F, "policy", "Pass the policy's name."))?;
        let key = key_arg(F, "key", key)?;
        let args: [DatumWithOid<'_>; 2] = [policy.into(), key.into()];
        let deleted = kept_plans::by_key(|| {
            Spi::connect_mut(|client| {
                let plan = kept(client, &CLEAR, DELETE, &CLEAR_TYPES)?;
                let t = client.update(plan, None, &args)?;
                Ok::<_, pgrx::spi::SpiError>(t.len())
            })
        })
        .map_err(|e| error::internal(F, e))?;
        Ok(deleted > 0)
    }
}
