//! SQL functions that manage named policies (owner only), and the trigger that keeps every backend's policy
//! cache coherent. Every statement names its objects and operators with their schema.

use pgrx::datum::{DatumWithOid, Interval, Timestamp, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::spi::Spi;

use crate::algorithm::{Algorithm, Policy};
use crate::error;
use crate::policies::{self, check_name, parse_algorithm, parse_store};
use crate::time::calendar::anchor_us;

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

/// The `time_zone` and `anchor` columns of a policy: its calendar's zone (canonical name) and the anchor
/// it was given (NULL: its step's default), both NULL without a calendar.
fn calendar_columns(
    policy: &Policy,
    anchor: Option<Timestamp>,
) -> (Option<String>, Option<Timestamp>) {
    match policy.calendar_of() {
        Some(c) => (Some(c.zone_name().to_string()), anchor),
        None => (None, None),
    }
}

fn spi_run(
    function: &'static str,
    query: &str,
    args: &[DatumWithOid<'_>],
) -> Result<usize, ErrorReport> {
    Spi::connect_mut(|client| client.update(query, None, args).map(|t| t.len()))
        .map_err(|e| error::internal(function, e))
}

/// `algorithm, rate, per, burst, shadow, max_debt, time_zone, anchor, block_after, block_for` of a
/// `rate_limit.policies` row.
type StoredNumbers = (
    Option<String>,
    Option<i64>,
    Option<Interval>,
    Option<i64>,
    Option<bool>,
    Option<i64>,
    Option<String>,
    Option<Timestamp>,
    Option<i64>,
    Option<Interval>,
);

/// Policy management, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Creates the policy `name`: `rate` tokens per `per`, at most `burst` (default: `rate`) at once. With
    /// `shadow`, it never denies (would-be denials are reported and counted); `max_debt` is how many
    /// tokens below zero `rate_limit.charge` may drive a bucket. A `calendar_window` policy's windows start
    /// at `anchor + k × per` (whole days or months) on `time_zone`'s clocks. The penalty box: `block_after`
    /// denials of a key within one window (`per`) block it for `block_for` (both, or neither).
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
        let algorithm = parse_algorithm(F, algorithm)?;
        let anchor_at = anchor.map(|a| anchor_us(F, a)).transpose()?;
        let policy = policies::build(F, algorithm, rate, per, burst, time_zone, anchor_at)?;
        let (time_zone, anchor) = calendar_columns(&policy, anchor);
        if let Some(s) = store {
            parse_store(F, s)?;
        }
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
        policy
            .check_max_debt(max_debt)
            .map_err(|e| policies::debt_error(F, e))?;
        let blocking = policies::blocking(F, &policy, block_after, block_for)?;
        crate::bounds::policy(F, &policy, max_debt, &blocking)?;
        // the table store's clock, on which its rows are written (see crate::time::clock_shift)
        let now = TimestampWithTimeZone::try_from(crate::time::clock::table_now_us())
            .map_err(|_| error::bug(F, "the clock is out of the timestamp range"))?;
        let args: [DatumWithOid<'_>; 13] = [
            name.into(),
            algorithm.name().into(),
            policy.rate().into(),
            per.into(),
            policy.burst().into(),
            store.into(),
            now.into(),
            shadow.into(),
            max_debt.into(),
            time_zone.into(),
            anchor.into(),
            block_after.into(),
            block_for.into(),
        ];
        let inserted = spi_run(
            F,
            "INSERT INTO rate_limit.policies (name, algorithm, rate, per, burst, store, created_at, \
             changed_at, shadow, max_debt, time_zone, anchor, block_after, block_for) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10, $11, $12, $13) \
             ON CONFLICT (name) DO NOTHING RETURNING 1",
            &args,
        )?;
        if inserted == 0 {
            return Err(ErrorReport::new(
                PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
                format!("rate limit policy \"{name}\" already exists"),
                F,
            )
            .set_hint("Change it with rate_limit.alter_policy(name, ...)."));
        }
        Ok(())
    }

    /// Changes policy `name`; NULL keeps a value. Existing buckets carry their tokens over (rounded down,
    /// capped at the new burst; a full bucket stays full; a debt stays) and refill under the new numbers
    /// from now on. `shadow` switches shadow mode on or off, live. A new `time_zone` or `anchor` of a
    /// calendar window applies from each bucket's next window. `block_after => 0` removes the penalty box;
    /// blocks already started keep their end.
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
        let current: Option<StoredNumbers> = Spi::connect_mut(|client| {
            let args: [DatumWithOid<'_>; 1] = [name.into()];
            let t = client.update(
                "SELECT algorithm, rate, per, burst, shadow, max_debt, time_zone, anchor, block_after, \
                     block_for FROM rate_limit.policies WHERE name OPERATOR(pg_catalog.=) $1 FOR UPDATE",
                Some(1),
                &args,
            )?;
            if t.is_empty() {
                return Ok(None);
            }
            let r = t.first();
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
            )))
        })
        .map_err(|e| error::internal(F, e))?;
        let (
            old_alg,
            old_rate,
            old_per,
            old_burst,
            old_shadow,
            old_max_debt,
            old_zone,
            old_anchor,
            old_block_after,
            old_block_for,
        ) = current.ok_or_else(|| policies::unknown(F, name))?;
        let corrupt = || error::corrupt_row(F, "rate_limit.policies has a NULL column");
        let algorithm = match algorithm {
            Some(a) => parse_algorithm(F, a)?,
            None => parse_algorithm(F, old_alg.as_deref().ok_or_else(corrupt)?)?,
        };
        let rate = rate.or(old_rate).ok_or_else(corrupt)?;
        let per = per.or(old_per).ok_or_else(corrupt)?;
        // Window algorithms allow `rate` per window: their burst follows the rate.
        let burst = match (burst, algorithm) {
            (Some(b), _) => Some(b),
            (None, Algorithm::TokenBucket) => old_burst,
            (None, _) => None,
        };
        // a calendar keeps its zone and anchor unless given; another algorithm has neither
        let (zone, anchor) = match algorithm {
            Algorithm::CalendarWindow => (
                time_zone.map(str::to_string).or(old_zone),
                anchor.or(old_anchor),
            ),
            _ => (time_zone.map(str::to_string), anchor),
        };
        let anchor_at = anchor.map(|a| anchor_us(F, a)).transpose()?;
        let policy = policies::build(F, algorithm, rate, per, burst, zone.as_deref(), anchor_at)?;
        let (zone, anchor) = calendar_columns(&policy, anchor);
        let shadow = shadow.or(old_shadow).ok_or_else(corrupt)?;
        let max_debt = max_debt.or(old_max_debt).ok_or_else(corrupt)?;
        policy
            .check_max_debt(max_debt)
            .map_err(|e| policies::debt_error(F, e))?;
        // the penalty box: 0 removes it; otherwise each of its settings is kept unless given
        let (block_after, block_for) = match block_after {
            Some(0) => (None, None),
            given => (given.or(old_block_after), block_for.or(old_block_for)),
        };
        let blocking = policies::blocking(F, &policy, block_after, block_for)?;
        if sets_the_bound {
            crate::bounds::policy(F, &policy, max_debt, &blocking)?;
        }
        // the clock is read here and passed: Citus refuses a volatile function in an UPDATE of a
        // distributed (here: reference) table
        let changed_at = TimestampWithTimeZone::try_from(crate::time::clock::table_now_us())
            .map_err(|_| error::bug(F, "the clock is out of the timestamp range"))?;
        let args: [DatumWithOid<'_>; 12] = [
            name.into(),
            algorithm.name().into(),
            policy.rate().into(),
            per.into(),
            policy.burst().into(),
            changed_at.into(),
            shadow.into(),
            max_debt.into(),
            zone.into(),
            anchor.into(),
            block_after.into(),
            block_for.into(),
        ];
        spi_run(
            F,
            "UPDATE rate_limit.policies SET algorithm = $2, rate = $3, per = $4, burst = $5, \
             changed_at = $6, shadow = $7, max_debt = $8, time_zone = $9, anchor = $10, \
             block_after = $11, block_for = $12 \
             WHERE name OPERATOR(pg_catalog.=) $1",
            &args,
        )?;
        Ok(())
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
            // only a policy's own namespace and its lease slots' (name U+001F slot): never the '#'-named
            // ones of ad-hoc and request buckets
            spi_run(
                F,
                "DELETE FROM rate_limit.bucket_state WHERE namespace OPERATOR(pg_catalog.=) $1 \
                 OR pg_catalog.split_part(namespace, pg_catalog.chr(31), 1) OPERATOR(pg_catalog.=) $1",
                &args,
            )?;
        }
        Ok(dropped > 0)
    }

    /// Statement trigger on `rate_limit.policies`: every change invalidates every backend's policy cache.
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
        policies::invalidate(relid);
        Ok(None)
    }

    crate::trigger_entry_point!(
        policies_changed_wrapper,
        pg_finfo_policies_changed_wrapper,
        policies_changed_statement_wrapper,
        "rate_limit.policies_changed"
    );
}
