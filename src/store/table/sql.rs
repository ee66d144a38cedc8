//! The table store's SQL-side helpers: the functions its statements and the `rate_limit.buckets` view
//! call (`rate_limit.state_after_take`, `state_tokens`, `state_is_full`), and the memo that lets one
//! `TAKE` evaluate its arithmetic once per row version. Not public API: PUBLIC cannot execute them
//! (`sql/finalize.sql`); bad numbers give 22023 like every other argument error.
//!
//! All three are pure functions of their arguments, declared IMMUTABLE: the caller reads the clock once,
//! in Rust, and passes it. That is what lets Citus route `TAKE` to the shard of its key (Citus refuses a
//! VOLATILE or STABLE function given columns in an UPDATE of a distributed table), and it is true: no
//! helper reads the clock, a setting or a table.
//!
//! The memo. `TAKE` names the arithmetic in its `WHERE` (may the row be updated?) and in its `SET` (the
//! new level) on the same row version, so the same arguments arrive twice in a row. The first evaluation
//! computes and remembers; the second reads it back. Keyed by every argument, which is sound because the
//! function is pure: equal arguments give equal results, whichever statement asks. Under READ COMMITTED a
//! concurrent update makes PostgreSQL re-check the newest version: new arguments, a new evaluation.

use std::cell::Cell;

