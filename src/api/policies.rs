//! SQL functions that manage named policies (owner only), and the trigger that keeps every backend's policy
//! cache coherent. Every statement names its objects and operators with their schema.

use pgrx::datum::{DatumWithOid, Interval, Timestamp, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::spi::Spi;

use super::json_arg::JsonbText;
use crate::error;
use crate::policies::{self, check_name, options, parse_algorithm, parse_store, Lock, Row};
use rate_limit_model::algorithm::{Algorithm, Policy};

fn required<T>(
    function: &'static str,
    argument: &str,
    value: Option<T>,
    hint: &str,
) -> Result<T, ErrorReport> {
    value.ok_or_else(|| error::null_argument(function, argument, hint))
}

/// Validates the numbers of a policy without a calendar; `burst` `None` means "the same as rate".
pub fn build_policy(
    function: &'static str,
    algorithm: Algorithm,
    rate: i64,
    per: Interval,
    burst: Option<i64>,
) -> Result<Policy, ErrorReport> {
    policies::build(function, algorithm, rate, per, burst, None, None)
}

fn spi_run(
    function: &'static str,
    query: &str,
    args: &[DatumWithOid<'_>],
) -> Result<usize, ErrorReport> {
    Spi::connect_mut(|client| client.update(query, None, args).map(|t| t.len()))
        .map_err(|e| error::internal(function, e))
}

/// Now on the table store's clock (see `time::clock_shift`), as a policy row's timestamps are written.
/// Read here and passed: Citus refuses a volatile function in an UPDATE of a distributed (here:
/// reference) table.
fn row_now(function: &'static str) -> Result<TimestampWithTimeZone, ErrorReport> {
    TimestampWithTimeZone::try_from(crate::time::clock::table_now_us())
        .map_err(|_| error::bug(function, "the clock is out of the timestamp range"))
}

/// The penalty box of a changed policy: `block_after => 0` removes it; otherwise each of its two settings
/// is kept unless given.
fn changed_penalty_box(
    old: &Row,
    block_after: Option<i64>,
    block_for: Option<Interval>,
) -> (Option<i64>, Option<Interval>) {
    match block_after {
        Some(0) => (None, None),
        given => (given.or(old.block_after), block_for.or(old.block_for)),
    }
}

/// The extension's tables a statement trigger of its own may fire on.
enum OwnTable {
    /// `rate_limit.policies` (or, under Citus, a shard of it).
    Policies,
    /// `rate_limit.key_overrides` (or a shard of it).
    Overrides,
}

/// Which of the extension's tables `relid` is: one in schema `rate_limit` (where only the owner creates
/// relations) named `policies` or `key_overrides`, or a Citus shard of one (`policies_102008`); `None` for
/// any other relation.
fn own_table(relid: pg_sys::Oid) -> Option<OwnTable> {
    // SAFETY: catalog lookups by oid and name inside the trigger's transaction; the names they return
    // (palloc'd, or NULL) are read at once.
    let name = unsafe {
        let schema = pg_sys::get_namespace_oid(c"rate_limit".as_ptr(), true);
        let name = pg_sys::get_rel_name(relid);
        if name.is_null()
            || schema == pg_sys::InvalidOid
            || pg_sys::get_rel_namespace(relid) != schema
        {
            return None;
        }
        std::ffi::CStr::from_ptr(name).to_bytes().to_vec()
    };
    let named = |table: &[u8]| {
        name == table
            || name.strip_prefix(table).is_some_and(|rest| {
                rest.first() == Some(&b'_')
                    && rest[1..].iter().all(u8::is_ascii_digit)
                    && rest.len() > 1
            })
    };
    if named(b"policies") {
        Some(OwnTable::Policies)
    } else if named(b"key_overrides") {
        Some(OwnTable::Overrides)
    } else {
        None
    }
}

/// Policy management, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Creates the policy `name`: `rate` tokens per `per`, at most `burst` (default: `rate`) at once. With
    /// `shadow`, it never denies (would-be denials are reported and counted); `max_debt` is how many
    /// tokens below zero `rate_limit.charge` may drive a bucket. A `calendar_window` policy's windows start
    /// at `anchor + k × per` (whole days or months) on `time_zone`'s clocks. The penalty box: `block_after`
    /// denials of a key within one window (`per`) block it for `block_for` (both, or neither). `options` (a
    /// JSON object) holds the options added since 0.4.0 by name ([`options::OPTIONS`]).
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[allow(clippy::too_many_arguments)] // SQL's named arguments, each with its default
    fn create_policy(
        name: Option<&str>,
        rate: Option<i64>,
        per: Option<Interval>,
        burst: default!(Option<i64>, "NULL"),
        algorithm: default!(Option<&str>, "'token_bucket'"),
        store: default!(Option<&str>, "NULL"),
        shadow: default!(Option<bool>, false),
        max_debt: default!(Option<i64>, 0),
        time_zone: default!(Option<&str>, "NULL"),
        anchor: default!(Option<Timestamp>, "NULL"),
        block_after: default!(Option<i64>, "NULL"),
        block_for: default!(Option<Interval>, "NULL"),
        options: default!(Option<JsonbText>, "NULL"),
    ) -> Result<(), ErrorReport> {
        const F: &str = "rate_limit.create_policy";
        let name = required(F, "name", name, "Pass the policy's name, e.g. 'api'.")?;
        check_name(F, name)?;
        let rate = required(
            F,
            "rate",
            rate,
            "Pass the tokens granted per period, e.g. 100.",
        )?;
        let per = required(F, "per", per, "Pass the period, e.g. interval '1 minute'.")?;
        let algorithm = required(
            F,
            "algorithm",
            algorithm,
            "Pass 'token_bucket', 'fixed_window', 'sliding_window', 'calendar_window' or 'concurrency', or omit it.",
        )?;
        let shadow = required(
            F,
            "shadow",
            shadow,
            "Pass true or false, or omit it (false).",
        )?;
        let max_debt = required(
            F,
            "max_debt",
            max_debt,
            "Pass 0 or more tokens, or omit it (0).",
        )?;
        let now = row_now(F)?;
        let mut row = Row {
            name: name.to_string(),
            algorithm: parse_algorithm(F, algorithm)?,
            rate,
            per,
            burst: burst.unwrap_or(rate),
            store: store.map(|s| parse_store(F, s)).transpose()?,
            created_at: now,
            changed_at: now,
            shadow,
            max_debt,
            time_zone: time_zone.map(str::to_string),
            anchor,
            block_after,
            block_for,
            blocks_by_hand: false,
            description: None,
            adaptive_min: None,
            latency_target: None,
            meters: None,
            parent: None,
        };
        let options = options.map(|o| options::parse(F, &o.0)).transpose()?;
        options::apply(F, &mut row, options.as_ref())?;
        let (named, row) = policies::checked(F, row)?;
        crate::bounds::policy(F, &named.policy, max_debt, &named.blocking)?;
        policies::family::check(F, &row)?;
        if !row.insert(F)? {
            return Err(policies::row::duplicate(F, name));
        }
        Ok(())
    }

    /// Changes policy `name`; NULL keeps a value. Existing buckets carry their tokens over (rounded down,
    /// capped at the new burst; a full bucket stays full; a debt stays) and refill under the new numbers
    /// from now on. `shadow` switches shadow mode on or off, live. A new `time_zone` or `anchor` of a
    /// calendar window applies from each bucket's next window. `block_after => 0` removes the penalty box;
    /// blocks already started keep their end. In `options`, an option left out keeps its value and JSON
    /// `null` clears it.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[allow(clippy::too_many_arguments)] // SQL's named arguments, each with its default
    fn alter_policy(
        name: Option<&str>,
        rate: default!(Option<i64>, "NULL"),
        per: default!(Option<Interval>, "NULL"),
        burst: default!(Option<i64>, "NULL"),
        algorithm: default!(Option<&str>, "NULL"),
        shadow: default!(Option<bool>, "NULL"),
        max_debt: default!(Option<i64>, "NULL"),
        time_zone: default!(Option<&str>, "NULL"),
        anchor: default!(Option<Timestamp>, "NULL"),
        block_after: default!(Option<i64>, "NULL"),
        block_for: default!(Option<Interval>, "NULL"),
        options: default!(Option<JsonbText>, "NULL"),
    ) -> Result<(), ErrorReport> {
        const F: &str = "rate_limit.alter_policy";
        let name = required(F, "name", name, "Pass the name of an existing policy.")?;
        // a change of these may lengthen how long its buckets stay short: checked against the bound (a
        // policy made before the bound, or under a raised one, may still change its shadow mode or zone)
        let sets_the_bound = rate.is_some()
            || per.is_some()
            || burst.is_some()
            || algorithm.is_some()
            || max_debt.is_some()
            || block_after.is_some_and(|n| n != 0)
            || block_for.is_some();
        let (old, _) =
            Row::read(F, name, Lock::ForUpdate)?.ok_or_else(|| policies::unknown(F, name))?;
        let algorithm = match algorithm {
            Some(a) => parse_algorithm(F, a)?,
            None => old.algorithm,
        };
        let rate = rate.unwrap_or(old.rate);
        // Window algorithms allow `rate` per window: their burst follows the rate.
        let burst = match (burst, algorithm) {
            (Some(b), _) => b,
            (None, Algorithm::TokenBucket) => old.burst,
            (None, _) => rate,
        };
        // a calendar keeps its zone and anchor unless given; another algorithm has neither
        let (time_zone, anchor) = match algorithm {
            Algorithm::CalendarWindow => (
                time_zone.map(str::to_string).or(old.time_zone.clone()),
                anchor.or(old.anchor),
            ),
            _ => (time_zone.map(str::to_string), anchor),
        };
        let (block_after, block_for) = changed_penalty_box(&old, block_after, block_for);
        // the blocks a removed penalty box made end as blocks by hand do: calls keep reading them
        let blocks_by_hand =
            old.blocks_by_hand || (old.block_after.is_some() && block_after.is_none());
        let mut row = Row {
            algorithm,
            rate,
            per: per.unwrap_or(old.per),
            burst,
            changed_at: row_now(F)?,
            shadow: shadow.unwrap_or(old.shadow),
            max_debt: max_debt.unwrap_or(old.max_debt),
            time_zone,
            anchor,
            block_after,
            block_for,
            blocks_by_hand,
            ..old
        };
        let options = options.map(|o| options::parse(F, &o.0)).transpose()?;
        options::apply(F, &mut row, options.as_ref())?;
        let (named, row) = policies::checked(F, row)?;
        if sets_the_bound {
            crate::bounds::policy(F, &named.policy, named.max_debt, &named.blocking)?;
        }
        policies::family::check(F, &row)?;
        row.update(F)
    }

    /// Drops policy `name` and deletes its buckets of the table store; false if there was no such policy.
    /// Its memory-store buckets become unreachable and are evicted or purged as full ones.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn drop_policy(name: Option<&str>) -> Result<bool, ErrorReport> {
        const F: &str = "rate_limit.drop_policy";
        let name = required(F, "name", name, "Pass the name of an existing policy.")?;
        let args: [DatumWithOid<'_>; 1] = [name.into()];
        let dropped = spi_run(
            F,
            "DELETE FROM rate_limit.policies WHERE name OPERATOR(pg_catalog.=) $1 RETURNING 1",
            &args,
        )?;
        if dropped > 0 {
            policies::family::refuse_orphans(F, name)?;
            // only a policy's own namespace and its lease slots' (name U+001F slot): never the '#'-named
            // ones of ad-hoc and request buckets
            spi_run(
                F,
                "DELETE FROM rate_limit.bucket_state WHERE namespace OPERATOR(pg_catalog.=) $1 \
                 OR pg_catalog.split_part(namespace, pg_catalog.chr(31), 1) OPERATOR(pg_catalog.=) $1",
                &args,
            )?;
            spi_run(
                F,
                "DELETE FROM rate_limit.key_overrides WHERE policy OPERATOR(pg_catalog.=) $1",
                &args,
            )?;
        }
        Ok(dropped > 0)
    }

    /// Statement trigger on `rate_limit.policies` and `rate_limit.key_overrides`: a change is seen by every
    /// backend's next transaction. As a row trigger (BEFORE INSERT OR UPDATE) of `rate_limit.key_overrides`,
    /// it sets the row's key in the shared filter of keys that may have an override.
    /// Its C entry point is `policies_changed_wrapper` below, which refuses a direct call with 39P01.
    #[pg_trigger(sql = r#"
CREATE FUNCTION rate_limit."policies_changed"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'policies_changed_wrapper';
"#)]
    fn policies_changed_statement<'a>(
        trigger: &'a pgrx::PgTrigger<'a>,
    ) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, ErrorReport> {
        let relid = trigger.relid().map_err(|e| {
            ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                e.to_string(),
                "rate_limit.policies_changed",
            )
        })?;
        let row_level = matches!(trigger.level(), pgrx::PgTriggerLevel::Row);
        match own_table(relid) {
            // a row of rate_limit.key_overrides, inserted or updated (BEFORE, so before the transaction
            // commits): its key's bits in the shared filter of keys that may have an override
            Some(OwnTable::Overrides) if row_level => {
                let new = trigger.new();
                if let Some(row) = &new {
                    let text = |column: &str| row.get_by_name::<String>(column).ok().flatten();
                    if let (Some(policy), Some(key)) = (text("policy"), text("key")) {
                        policies::overrides::filter::add(&policy, &key);
                    }
                }
                return Ok(new);
            }
            // rate_limit.policies, or under Citus this node's copy of it: the relation the cache read
            Some(OwnTable::Policies) if !row_level => policies::invalidate(relid),
            // rate_limit.key_overrides (or a node's copy): every backend forgets which policies have
            // overrides; nothing else (overrides are read per key, never kept)
            Some(OwnTable::Overrides) => policies::invalidate_overrides(),
            // raised here, not returned: pgrx reports a trigger's Err as a panic (XX000)
            _ => ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                "rate_limit.policies_changed fires only on rate_limit.policies and rate_limit.key_overrides",
                "rate_limit.policies_changed",
            )
            .set_hint(
                "It is the extension's own trigger function; use rate_limit.limit_writes to limit writes.",
            )
            .report(PgLogLevel::ERROR),
        }
        Ok(None)
    }

    crate::trigger_entry_point!(
        policies_changed_wrapper,
        pg_finfo_policies_changed_wrapper,
        policies_changed_statement_wrapper,
        "rate_limit.policies_changed"
    );
}
