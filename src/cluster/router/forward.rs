//! The router's forwarding of a call to one partition (its key's, or any): one C function,
//! `router_forward`, behind every forwarded function of the router whose call goes to one partition
//! (`rate_limit.take`, `rate_limiting_request`, …: `create_router` declares each with it). It arms the
//! router's deadline, calls the PL/Proxy function `rate_limit_router.NAME_remote` with the same arguments,
//! and clears the deadline; when the call fails it answers what [`classify`] says the failure was.
//!
//! Why C and not PL/pgSQL: a PL/pgSQL wrapper pays a function call of its own, its `EXCEPTION` block's
//! subtransaction and two more calls for the deadline on every call (the router's take ran at 0.65 of its
//! additive bound). Here a router that fails closed needs no subtransaction at all: a failure only becomes
//! another error, raised as the call ends. Only the calls a fail_open router may answer "allowed" run
//! in a subtransaction, which is rolled back when the partition cannot be reached, so that the
//! transaction goes on with the allowed answer.
//!
//! What each forwarded function is, it reads once per backend from `rate_limit_router.forwarded` (written
//! by `create_router`), as the table's owner: its PL/Proxy function, whether it may fail open, the
//! router's timeout, and where its policy is (for the allowed answer) and its keys are (`take_many`, which
//! must name keys of one partition). A new `create_router` makes new functions, with new oids: nothing
//! read here goes stale.

use std::cell::RefCell;
use std::collections::HashMap;

use pgrx::datum::{DatumWithOid, Interval};
use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self, PgTryBuilder};
use pgrx::prelude::*;
use pgrx::spi::Spi;
use pgrx::{FromDatum, IntoDatum, PgSqlErrorCode};

use super::deadline;
use super::failure::{answer, classify_caught, count_allowed, fails_closed, parts, Failure};
use crate::error;

/// What one forwarded function is (a row of `rate_limit_router.forwarded`, with its PL/Proxy function).
struct Forwarded {
    /// The PL/Proxy function, ready to call (allocated in TopMemoryContext: it lives as the backend).
    remote: *mut pg_sys::FmgrInfo,
    /// The router's timeout, in milliseconds.
    timeout_ms: i32,
    /// Whether a partition that cannot be reached makes the call "allowed" (a call that takes tokens, on a
    /// fail_open router).
    allow: bool,
    /// The argument (0-based) holding the policy named in an allowed answer, and whether it is an array of
    /// policies (the first is named); `None` for a call without one.
    policy_arg: Option<(usize, bool)>,
    /// The argument holding the keys that must all live on one partition (`take_many`), and the
    /// partitions' mask (their number less one).
    keys_arg: Option<(usize, i32)>,
}

thread_local! {
    /// The forwarded functions this backend called, by oid.
    static FORWARDED: RefCell<HashMap<pg_sys::Oid, &'static Forwarded>> = RefCell::new(HashMap::new());
}

/// The description of forwarded function `oid`: its row of `rate_limit_router.forwarded` and its PL/Proxy
/// function's oid, read as the table's owner (every name and operator qualified).
const DESCRIBE: &str = "SELECT f.timeout_ms, f.allow, f.policy_arg, f.policy_is_array, f.keys_arg, \
            f.partitions, r.oid \
     FROM pg_catalog.pg_proc AS p \
     JOIN rate_limit_router.forwarded AS f ON f.name OPERATOR(pg_catalog.=) p.proname::pg_catalog.text \
     JOIN pg_catalog.pg_proc AS r \
       ON r.pronamespace OPERATOR(pg_catalog.=) 'rate_limit_router'::pg_catalog.regnamespace \
      AND r.proname::pg_catalog.text OPERATOR(pg_catalog.=) (f.name OPERATOR(pg_catalog.||) '_remote') \
      AND r.proargtypes OPERATOR(pg_catalog.=) p.proargtypes \
     WHERE p.oid OPERATOR(pg_catalog.=) $1";

const F: &str = "rate_limit_router.forward";

