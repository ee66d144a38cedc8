//! The table store's SQL-side helpers: the functions its statements and the `rate_limit.buckets` view
//! call (`rate_limit.state_after_take`, `effective_now`, `state_tokens`, `state_is_full`), and the memo
//! that lets one `TAKE` evaluate its arithmetic once per row version. Not public API: PUBLIC cannot
//! execute them (`sql/finalize.sql`); bad numbers give 22023 like every other argument error.
//!
//! The memo. `TAKE` names the arithmetic in its `WHERE` (may the row be updated?) and in its `SET` (the
//! new level and instant) on the same row version. Each execution of `TAKE` passes a call number of its
//! own ([`next_call`]); the first evaluation for a (call, row version) pair computes and remembers, the
//! others read the result back. So the arithmetic and the clock reading of
//! [`crate::clock::effective_now`] happen once per row version, the row's level and instant come from one
//! decision, and a result never serves another statement, however equal its arguments. Under READ
//! COMMITTED a concurrent update makes PostgreSQL re-check the newest version: a new row version, so a
//! new evaluation.

use std::cell::Cell;

use pgrx::datum::{AnyNumeric, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::algorithm::{Algorithm, Policy, State};
use crate::clock;
use crate::error;
use crate::store::target::Stored;

/// One evaluation of `TAKE`'s arithmetic: the call and row version it was for, the level it gave (-1:
/// denied) and the instant it was evaluated at.
#[derive(Clone, Copy)]
struct Evaluated {
    call: i64,
    stored: Stored,
    level: i64,
    instant: i64,
}

thread_local! {
    /// The number of the last `TAKE` this backend ran.
    static CALLS: Cell<i64> = const { Cell::new(0) };
    /// The last evaluation in this backend.
    static LAST_TAKE: Cell<Option<Evaluated>> = const { Cell::new(None) };
    /// How many times the arithmetic ran in this backend (for the test that it runs once per grant).
    static EVALUATIONS: Cell<u64> = const { Cell::new(0) };
}

/// A number for the next execution of `TAKE`, distinct from every earlier one in this backend.
pub(super) fn next_call() -> i64 {
    CALLS.with(|c| {
        let call = c.get().wrapping_add(1);
        c.set(call);
        call
    })
}

/// How many times `TAKE`'s arithmetic has been evaluated in this backend.
#[cfg(any(test, feature = "pg_test"))]
pub fn evaluations() -> u64 {
    EVALUATIONS.with(Cell::get)
}

/// The level after taking `cost` at `now` from a stored row, converted to the current numbers (in effect
/// since `changed_at`), or -1 when denied: the arithmetic inside `TAKE`, once per (call, row version).
fn level_after_take(
    call: i64,
    stored: Stored,
    current: Policy,
    changed_at: i64,
    now: i64,
    cost: i64,
) -> i64 {
    if let Some(e) = LAST_TAKE
        .with(Cell::get)
        .filter(|e| e.call == call && e.stored == stored)
    {
        return e.level;
    }
    EVALUATIONS.with(|c| c.set(c.get() + 1));
    let instant = clock::effective_now(now, stored.state.at);
    let state = current.carry_over(stored.state, &stored.policy, changed_at, instant);
    let outcome = current.take(state, instant, cost);
    let level = if outcome.allowed {
        outcome.state.level
    } else {
        -1
    };
    LAST_TAKE.with(|c| {
        c.set(Some(Evaluated {
            call,
            stored,
            level,
            instant,
        }))
    });
    level
}

/// The instant call `call`, which read the clock at `now`, evaluates a row stored at `at` at: the one its
/// arithmetic used for that row version, else [`clock::effective_now`].
fn instant_of_take(call: i64, now: i64, at: i64) -> i64 {
    match LAST_TAKE.with(Cell::get) {
        Some(e) if e.call == call && e.stored.state.at == at => e.instant,
        _ => clock::effective_now(now, at),
    }
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
        error::invalid_numbers(function, &format!("unknown algorithm '{algorithm}'"))
    })?;
    Policy::new(algorithm, rate, per_us, burst)
        .map_err(|e| error::invalid_numbers(function, &e.to_string()))
}

