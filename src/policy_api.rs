//! SQL functions that manage named policies (owner only), the trigger that keeps every backend's policy
//! cache coherent, and the row arithmetic used inside the policy table store's statements.

use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::spi::Spi;

use crate::algorithm::{Algorithm, Policy};
use crate::error;
use crate::policies::{self, check_name, parse_algorithm, parse_store, period_us, policy_error};

fn required<T>(
    function: &'static str,
    argument: &str,
    value: Option<T>,
    hint: &str,
) -> Result<T, ErrorReport> {
    value.ok_or_else(|| error::null_argument(function, argument, hint))
}

/// Validates policy numbers; `burst` `None` means "the same as rate".
pub fn build_policy(
    function: &'static str,
    algorithm: Algorithm,
    rate: i64,
    per: Interval,
    burst: Option<i64>,
) -> Result<Policy, ErrorReport> {
    let period = period_us(function, "per", per)?;
    Policy::new(algorithm, rate, period, burst.unwrap_or(rate))
        .map_err(|e| policy_error(function, e))
}

fn spi_run(
    function: &'static str,
    query: &str,
    args: &[DatumWithOid<'_>],
) -> Result<usize, ErrorReport> {
    Spi::connect_mut(|client| client.update(query, None, args).map(|t| t.len()))
        .map_err(|e| error::internal(function, e))
}

/// `algorithm, rate, per, burst` of a `rate_limit.policies` row.
type StoredNumbers = (Option<String>, Option<i64>, Option<Interval>, Option<i64>);

/// Policy management, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Creates the policy `name`: `rate` tokens per `per`, at most `burst` (default: `rate`) at once.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[search_path(pg_catalog, pg_temp)]
    fn create_policy(
        name: Option<&str>,
        rate: Option<i64>,
        per: Option<Interval>,
        burst: default!(Option<i64>, "NULL"),
        algorithm: default!(Option<&str>, "'token_bucket'"),
        store: default!(Option<&str>, "NULL"),
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
            "Pass 'token_bucket', 'fixed_window' or 'sliding_window', or omit it.",
        )?;
        let algorithm = parse_algorithm(F, algorithm)?;
        let policy = build_policy(F, algorithm, rate, per, burst)?;
        if let Some(s) = store {
            parse_store(F, s)?;
        }
        let args: [DatumWithOid<'_>; 6] = [
            name.into(),
            algorithm.name().into(),
            policy.rate().into(),
            per.into(),
            policy.burst().into(),
            store.into(),
        ];
        let inserted = spi_run(
            F,
            "INSERT INTO rate_limit.policies (name, algorithm, rate, per, burst, store, created_at, changed_at) \
             VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp(), clock_timestamp()) \
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

    /// Changes the numbers of policy `name`; NULL keeps a value. Existing buckets carry their tokens over
    /// (rounded down, capped at the new burst; a full bucket stays full) and refill under the new numbers
    /// from now on.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[search_path(pg_catalog, pg_temp)]
    fn alter_policy(
        name: Option<&str>,
        rate: default!(Option<i64>, "NULL"),
        per: default!(Option<Interval>, "NULL"),
        burst: default!(Option<i64>, "NULL"),
        algorithm: default!(Option<&str>, "NULL"),
    ) -> Result<(), ErrorReport> {
        const F: &str = "rate_limit.alter_policy";
        let name = required(F, "name", name, "Pass the name of an existing policy.")?;
        let current: Option<StoredNumbers> =
            Spi::connect_mut(|client| {
                let args: [DatumWithOid<'_>; 1] = [name.into()];
                let t = client.update(
                    "SELECT algorithm, rate, per, burst FROM rate_limit.policies WHERE name = $1 FOR UPDATE",
                    Some(1),
                    &args,
                )?;
                if t.is_empty() {
                    return Ok(None);
                }
                let r = t.first();
                Ok::<_, pgrx::spi::SpiError>(Some((r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
            })
            .map_err(|e| error::internal(F, e))?;
        let (old_alg, old_rate, old_per, old_burst) =
            current.ok_or_else(|| policies::unknown(F, name))?;
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
        let policy = build_policy(F, algorithm, rate, per, burst)?;
        let args: [DatumWithOid<'_>; 5] = [
            name.into(),
            algorithm.name().into(),
            policy.rate().into(),
            per.into(),
            policy.burst().into(),
        ];
        spi_run(
            F,
            "UPDATE rate_limit.policies SET algorithm = $2, rate = $3, per = $4, burst = $5, \
             changed_at = clock_timestamp() WHERE name = $1",
            &args,
        )?;
        Ok(())
    }

    /// Drops policy `name` and deletes its buckets of the table store; false if there was no such policy.
    /// Its memory-store buckets become unreachable and are evicted or purged as full ones.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[search_path(pg_catalog, pg_temp)]
    fn drop_policy(name: Option<&str>) -> Result<bool, ErrorReport> {
        const F: &str = "rate_limit.drop_policy";
        let name = required(F, "name", name, "Pass the name of an existing policy.")?;
        let args: [DatumWithOid<'_>; 1] = [name.into()];
        let dropped = spi_run(
            F,
            "DELETE FROM rate_limit.policies WHERE name = $1 RETURNING 1",
            &args,
        )?;
        spi_run(
            F,
            "DELETE FROM rate_limit.policy_state WHERE policy = $1",
            &args,
        )?;
        Ok(dropped > 0)
    }

    /// Statement trigger on `rate_limit.policies`: every change invalidates every backend's policy cache.
    #[pg_trigger]
    fn policies_changed<'a>(
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

    /// The level after taking `cost` tokens at `at` from a stored `rate_limit.policy_state` row, carried
    /// over to the numbers of the call (`new_*`, in effect since `changed_at`), or -1 if there are not
    /// enough: the arithmetic inside the table store's conditional UPDATE.
    #[allow(clippy::too_many_arguments)] // a stored row, the call's numbers and the instant, as SQL passes them
    #[pg_extern(immutable, parallel_safe, strict)]
    fn state_after_take(
        level: i64,
        updated_at: TimestampWithTimeZone,
        algorithm: &str,
        rate: i64,
        per_us: i64,
        burst: i64,
        new_algorithm: &str,
        new_rate: i64,
        new_per_us: i64,
        new_burst: i64,
        changed_at: TimestampWithTimeZone,
        at: TimestampWithTimeZone,
        cost: i64,
    ) -> Result<i64, ErrorReport> {
        const F: &str = "rate_limit.state_after_take";
        let stored = stored_row(F, level, updated_at, algorithm, rate, per_us, burst)?;
        let current = Algorithm::parse(new_algorithm)
            .and_then(|a| Policy::new(a, new_rate, new_per_us, new_burst).ok())
            .ok_or_else(|| error::out_of_range_limit(F, "invalid policy numbers"))?;
        Ok(crate::store::policy_table::state_after_take(
            stored,
            current,
            changed_at.into_inner(),
            at.into_inner(),
            cost,
        ))
    }

    /// Tokens in a stored `rate_limit.policy_state` row at `at`, exact to the millionth (rounded down).
    #[pg_extern(immutable, parallel_safe, strict)]
    fn policy_state_tokens(
        level: i64,
        updated_at: TimestampWithTimeZone,
        algorithm: &str,
        rate: i64,
        per_us: i64,
        burst: i64,
        at: TimestampWithTimeZone,
    ) -> Result<AnyNumeric, ErrorReport> {
        const F: &str = "rate_limit.policy_state_tokens";
        let s = stored_row(F, level, updated_at, algorithm, rate, per_us, burst)?;
        error::millionths_numeric(F, s.policy.tokens_millionths(s.state, at.into_inner()))
    }

    /// Whether a stored `rate_limit.policy_state` row is full at `at` (and so may be deleted losslessly).
    #[pg_extern(immutable, parallel_safe, strict)]
    fn policy_state_is_full(
        level: i64,
        updated_at: TimestampWithTimeZone,
        algorithm: &str,
        rate: i64,
        per_us: i64,
        burst: i64,
        at: TimestampWithTimeZone,
    ) -> Result<bool, ErrorReport> {
        let s = stored_row(
            "rate_limit.policy_state_is_full",
            level,
            updated_at,
            algorithm,
            rate,
            per_us,
            burst,
        )?;
        Ok(s.policy.is_full(s.state, at.into_inner()))
    }

    /// Policy and ad-hoc buckets of the memory store in this database (none when the library is not
    /// preloaded), for `rate_limit.policy_buckets`. Buckets of a dropped policy are not listed.
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    #[search_path(pg_catalog, pg_temp)]
    fn memory_policy_buckets() -> Result<
        TableIterator<
            'static,
            (
                name!(policy, Option<String>),
                name!(key, String),
                name!(tokens, AnyNumeric),
                name!(limit, i64),
                name!(algorithm, String),
                name!(updated_at, Option<TimestampWithTimeZone>),
            ),
        >,
        ErrorReport,
    > {
        const F: &str = "rate_limit.memory_policy_buckets";
        let listed = crate::store::memory::list_targets();
        let mut names = std::collections::HashMap::new();
        if listed.iter().any(|l| !l.ad_hoc) {
            Spi::connect(|client| {
                for row in client.select(
                    "SELECT name, created_at FROM rate_limit.policies",
                    None,
                    &[],
                )? {
                    let name: Option<String> = row.get(1)?;
                    let created: Option<TimestampWithTimeZone> = row.get(2)?;
                    if let (Some(name), Some(created)) = (name, created) {
                        let tag = crate::store::memory::policy_tag(&name, created.into_inner());
                        names.insert(tag, name);
                    }
                }
                Ok::<_, pgrx::spi::SpiError>(())
            })
            .map_err(|e| error::internal(F, e))?;
        }
        let mut rows = Vec::with_capacity(listed.len());
        for l in listed {
            let policy = if l.ad_hoc {
                None
            } else {
                match names.get(&l.policy_tag) {
                    Some(n) => Some(n.clone()),
                    None => continue, // a dropped policy's bucket, waiting to be purged
                }
            };
            let tokens = error::millionths_numeric(F, l.millionths)?;
            rows.push((
                policy,
                l.key,
                tokens,
                l.burst,
                l.algorithm.to_string(),
                TimestampWithTimeZone::try_from(l.updated_at).ok(),
            ));
        }
        Ok(TableIterator::new(rows))
    }

    fn stored_row(
        function: &'static str,
        level: i64,
        updated_at: TimestampWithTimeZone,
        algorithm: &str,
        rate: i64,
        per_us: i64,
        burst: i64,
    ) -> Result<crate::store::target::Stored, ErrorReport> {
        let policy = Algorithm::parse(algorithm)
            .and_then(|a| Policy::new(a, rate, per_us, burst).ok())
            .ok_or_else(|| error::corrupt_row(function, "invalid policy numbers"))?;
        Ok(crate::store::target::Stored {
            state: crate::algorithm::State {
                level,
                at: updated_at.into_inner(),
            },
            policy,
        })
    }
}