/// The forwarded function `oid`, from this backend's memory or described once.
fn forwarded(oid: pg_sys::Oid) -> Result<&'static Forwarded, ErrorReport> {
    if let Some(f) = FORWARDED.with(|m| m.borrow().get(&oid).copied()) {
        return Ok(f);
    }
    let row = as_owner_of(oid, || {
        Spi::connect(|client| {
            let args: [DatumWithOid<'_>; 1] = [oid.into()];
            let table = client.select(DESCRIBE, Some(1), &args)?;
            if table.is_empty() {
                return Ok(None);
            }
            let r = table.first();
            Ok::<_, pgrx::spi::SpiError>(Some((
                r.get::<i32>(1)?.unwrap_or(2000),
                r.get::<bool>(2)?.unwrap_or(false),
                r.get::<i32>(3)?,
                r.get::<bool>(4)?.unwrap_or(false),
                r.get::<i32>(5)?,
                r.get::<i32>(6)?.unwrap_or(1),
                r.get::<pg_sys::Oid>(7)?,
            )))
        })
        .map_err(|e| error::internal(F, e))
    })?;
    let Some((
        timeout_ms,
        allow,
        policy_arg,
        policy_is_array,
        keys_arg,
        partitions,
        Some(remote_oid),
    )) = row
    else {
        return Err(error::bug(
            F,
            "a function forwards through the router, but rate_limit_router.forwarded does not describe it: \
             run rate_limit_router.create_router again",
        ));
    };
    let index = |arg: Option<i32>| arg.and_then(|a| usize::try_from(a - 1).ok());
    // SAFETY: a FmgrInfo allocated in TopMemoryContext (it lives as the backend, as this cache does) and
    // filled by fmgr_info_cxt for an existing function (the regprocedure cast found it).
    let remote = unsafe {
        let finfo = pg_sys::MemoryContextAllocZero(
            pg_sys::TopMemoryContext,
            std::mem::size_of::<pg_sys::FmgrInfo>(),
        )
        .cast::<pg_sys::FmgrInfo>();
        pg_sys::fmgr_info_cxt(remote_oid, finfo, pg_sys::TopMemoryContext);
        finfo
    };
    // Leaked on purpose: one small description per forwarded function this backend calls.
    let described: &'static Forwarded = Box::leak(Box::new(Forwarded {
        remote,
        timeout_ms: timeout_ms.max(1),
        allow,
        policy_arg: index(policy_arg).map(|i| (i, policy_is_array)),
        keys_arg: index(keys_arg).map(|i| (i, (partitions - 1).max(0))),
    }));
    FORWARDED.with(|m| m.borrow_mut().insert(oid, described));
    Ok(described)
}

/// Runs `read` as the owner of function `oid` (the router's owner), as PostgreSQL's referential-integrity
/// checks run their queries as a table's owner: the description is the owner's table.
fn as_owner_of<T>(
    oid: pg_sys::Oid,
    read: impl FnOnce() -> Result<T, ErrorReport>,
) -> Result<T, ErrorReport> {
    let owner = crate::backend::function_owner(oid)
        .ok_or_else(|| error::bug(F, "the forwarding function vanished"))?;
    crate::backend::as_user(owner, read)
}

/// The V1 calling-convention record of [`router_forward`].
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_router_forward() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// The forwarder: the C function behind every single-partition forwarding function of the router.
///
/// # Safety
/// Called by PostgreSQL with a valid `fcinfo` for one of the functions `create_router` declares with it.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn router_forward(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: PostgreSQL passes a valid fcinfo whose flinfo names this function.
    let oid = unsafe { (*(*fcinfo).flinfo).fn_oid };
    let result = forwarded(oid).and_then(|f| {
        // SAFETY: the caller's contract; `f` describes the function `fcinfo` calls.
        unsafe { forward(fcinfo, f) }
    });
    match result {
        Ok(datum) => datum,
        Err(e) => {
            e.report(PgLogLevel::ERROR);
            pg_sys::Datum::from(0)
        }
    }
}

