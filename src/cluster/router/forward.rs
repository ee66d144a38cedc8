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
use pgrx::pg_sys::panic::{CaughtError, ErrorReport};
use pgrx::pg_sys::{self, PgTryBuilder};
use pgrx::prelude::*;
use pgrx::spi::Spi;
use pgrx::{FromDatum, IntoDatum, PgSqlErrorCode};

use super::deadline;
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
    // SAFETY: a catalog-cache lookup of the function by oid; its owner is read while the tuple is held.
    let owner = unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            pg_sys::Datum::from(oid),
        );
        if tuple.is_null() {
            return Err(error::bug(F, "the forwarding function vanished"));
        }
        let owner = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tuple)).proowner;
        pg_sys::ReleaseSysCache(tuple);
        owner
    };
    let (mut user, mut context) = (pg_sys::InvalidOid, 0);
    // SAFETY: as ri_triggers.c does around its queries; an error inside `read` aborts the transaction,
    // which restores both, and on return they are restored here.
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
                count_allowed()?;
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

/// What a forwarded call's failure was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The partition could not be reached: no connection could be opened. With [`Failure::Late`], the only
    /// failures a fail_open router answers "allowed".
    Unreachable,
    /// The partition did not answer before the router's deadline passed.
    Late,
    /// The partition answered the connection with an error of its own: it is up.
    Refused,
    /// A connection that was open broke during the call.
    Lost,
    /// The partition gave the call up at its own lock timeout: the key's row is held there.
    HeldKey,
    /// The partition gave the call up at its own statement timeout.
    TooSlow,
    /// Anything else: raised again as it was.
    Other,
}

/// What a failure with `message` and SQLSTATE `state` was (PL/Proxy's messages: `PL/Proxy function
/// NAME(N): [DB] PQconnectPoll: …` for its own, `NAME(N): [DB] REMOTE ERROR: …` for a partition's);
/// `late` when the router's deadline has passed.
pub fn classify(message: &str, state: &str, late: bool) -> Failure {
    let remote = remote_error(message);
    if state == "55P03" && !remote && message == "canceling statement due to lock timeout" && late {
        return Failure::Late;
    }
    if remote {
        return match state {
            "55P03" => Failure::HeldKey,
            "57014" => Failure::TooSlow,
            _ => Failure::Other,
        };
    }
    let Some(what) = state.eq("XX000").then(|| plproxy_own(message)).flatten() else {
        return Failure::Other;
    };
    let after_db = what
        .strip_prefix('[')
        .and_then(|w| w.split_once("] "))
        .map(|(_, rest)| rest);
    let step = |names: &[&str]| {
        after_db.is_some_and(|rest| names.iter().any(|n| rest.starts_with(&format!("{n}: "))))
    };
    if step(&["PQconnectStart", "PQconnectPoll"]) || what.starts_with("connect timeout to: ") {
        if message.contains("FATAL: ") || message.contains("ERROR: ") {
            return Failure::Refused;
        }
        return Failure::Unreachable;
    }
    if step(&[
        "PQconsumeInput",
        "PQsendQuery",
        "PQsendQueryParams",
        "PQflush",
    ]) || what.starts_with("check_old_conn: ")
        || what.starts_with("poll() failed: ")
    {
        return Failure::Lost;
    }
    Failure::Other
}

/// Whether `message` is a partition's error as PL/Proxy relays it: `NAME(N): [DB] REMOTE …`, NAME without
/// spaces.
fn remote_error(message: &str) -> bool {
    let Some((name, rest)) = message.split_once("): [") else {
        return false;
    };
    let args_ok = name.rsplit_once('(').is_some_and(|(n, count)| {
        !n.is_empty()
            && !n.contains(' ')
            && count.bytes().all(|b| b.is_ascii_digit())
            && !count.is_empty()
    });
    args_ok
        && rest
            .split_once("] ")
            .is_some_and(|(_, after)| after.starts_with("REMOTE "))
}

/// The text after `PL/Proxy function NAME(N): ` of one of PL/Proxy's own errors.
fn plproxy_own(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("PL/Proxy function ")?;
    let (name, after) = rest.split_once("): ")?;
    (!name.contains(' ')).then_some(after)
}

/// The failure `caught` was.
fn classify_caught(caught: &CaughtError) -> Failure {
    let (code, message) = parts(caught);
    classify(&message, &code, deadline::passed())
}

