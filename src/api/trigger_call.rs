//! Trigger functions called directly. pgrx's trigger wrapper panics (XX000 "NotTrigger", with a backtrace
//! when `RUST_BACKTRACE` is set) when a trigger function is called as a plain function, and PUBLIC may
//! call `rate_limit.limit_writes()`. So each trigger function's C entry point is ours
//! ([`trigger_entry_point!`]): it raises 39P01, as PostgreSQL's own trigger functions do, unless it is
//! called by the trigger manager, and only then hands the call to pgrx's wrapper.

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

/// Raises 39P01 (`trigger_protocol_violated`) unless `fcinfo` is a call by the trigger manager.
///
/// # Safety
/// `fcinfo` is the call's `FunctionCallInfo`, as PostgreSQL passes it to a V1 function.
pub unsafe fn require_trigger_call(fcinfo: pg_sys::FunctionCallInfo, function: &'static str) {
    // SAFETY: PostgreSQL passes a valid fcinfo; its context is NULL or points at a Node, whose first field
    // is its tag (CALLED_AS_TRIGGER in commands/trigger.h reads it the same way).
    let is_trigger = unsafe {
        !fcinfo.is_null()
            && !(*fcinfo).context.is_null()
            && (*(*fcinfo).context).type_ == pg_sys::NodeTag::T_TriggerData
    };
    if !is_trigger {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
            format!("{function}() is a trigger function: it can only be called as a trigger"),
            function,
        )
        .set_hint("Use it in CREATE TRIGGER ... EXECUTE FUNCTION; see the rate_limit reference.")
        .report(PgLogLevel::ERROR);
    }
}

/// Defines the C entry point `$entry` (with its `pg_finfo_` record) of trigger function `$name`: it checks
/// the call with [`require_trigger_call`], then calls pgrx's wrapper `$pgrx_wrapper`.
#[macro_export]
macro_rules! trigger_entry_point {
    ($entry:ident, $finfo:ident, $pgrx_wrapper:ident, $name:literal) => {
        /// The V1 calling-convention record of this entry point.
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record =
                ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }

        /// The C entry point: refuses a direct call with 39P01, else runs the trigger.
        ///
        /// # Safety
        /// Called by PostgreSQL with a valid `fcinfo`.
        #[::pgrx::pg_guard]
        #[unsafe(no_mangle)]
        pub unsafe extern "C-unwind" fn $entry(
            fcinfo: ::pgrx::pg_sys::FunctionCallInfo,
        ) -> ::pgrx::pg_sys::Datum {
            const NAME: &str = $name;
            let run: unsafe extern "C-unwind" fn(
                ::pgrx::pg_sys::FunctionCallInfo,
            ) -> ::pgrx::pg_sys::Datum = $pgrx_wrapper;
            // SAFETY: PostgreSQL passes the call's fcinfo, valid for the call; `run` is the entry point
            // pgrx generated for the same trigger function and is given the same fcinfo.
            unsafe {
                $crate::api::trigger_call::require_trigger_call(fcinfo, NAME);
                run(fcinfo)
            }
        }
    };
}