/// Forwards the call in `fcinfo` to `f`'s PL/Proxy function under the router's deadline.
///
/// # Safety
/// `fcinfo` is a valid call of the function `f` describes.
unsafe fn forward(
    fcinfo: pg_sys::FunctionCallInfo,
    f: &'static Forwarded,
) -> Result<pg_sys::Datum, ErrorReport> {
    // SAFETY: the caller's contract.
    let args = unsafe { (*fcinfo).args.as_slice((*fcinfo).nargs as usize) };
    if let Some((i, mask)) = f.keys_arg {
        if let Some(arg) = args.get(i) {
            // SAFETY: argument `i` of this function is a text[] (take_many's keys), or NULL.
            unsafe { one_partition(arg, mask) }?;
        }
    }
    // SAFETY: a FunctionCallInfo for `nargs` arguments, allocated in the call's memory context, zeroed
    // and filled as InitFunctionCallInfoData does; the PL/Proxy function's FmgrInfo lives as the backend.
    let remote = unsafe {
        let nargs = (*fcinfo).nargs;
        let size = std::mem::offset_of!(pg_sys::FunctionCallInfoBaseData, args)
            + std::mem::size_of::<pg_sys::NullableDatum>() * nargs as usize;
        let call = pg_sys::palloc0(size).cast::<pg_sys::FunctionCallInfoBaseData>();
        (*call).flinfo = f.remote;
        (*call).fncollation = (*fcinfo).fncollation;
        (*call).nargs = nargs;
        let to = (*call).args.as_mut_slice(nargs as usize);
        to.copy_from_slice(args);
        call
    };
    if f.allow {
        // SAFETY: as above; `remote` is a valid call.
        return unsafe { forward_or_allow(fcinfo, f, remote) };
    }
    let outcome = PgTryBuilder::new(|| {
        deadline::arm(f.timeout_ms);
        // SAFETY: calls the PL/Proxy function through the FFI guard, which turns its error into a panic
        // that PgTryBuilder catches below.
        let datum = unsafe { call_remote(remote) };
        deadline::disarm();
        Ok(datum)
    })
    .catch_others(|caught| {
        deadline::disarm();
        Err(caught)
    })
    .execute();
    match outcome {
        // SAFETY: `remote` was called; its isnull says whether it returned NULL.
        Ok(datum) => unsafe {
            (*fcinfo).isnull = (*remote).isnull;
            Ok(datum)
        },
        Err(caught) => Err(fails_closed(caught)),
    }
}

/// [`forward`] for a call a fail_open router may answer "allowed": in a subtransaction, rolled back when
/// the partition cannot be reached, so that the transaction goes on with the allowed answer.
///
/// # Safety
/// As [`forward`]; `remote` is the call to make.
unsafe fn forward_or_allow(
    fcinfo: pg_sys::FunctionCallInfo,
    f: &'static Forwarded,
    remote: pg_sys::FunctionCallInfo,
) -> Result<pg_sys::Datum, ErrorReport> {
    // SAFETY: the pattern of PL/pgSQL's exception blocks (pl_exec.c): begin an internal subtransaction,
    // run in the caller's memory context, release it on success, roll it back on error, and restore the
    // caller's memory context and resource owner either way.
    unsafe {
        let context = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
        let outcome = PgTryBuilder::new(|| {
            deadline::arm(f.timeout_ms);
            let datum = call_remote(remote);
            deadline::disarm();
            Ok(datum)
        })
        .catch_others(Err)
        .execute();
        match outcome {
            Ok(datum) => {
                pg_sys::ReleaseCurrentSubTransaction();
                pg_sys::MemoryContextSwitchTo(context);
                pg_sys::CurrentResourceOwner = owner;
                (*fcinfo).isnull = (*remote).isnull;
                Ok(datum)
            }
            Err(caught) => {
                pg_sys::MemoryContextSwitchTo(context);
                pg_sys::RollbackAndReleaseCurrentSubTransaction();
                pg_sys::CurrentResourceOwner = owner;
                match classify_caught(&caught) {
                    Failure::Unreachable | Failure::Late => {}
                    Failure::Other => caught.rethrow(),
                    failure => return Err(answer(failure, parts(&caught).1, true)),
                }
                count_allowed(F)?;
                allowed_answer(fcinfo, f)
            }
        }
    }
}

/// Calls the PL/Proxy function through pgrx's FFI guard (its ERROR becomes a Rust panic).
///
/// # Safety
/// `remote` is a valid call whose flinfo is a filled FmgrInfo.
unsafe fn call_remote(remote: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the caller's contract; fmgr_info_cxt always sets fn_addr.
    unsafe {
        let address = (*(*remote).flinfo).fn_addr;
        pg_sys::ffi::pg_guard_ffi_boundary(|| match address {
            Some(call) => call(remote),
            None => pg_sys::Datum::from(0),
        })
    }
}

