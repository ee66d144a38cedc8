//! How a forwarded call failed, and what the router answers for it: PL/Proxy's own errors (a connection
//! it could not open, one that broke), the router's deadline, and a partition's errors (its own lock or
//! statement timeout) told apart by their messages and SQLSTATEs; one classification for the forwarder
//! ([`super::forward`]) and for the router's PL/pgSQL functions (`rate_limit_router.forwarding_failed`).

use pgrx::pg_sys::panic::{CaughtError, ErrorReport};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

use super::deadline;
use crate::error;

/// The function named in the router's answers.
const F: &str = "rate_limit_router.forward";

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
pub(super) fn classify_caught(caught: &CaughtError) -> Failure {
    let (code, message) = parts(caught);
    classify(&message, &code, deadline::passed())
}

/// The SQLSTATE and message of a caught error.
pub(super) fn parts(caught: &CaughtError) -> (String, String) {
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
pub(super) fn fails_closed(caught: CaughtError) -> ErrorReport {
    match classify_caught(&caught) {
        Failure::Other => caught.rethrow(),
        failure => answer(failure, parts(&caught).1, false),
    }
}

/// The error `failure` (whose message was `message`) is answered with (`allow`: the router fails open for
/// this call).
pub(super) fn answer(failure: Failure, message: String, allow: bool) -> ErrorReport {
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
        return count_allowed(G);
    }
    if failure == Failure::Other {
        let code = packed(state).unwrap_or(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR);
        return Err(ErrorReport::new(code, message.to_string(), G));
    }
    Err(answer(failure, message.to_string(), allow.unwrap_or(false)))
}

/// Counts one call allowed while its partition could not be reached (`nextval` of the router's sequence,
/// which every role may advance).
pub(super) fn count_allowed(function: &'static str) -> Result<(), ErrorReport> {
    // SAFETY: catalog-cache lookups by name (InvalidOid when missing), then nextval_oid, a plain V1
    // function of one regclass argument, which checks the caller's USAGE on the sequence itself.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"rate_limit_router".as_ptr(), true);
        let sequence = pg_sys::get_relname_relid(c"allowed_while_down".as_ptr(), schema);
        if schema == pg_sys::InvalidOid || sequence == pg_sys::InvalidOid {
            return Err(error::bug(
                function,
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