/// The SQLSTATE and message of a caught error.
fn parts(caught: &CaughtError) -> (String, String) {
    let e = match caught {
        CaughtError::PostgresError(e) | CaughtError::ErrorReport(e) => e,
        CaughtError::RustPanic { ereport, .. } => ereport,
    };
    (sqlstate(e.sql_error_code()), e.message().to_string())
}

/// The five characters of a SQLSTATE (PostgreSQL's `unpack_sql_state`).
fn sqlstate(code: PgSqlErrorCode) -> String {
    let mut packed = code as i64;
    (0..5)
        .map(|_| {
            let c = char::from(b'0' + (packed & 0x3f) as u8);
            packed >>= 6;
            c
        })
        .collect()
}

/// The error a fail_closed call's failure becomes; any failure but the partition's is raised again as it
/// was.
fn fails_closed(caught: CaughtError) -> ErrorReport {
    match classify_caught(&caught) {
        Failure::Other => caught.rethrow(),
        failure => answer(failure, parts(&caught).1, false),
    }
}

/// The error `failure` (whose message was `message`) is answered with (`allow`: the router fails open for
/// this call).
fn answer(failure: Failure, message: String, allow: bool) -> ErrorReport {
    let report = |code, text: &str, detail: String, hint: String| {
        ErrorReport::new(code, text.to_string(), F)
            .set_detail(detail)
            .set_hint(hint)
    };
    match failure {
        Failure::Unreachable => report(
            PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
            "rate_limit: a partition this call needs is down",
            message,
            format!(
                "Nothing was granted, denied or changed on it: it was not reached. This router {} \
                 (docs/scaling.md#plproxy).",
                if allow { "fails open only for calls that take" } else { "fails closed" }
            ),
        ),
        Failure::Late => report(
            PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
            "rate_limit: a partition this call needs did not answer within the router's timeout",
            "rate_limit_router.settings.timeout passed".to_string(),
            "A call the partition had begun ends there at its own statement timeout, shorter than the \
             router's, and applies nothing; one it had not begun when it stopped answering may still run \
             when it comes back: a token may be spent that nobody was told of, never one granted twice \
             (docs/scaling.md#plproxy)."
                .to_string(),
        ),
        Failure::Refused => report(
            PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
            "rate_limit: a partition this call needs refused the connection",
            message,
            "Nothing was granted, denied or changed on it. The partition is up and refused this role's \
             connection: the role must exist there, with CONNECT; a refusal is never answered \"allowed\" \
             (docs/scaling.md#plproxy)."
                .to_string(),
        ),
        Failure::Lost => report(
            PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
            "rate_limit: the connection to a partition this call needs broke",
            message,
            "The partition may have applied the call before the connection broke: retrying may take a \
             token twice, never grant one twice (docs/scaling.md#plproxy)."
                .to_string(),
        ),
        Failure::HeldKey => report(
            PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
            "rate_limit: the bucket of this key is held by another transaction on its partition",
            message,
            "Nothing was granted, denied or changed: the partition gave the call up at its lock timeout, \
             half the router's. Retry; a transaction left open on the partition holds the key until it \
             ends."
                .to_string(),
        ),
        Failure::TooSlow => report(
            PgSqlErrorCode::ERRCODE_QUERY_CANCELED,
            "rate_limit: the partition of this key did not finish the call within its statement timeout",
            message,
            "Nothing was granted, denied or changed: the partition gave the call up at its own timeout, \
             three quarters of the router's. Retry, or give the router a longer timeout."
                .to_string(),
        ),
        Failure::Other => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            message,
            F,
        ),
    }
}

/// Counts one call allowed while its partition could not be reached (`nextval` of the router's sequence,
/// which every role may advance).
fn count_allowed() -> Result<(), ErrorReport> {
    // SAFETY: catalog-cache lookups by name (InvalidOid when missing), then nextval_oid, a plain V1
    // function of one regclass argument, which checks the caller's USAGE on the sequence itself.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"rate_limit_router".as_ptr(), true);
        let sequence = pg_sys::get_relname_relid(c"allowed_while_down".as_ptr(), schema);
        if schema == pg_sys::InvalidOid || sequence == pg_sys::InvalidOid {
            return Err(error::bug(
                F,
                "rate_limit_router.allowed_while_down is missing",
            ));
        }
        pgrx::direct_function_call::<i64>(
            pg_sys::nextval_oid,
            &[Some(pg_sys::Datum::from(sequence))],
        );
    }
    Ok(())
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