/// 0A000 unless every key of `arg` (a text[]) lives on one partition: `hashtext(key) & mask` is the same
/// for all (PL/Proxy's mapping of the first key, which routes the call).
///
/// # Safety
/// `arg` is a text[] argument, or NULL.
unsafe fn one_partition(arg: &pg_sys::NullableDatum, mask: i32) -> Result<(), ErrorReport> {
    // SAFETY: the caller's contract: a text[] datum when not NULL.
    let keys = unsafe { Vec::<Option<String>>::from_datum(arg.value, arg.isnull) };
    let Some(keys) = keys else { return Ok(()) };
    let partitions: Vec<i32> = keys.iter().flatten().map(|k| hash_text(k) & mask).collect();
    if partitions.windows(2).all(|w| w[0] == w[1]) {
        return Ok(());
    }
    Err(ErrorReport::new(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        "rate_limit.take_many: these keys live on different partitions",
        "rate_limit.take_many",
    )
    .set_hint(
        "Behind a PL/Proxy router take_many is all or nothing only for keys of one partition; take them \
         one by one, or route by one key for all (keys => ARRAY[one key]).",
    ))
}

extern "C-unwind" {
    /// PostgreSQL's `hash_bytes` (common/hashfn.c, PostgreSQL 12 and later): what `hashtext` computes for a
    /// deterministic collation.
    fn hash_bytes(k: *const u8, keylen: std::ffi::c_int) -> u32;
}

/// `hashtext(key)`, as PL/Proxy's routing computes it (the default collation, deterministic: the hash of
/// the text's bytes).
fn hash_text(key: &str) -> i32 {
    let len = std::ffi::c_int::try_from(key.len()).unwrap_or(std::ffi::c_int::MAX);
    // SAFETY: reads `len` bytes of `key`, which has at least that many; pure arithmetic.
    unsafe { hash_bytes(key.as_ptr(), len) as i32 }
}

/// The answer of a call allowed while its partition could not be reached: 0 for `rate_limiting_request`;
/// for a decision, allowed, `retry_after` 0, the call's policy (the first of `take_many`'s), the rest
/// NULL (nothing is known of the bucket).
///
/// # Safety
/// `fcinfo` is the call `f` describes.
unsafe fn allowed_answer(
    fcinfo: pg_sys::FunctionCallInfo,
    f: &'static Forwarded,
) -> Result<pg_sys::Datum, ErrorReport> {
    // SAFETY: the caller's contract: flinfo names the forwarding function.
    let result_type = unsafe { pg_sys::get_func_rettype((*(*fcinfo).flinfo).fn_oid) };
    if result_type == pg_sys::INT4OID {
        return Ok(pg_sys::Datum::from(0i32));
    }
    let policy: Option<String> = match f.policy_arg {
        None => None,
        // SAFETY: the argument is a text (or a text[] of policies) as the description says.
        Some((i, is_array)) => unsafe {
            let arg = (*fcinfo).args.as_slice((*fcinfo).nargs as usize)[i];
            if is_array {
                Vec::<Option<String>>::from_datum(arg.value, arg.isnull)
                    .and_then(|v| v.into_iter().next().flatten())
            } else {
                String::from_datum(arg.value, arg.isnull)
            }
        },
    };
    let mut decision = PgHeapTuple::new_composite_type("rate_limit.decision")
        .map_err(|e| error::bug(F, &e.to_string()))?;
    let set = |d: &mut PgHeapTuple<'_, pgrx::AllocatedByRust>| -> Result<(), pgrx::datum::TryFromDatumError> {
        d.set_by_name("allowed", true)?;
        d.set_by_name("retry_after", Interval::from_micros(0))?;
        if let Some(p) = &policy {
            d.set_by_name("policy", p.as_str())?;
        }
        d.set_by_name("shadow_denied", false)
    };
    set(&mut decision).map_err(|e| error::bug(F, &e.to_string()))?;
    decision
        .into_datum()
        .ok_or_else(|| error::bug(F, "the allowed answer made no datum"))
}