use pgrx::datum::{AnyNumeric, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::error;
use rate_limit_model::algorithm::{Algorithm, Policy, State};
use rate_limit_model::target::Stored;

/// The arguments of one evaluation of `TAKE`'s arithmetic.
#[derive(Clone, Copy, PartialEq, Eq)]
struct TakeArgs {
    stored: Stored,
    current: Policy,
    changed_at: i64,
    now: i64,
    cost: i64,
    /// Where the calendar window open at `now` ends (calendar windows only; the caller's calendar says).
    window_end: i64,
}

thread_local! {
    /// The last evaluation in this backend: its arguments and the level it gave (-1: denied).
    static LAST_TAKE: Cell<Option<(TakeArgs, i64)>> = const { Cell::new(None) };
    /// How many times the arithmetic ran in this backend (for the test that it runs once per grant).
    static EVALUATIONS: Cell<u64> = const { Cell::new(0) };
}

/// How many times `TAKE`'s arithmetic has been evaluated in this backend.
#[cfg(any(test, feature = "pg_test"))]
pub fn evaluations() -> u64 {
    EVALUATIONS.with(Cell::get)
}

/// The level after taking `cost` from a stored row, converted to the current numbers (in effect since
/// `changed_at`), or -1 when denied: the arithmetic inside `TAKE`. It is evaluated at
/// `max(now, stored instant)`: a row written after the caller read its clock (another session got there
/// first, or the clock stepped back) counts no time as elapsed, so nothing is counted twice; the caller
/// rebases a row left ahead of the clock (see `store::table::take_one`).
fn level_after_take(args: TakeArgs) -> i64 {
    if let Some((_, level)) = LAST_TAKE.with(Cell::get).filter(|(a, _)| *a == args) {
        return level;
    }
    EVALUATIONS.with(|c| c.set(c.get() + 1));
    let TakeArgs {
        stored,
        current,
        changed_at,
        now,
        cost,
        window_end,
    } = args;
    let current = current.open_until(window_end);
    let instant = now.max(stored.state.at);
    let state = current.carry_over(stored.state, &stored.policy, changed_at, instant);
    let outcome = current.take(state, instant, cost);
    let level = if outcome.allowed {
        outcome.state.level
    } else {
        -1
    };
    LAST_TAKE.with(|c| c.set(Some((args, level))));
    level
}

/// A stored row's numbers as a policy; 22023 when they do not make one.
fn row_policy(
    function: &'static str,
    algorithm: &str,
    rate: i64,
    per_us: i64,
    burst: i64,
) -> Result<Policy, ErrorReport> {
    let algorithm = Algorithm::parse(algorithm).ok_or_else(|| {
        error::invalid_numbers(
            function,
            &format!("unknown algorithm {}", error::quoted(algorithm)),
        )
    })?;
    Policy::new(algorithm, rate, per_us, burst)
        .map_err(|e| error::invalid_numbers(function, &e.to_string()))
}

pub(super) fn stored_row(
    function: &'static str,
    level: i64,
    updated_at: TimestampWithTimeZone,
    algorithm: &str,
    rate: i64,
    per_us: i64,
    burst: i64,
) -> Result<Stored, ErrorReport> {
    Ok(Stored {
        state: State {
            level,
            at: updated_at.into_inner(),
        },
        policy: row_policy(function, algorithm, rate, per_us, burst)?,
    })
}

/// The table store's SQL functions, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// The level after taking `cost` tokens at `now` (the caller's clock reading) from a stored
    /// `rate_limit.bucket_state` row, carried over to the numbers of the call (`new_*`, in effect since
    /// `changed_at`), or -1 if there are not enough: the arithmetic inside the table store's conditional
    /// UPDATE. `window_end` is where a calendar window opened by this take ends (the caller's calendar
    /// computes it: a row's numbers do not hold the calendar); other algorithms ignore it. Pure, so IMMUTABLE. Its C symbol differs from 0.3.0's (which was volatile and read the clock,
    /// see `superseded`).
    #[allow(clippy::too_many_arguments)] // a stored row, the call's numbers and the instant, as SQL passes them
    #[pg_extern(name = "state_after_take", immutable, parallel_safe, strict)]
    fn state_after_take_at(
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
        now: TimestampWithTimeZone,
        cost: i64,
        window_end: TimestampWithTimeZone,
    ) -> Result<i64, ErrorReport> {
        const F: &str = "rate_limit.state_after_take";
        let stored = stored_row(F, level, updated_at, algorithm, rate, per_us, burst)?;
        let current = row_policy(F, new_algorithm, new_rate, new_per_us, new_burst)?;
        if cost < 0 {
            return Err(error::out_of_range(F, "cost", cost, 0, i64::MAX));
        }
        Ok(level_after_take(TakeArgs {
            stored,
            current,
            changed_at: changed_at.into_inner(),
            now: now.into_inner(),
            cost,
            window_end: window_end.into_inner(),
        }))
    }

    /// Tokens in a stored `rate_limit.bucket_state` row at `at`, exact to the millionth (rounded down).
    #[pg_extern(immutable, parallel_safe, strict)]
    fn state_tokens(
        level: i64,
        updated_at: TimestampWithTimeZone,
        algorithm: &str,
        rate: i64,
        per_us: i64,
        burst: i64,
        at: TimestampWithTimeZone,
    ) -> Result<AnyNumeric, ErrorReport> {
        const F: &str = "rate_limit.state_tokens";
        let s = stored_row(F, level, updated_at, algorithm, rate, per_us, burst)?;
        error::millionths_numeric(F, s.policy.tokens_millionths(s.state, at.into_inner()))
    }

    /// Whether a stored `rate_limit.bucket_state` row is full at `at` (and so may be deleted losslessly).
    #[pg_extern(immutable, parallel_safe, strict)]
    fn state_is_full(
        level: i64,
        updated_at: TimestampWithTimeZone,
        algorithm: &str,
        rate: i64,
        per_us: i64,
        burst: i64,
        at: TimestampWithTimeZone,
    ) -> Result<bool, ErrorReport> {
        const F: &str = "rate_limit.state_is_full";
        let s = stored_row(F, level, updated_at, algorithm, rate, per_us, burst)?;
        Ok(s.policy.is_full(s.state, at.into_inner()))
    }
}

/// The C entry points of 0.3.0's definitions of `state_after_take` and `effective_now`, which read the
/// clock. They must exist so that a database still at 0.3.0 can be restored or `pg_upgrade`d with this
/// library installed (PostgreSQL checks a C function's symbol when the function is created) and then
/// updated; called, they raise 55000 with a hint to update: only 0.3.0's own library could serve them. So
/// until `ALTER EXTENSION rate_limit UPDATE`, this library's table store (whose `TAKE` calls the 13-argument
/// `state_after_take` that 0.3.0 defined with the old symbol) fails with 55000, and the background worker
/// skips the database (it checks the version).
mod superseded {
    use pgrx::pg_sys;
    use pgrx::pg_sys::panic::ErrorReport;
    use pgrx::prelude::*;