/// The packed code of the five-character SQLSTATE `state` (PostgreSQL's `MAKE_SQLSTATE`); `None` for a
/// string that is not one.
fn packed(state: &str) -> Option<PgSqlErrorCode> {
    let bytes = state.as_bytes();
    if bytes.len() != 5
        || !bytes
            .iter()
            .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
    {
        return None;
    }
    let code = bytes.iter().rev().fold(0i32, |acc, &b| {
        (acc << 6) | i32::from(b.wrapping_sub(b'0') & 0x3f)
    });
    Some(PgSqlErrorCode::from(code))
}

/// What a forwarded call that failed with `message` and `state` becomes, for the router's PL/pgSQL
/// functions (the merged views and the calls sent to every partition), as [`router_forward`] decides it:
/// returns only when the call is to be answered "allowed" (`allow`: a call that takes, on a fail_open
/// router), having counted it; raises the answer otherwise (a failure that is not the partition's, as it
/// was).
#[pg_extern(sql = false)]
fn router_forwarding_failed(
    message: Option<&str>,
    state: Option<&str>,
    allow: Option<bool>,
) -> Result<(), ErrorReport> {
    const G: &str = "rate_limit_router.forwarding_failed";
    let (message, state) = (message.unwrap_or_default(), state.unwrap_or_default());
    let failure = classify(message, state, deadline::passed());
    if matches!(failure, Failure::Unreachable | Failure::Late) && allow.unwrap_or(false) {
        return count_allowed();
    }
    if failure == Failure::Other {
        let code = packed(state).unwrap_or(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR);
        return Err(ErrorReport::new(code, message.to_string(), G));
    }
    Err(answer(failure, message.to_string(), allow.unwrap_or(false)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_told_apart_by_plproxys_messages() {
        let own =
            |what: &str| format!("PL/Proxy function rate_limit_router.take_remote(3): {what}");
        let cases = [
            (own("[app] PQconnectPoll: connection to server failed: Connection refused"), "XX000", false, Failure::Unreachable),
            (own("connect timeout to: host=db0"), "XX000", false, Failure::Unreachable),
            (own("[app] PQconnectPoll: connection to server at \"db0\" failed: FATAL:  role \"x\" does not exist"), "XX000", false, Failure::Refused),
            (own("[app] PQconsumeInput: server closed the connection unexpectedly"), "XX000", false, Failure::Lost),
            (own("check_old_conn: select failed: x"), "XX000", false, Failure::Lost),
            ("canceling statement due to lock timeout".to_string(), "55P03", true, Failure::Late),
            // the caller's own lock timeout, before the router's deadline
            ("canceling statement due to lock timeout".to_string(), "55P03", false, Failure::Other),
            ("rate_limit_router.take_remote(3): [app] REMOTE ERROR: canceling statement due to lock timeout".to_string(), "55P03", true, Failure::HeldKey),
            ("rate_limit_router.take_remote(3): [app] REMOTE ERROR: canceling statement due to statement timeout".to_string(), "57014", false, Failure::TooSlow),
            ("rate_limit_router.take_remote(3): [app] REMOTE ERROR: rate limit policy \"x\" does not exist".to_string(), "42704", false, Failure::Other),
            // a partition's error that reads like PL/Proxy's own is still the partition's
            ("rate_limit_router.take_remote(3): [app] REMOTE ERROR: PL/Proxy function f(1): [x] PQconnectPoll: no".to_string(), "XX000", false, Failure::Other),
            ("division by zero".to_string(), "22012", true, Failure::Other),
        ];
        for (message, state, late, want) in cases {
            assert_eq!(classify(&message, state, late), want, "{message}");
        }
    }

    #[test]
    fn sqlstates_pack_and_unpack() {
        for state in ["55P03", "08006", "XX000", "22023", "57014"] {
            let code = packed(state).expect("a SQLSTATE");
            assert_eq!(sqlstate(code), state);
        }
        assert_eq!(packed("5"), None);
        assert_eq!(packed("55p03"), None);
    }
}