fn stored_row(
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

    /// The level after taking `cost` tokens at `now` from a stored `rate_limit.bucket_state` row, carried
    /// over to the numbers of the call (`new_*`, in effect since `changed_at`), or -1 if there are not
    /// enough: the arithmetic inside the table store's conditional UPDATE, evaluated once per `call` and
    /// row version. Volatile: it reads the clock to tell concurrency skew from a clock step
    /// (`crate::clock::effective_now`). The C symbol differs from 0.3.0's (which took no call number, see
    /// `superseded`), so 0.3.0's definition never reads arguments at the wrong place.
    #[allow(clippy::too_many_arguments)] // a stored row, the call's numbers and the instant, as SQL passes them
    #[pg_extern(name = "state_after_take", volatile, parallel_safe, strict)]
    fn state_after_take_of_call(
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
        call: i64,
    ) -> Result<i64, ErrorReport> {
        const F: &str = "rate_limit.state_after_take";
        let stored = stored_row(F, level, updated_at, algorithm, rate, per_us, burst)?;
        let current = row_policy(F, new_algorithm, new_rate, new_per_us, new_burst)?;
        if cost < 0 {
            return Err(error::out_of_range(F, "cost", cost, 0, i64::MAX));
        }
        Ok(level_after_take(
            call,
            stored,
            current,
            changed_at.into_inner(),
            now.into_inner(),
            cost,
        ))
    }

    /// The instant a row stored at `updated_at` is evaluated at by `call`, which read the clock at `now`
    /// (see `crate::clock::effective_now`): the row's new `updated_at` after a grant, the very instant the
    /// arithmetic of the same call used. New C symbol, as for `state_after_take`.
    #[pg_extern(name = "effective_now", volatile, parallel_safe, strict)]
    fn effective_now_of_call(
        call: i64,
        now: TimestampWithTimeZone,
        updated_at: TimestampWithTimeZone,
    ) -> Result<TimestampWithTimeZone, ErrorReport> {
        let at = instant_of_take(call, now.into_inner(), updated_at.into_inner());
        TimestampWithTimeZone::try_from(at).map_err(|_| {
            error::invalid_numbers("rate_limit.effective_now", "the instant is out of range")
        })
    }

    /// Tokens in a stored `rate_limit.bucket_state` row at `at`, exact to the millionth (rounded down).
    #[pg_extern(stable, parallel_safe, strict)]
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
    #[pg_extern(stable, parallel_safe, strict)]
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

/// The C entry points of 0.3.0's definitions of `state_after_take` and `effective_now`, which took no call
/// number. They must exist so that a database still at 0.3.0 can be restored or `pg_upgrade`d with this
/// library installed (PostgreSQL checks a C function's symbol when the function is created) and then
/// updated; called, they raise 55000: only 0.3.0's own library could serve them. Until `ALTER EXTENSION
/// rate_limit UPDATE`, this library's table store finds no 14-argument `state_after_take` and fails with
/// 42883, and the background worker skips the database (it checks the version).
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

    /// The memo serves the `WHERE` and `SET` of one call on one row version, and nothing else: another
    /// call with equal arguments, or a newer row version in the same call, evaluates again.
    #[pg_test]
    fn the_memo_is_keyed_by_call_and_row_version() {
        let p = Policy::new(Algorithm::TokenBucket, 1, 1_000_000, 5).expect("valid");
        let stored = Stored {
            state: p.full(0),
            policy: p,
        };
        let (first, second) = (next_call(), next_call());
        let before = evaluations();
        let level = level_after_take(first, stored, p, i64::MIN, 10, 1);
        assert_eq!(level_after_take(first, stored, p, i64::MIN, 10, 1), level);
        assert_eq!(evaluations() - before, 1);
        assert_eq!(level_after_take(second, stored, p, i64::MIN, 10, 1), level);
        assert_eq!(evaluations() - before, 2);
        let newer = Stored {
            state: State { level, at: 10 },
            policy: p,
        };
        level_after_take(second, newer, p, i64::MIN, 10, 1);
        assert_eq!(evaluations() - before, 3);
        assert_eq!(instant_of_take(second, 10, 10), 10);
    }
}