    fn refuse(function: &'static str) -> ! {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{function} of rate_limit 0.3.0 cannot run with library {}",
                env!("CARGO_PKG_VERSION")
            ),
            function,
        )
        .set_hint("Run ALTER EXTENSION rate_limit UPDATE in this database.")
        .report(PgLogLevel::ERROR);
        unreachable!("an ERROR does not return")
    }

    /// The V1 calling-convention record of 0.3.0's `state_after_take`.
    #[unsafe(no_mangle)]
    pub extern "C" fn pg_finfo_state_after_take_wrapper() -> &'static pg_sys::Pg_finfo_record {
        const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
        &V1
    }

    /// 0.3.0's `state_after_take`: refused with 55000.
    #[pg_guard]
    #[unsafe(no_mangle)]
    pub extern "C-unwind" fn state_after_take_wrapper(
        _fcinfo: pg_sys::FunctionCallInfo,
    ) -> pg_sys::Datum {
        refuse("rate_limit.state_after_take")
    }

    /// The V1 calling-convention record of 0.3.0's `effective_now`.
    #[unsafe(no_mangle)]
    pub extern "C" fn pg_finfo_effective_now_wrapper() -> &'static pg_sys::Pg_finfo_record {
        const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
        &V1
    }

    /// 0.3.0's `effective_now`: refused with 55000.
    #[pg_guard]
    #[unsafe(no_mangle)]
    pub extern "C-unwind" fn effective_now_wrapper(
        _fcinfo: pg_sys::FunctionCallInfo,
    ) -> pg_sys::Datum {
        refuse("rate_limit.effective_now")
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use super::*;

    /// The memo serves the `WHERE` and `SET` of one row version: equal arguments evaluate once; a newer
    /// row version, or another clock reading, evaluates again.
    #[pg_test]
    fn the_memo_is_keyed_by_every_argument() {
        let p = Policy::new(Algorithm::TokenBucket, 1, 1_000_000, 5).expect("valid");
        let args = TakeArgs {
            stored: Stored {
                state: p.full(0),
                policy: p,
            },
            current: p,
            changed_at: i64::MIN,
            now: 10,
            cost: 1,
            window_end: 10,
        };
        let before = evaluations();
        let level = level_after_take(args);
        assert_eq!(level_after_take(args), level);
        assert_eq!(evaluations() - before, 1);
        let newer = TakeArgs {
            stored: Stored {
                state: State { level, at: 10 },
                policy: p,
            },
            ..args
        };
        level_after_take(newer);
        assert_eq!(evaluations() - before, 2);
        level_after_take(TakeArgs { now: 11, ..newer });
        assert_eq!(evaluations() - before, 3);
        level_after_take(TakeArgs {
            now: 11,
            window_end: 20,
            ..newer
        });
        assert_eq!(evaluations() - before, 4);
    }

    /// A calendar window known by its numbers alone opens its window where the caller's calendar said,
    /// and keeps it: the stored level holds that end.
    #[pg_test]
    fn a_calendar_window_opens_where_the_caller_says_it_ends() {
        const S: i64 = 1_000_000;
        let p = Policy::new(Algorithm::CalendarWindow, 3, 86_400 * S, 3).expect("valid");
        let now = 1_000 * S;
        let end = 5_000 * S; // not now + a nominal day: the calendar's end
        let args = TakeArgs {
            stored: Stored {
                state: p.full(0),
                policy: p,
            },
            current: p,
            changed_at: i64::MIN,
            now,
            cost: 2,
            window_end: end,
        };
        let level = level_after_take(args);
        let state = State { level, at: now };
        assert_eq!(p.take(state, now, 0).remaining, 1);
        assert_eq!(p.take(state, now, 0).reset_after, end - now);
        assert!(!p.take(state, end - 1, 2).allowed);
        assert!(p.take(state, end, 3).allowed);
    }

    /// A row written after the caller read its clock is evaluated at its own instant: no time elapsed,
    /// nothing refilled twice.
    #[pg_test]
    fn a_row_ahead_of_the_clock_counts_no_time_as_elapsed() {
        let p = Policy::new(Algorithm::TokenBucket, 1, 1_000_000, 5).expect("valid");
        let empty = State {
            level: 0,
            at: 5_000_000,
        };
        let args = TakeArgs {
            stored: Stored {
                state: empty,
                policy: p,
            },
            current: p,
            changed_at: i64::MIN,
            now: 1_000_000,
            cost: 1,
            window_end: 0,
        };
        assert_eq!(level_after_take(args), -1);
        assert!(
            level_after_take(TakeArgs {
                now: 6_000_000,
                ..args
            }) >= 0
        );
    }
}
