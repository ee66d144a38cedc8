//! `rate_limit.allow(policy, key, cost DEFAULT 1) RETURNS boolean`: take's answer without the decision
//! row, the scalar most callers need (`WHERE rate_limit.allow('api', $1)`).
//!
//! Its C entry point is written by hand, so that it can run as its owner without being SECURITY DEFINER.
//! A SECURITY DEFINER function runs as its owner through `fmgr_security_definer`, which, for every
//! statement that calls it, looks the function up in the catalog cache again and allocates its cache
//! before the first call. `allow` does the same switch itself ([`crate::backend::as_user`], as SECURITY
//! DEFINER and ri_triggers.c do), with its owner kept in the call's `fn_extra` for the statement and
//! remembered by the backend until a function's catalog row changes ([`crate::backend::function_owner`]):
//! the whole call runs as the owner, with the rights it had as SECURITY DEFINER, and nothing of
//! the caller's but the session role (which the per-role bounds count) is seen inside. Counted with
//! callgrind in a primary-key lookup with `allow` in its WHERE, that is 830 instructions less per lookup,
//! 7% of what the limit adds (bench/results/allow_instructions.md).

use pgrx::fcinfo::{pg_get_nullable_datum, pg_getarg};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::varlena;

use super::limits::take_policy_answer;
use crate::backend;
use crate::error;
use rate_limit_model::target::granted;

/// The V1 calling-convention record of [`allow_wrapper`].
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_allow_wrapper() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// The C entry point of `rate_limit.allow` (declared by the `extension_sql!` below): takes as `take` does
/// and answers whether the call is allowed (a shadow policy's would-be denial too), as its owner. A bad
/// argument raises what `take` raises, so no NULL ever answers.
///
/// # Safety
/// Called by PostgreSQL with a valid `fcinfo` for the SQL signature declared below.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn allow_wrapper(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    const F: &str = "rate_limit.allow";
    // SAFETY: the arguments are those of the declared signature (text, text, integer), read with their
    // Rust types ([`text_arg`] for the two texts); valid for the call.
    let (policy, key, cost) = unsafe {
        (
            text_arg(fcinfo, 0),
            text_arg(fcinfo, 1),
            pg_getarg::<i32>(fcinfo, 2),
        )
    };
    // SAFETY: fcinfo is this call's.
    let allowed = unsafe { owner_of_call(fcinfo, F) }.and_then(|owner| {
        backend::as_user(owner, || take_policy_answer(F, policy, key, cost, granted))
    });
    match allowed {
        Ok(allowed) => pg_sys::Datum::from(allowed),
        Err(e) => {
            e.report(PgLogLevel::ERROR);
            unreachable!("an ERROR does not return")
        }
    }
}

/// Text argument `n` of the call: read in place when it is stored inline and uncompressed and is all
/// ASCII (a policy name or a key almost always is), with no call into PostgreSQL; otherwise through
/// pgrx's conversion, which detoasts it (under a guard: that can raise) and checks it against the
/// database's encoding. ASCII is read the same in every server encoding, so both ways answer the same.
///
/// # Safety
/// `fcinfo` is a valid call's and argument `n` is of type text.
unsafe fn text_arg<'a>(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<&'a str> {
    // SAFETY: the caller's promise; the argument's null flag and datum are read from fcinfo.
    let datum = unsafe { pg_get_nullable_datum(fcinfo, n) };
    if datum.isnull {
        return None;
    }
    let text = datum.value.cast_mut_ptr::<pg_sys::varlena>();
    // SAFETY: a non-null text datum points at a varlena whose header says how it is stored: neither
    // external (1B_E) nor compressed (4B_C) means its bytes follow the header in place (what
    // pg_detoast_datum_packed would return unchanged), valid for the call.
    let in_place = unsafe {
        if varlena::varatt_is_1b_e(text) || varlena::varatt_is_4b_c(text) {
            None
        } else {
            Some(std::slice::from_raw_parts(
                varlena::vardata_any(text).cast::<u8>(),
                varlena::varsize_any_exhdr(text),
            ))
        }
    };
    match in_place {
        // SAFETY: ASCII bytes are valid UTF-8.
        Some(bytes) if bytes.is_ascii() => Some(unsafe { std::str::from_utf8_unchecked(bytes) }),
        // SAFETY: as above; pgrx detoasts into the current memory context, valid for the call.
        _ => unsafe { pg_getarg::<&str>(fcinfo, n) },
    }
}

/// The owner of the function being called: asked of [`backend::function_owner`] (which remembers it
/// until the catalog's row of a function changes) at the first call of a statement's call site, then
/// kept in its `fn_extra` (allocated in `fn_mcxt`, which lives as long as the call site; nothing else uses
/// this function's `fn_extra`).
///
/// # Safety
/// `fcinfo` is a valid call's, with its `flinfo`.
unsafe fn owner_of_call(
    fcinfo: pg_sys::FunctionCallInfo,
    function: &'static str,
) -> Result<pg_sys::Oid, ErrorReport> {
    // SAFETY: the caller's promise: flinfo is the call site's FmgrInfo, valid for the call.
    let flinfo = unsafe { &mut *(*fcinfo).flinfo };
    if !flinfo.fn_extra.is_null() {
        // SAFETY: set below to a pg_sys::Oid allocated in fn_mcxt, which outlives this call.
        return Ok(unsafe { *flinfo.fn_extra.cast::<pg_sys::Oid>() });
    }
    let owner = backend::function_owner(flinfo.fn_oid)
        .ok_or_else(|| error::bug(function, "the function being called has no pg_proc row"))?;
    // SAFETY: an allocation of one Oid in the call site's own memory context, written before it is kept.
    unsafe {
        let kept = pg_sys::MemoryContextAlloc(flinfo.fn_mcxt, std::mem::size_of::<pg_sys::Oid>())
            .cast::<pg_sys::Oid>();
        kept.write(owner);
        flinfo.fn_extra = kept.cast();
    }
    Ok(owner)
}

extension_sql!(
    r#"
CREATE FUNCTION rate_limit."allow"(
	"policy" TEXT,
	"key" TEXT,
	"cost" INT DEFAULT 1
) RETURNS bool
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'allow_wrapper';
"#,
    name = "allow"
);
