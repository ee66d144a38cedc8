//! The one module that enforces the bounds of what a caller can make the server hold (the table of them,
//! printed in `docs/security.md`, is [`rate_limit_model::bounds::BOUNDS`]):
//!
//! - [`caller_limit`]: a limit a caller chooses (ad-hoc, `rate_limiting_request`) refills within
//!   `rate_limit.max_refill_time`, so every bucket it makes is purged soon after its last call;
//! - [`policy`]: a named policy's buckets are full again within `rate_limit.max_policy_refill_time` of any
//!   role's last call, however deep its debt or long its penalty box's block (checked when the owner
//!   creates or changes it: the owner raises the setting knowingly for a policy that needs longer);
//! - [`wait_deadline`]: `rate_limit.wait` sleeps at most `rate_limit.max_wait` per statement;
//! - [`batch_size`]: a `take_batch` names at most [`MAX_BATCH`] keys, and [`batch_result_kb`] keeps at
//!   most [`MAX_BATCH_RESULT_KB`] (or `work_mem`, if larger) of its result rows in memory.
//!
//! Every kind of limit goes through [`policy`] (named) or [`caller_limit`] (ad hoc): the model's
//! [`Policy::longest_short_us`] matches every algorithm, so a new kind cannot compile without saying how
//! long its buckets stay short.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::error;
use crate::gucs;
use crate::time::clock;
use rate_limit_model::algorithm::Policy;
use rate_limit_model::target::Blocking;

/// Checks that a limit the caller chose (ad-hoc, or `rate_limiting_request`'s) refills within
/// `rate_limit.max_refill_time` when a call may create its bucket (`cost > 0`); roles with the privileges
/// of the extension's owner are not bounded, like the named policies they make. A bucket that takes years
/// to refill could never be purged: one role could fill the store with buckets nobody can delete.
/// The owner is looked up only for a limit over the bound, so the common call pays one comparison.
pub fn caller_limit(function: &'static str, policy: &Policy, cost: i64) -> Result<(), ErrorReport> {
    if cost == 0 {
        return Ok(());
    }
    // the model's own answer: how long a bucket emptied now takes to be full again
    let refill_us = policy.take(policy.full(0), 0, policy.burst()).reset_after;
    let max_us = gucs::max_refill_time_us();
    if refill_us <= max_us || caller_has_owner_privileges(function)? {
        return Ok(());
    }
    Err(ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!(
            "this limit takes {} s to refill from empty; rate_limit.max_refill_time allows {} s",
            refill_us.saturating_add(999_999) / 1_000_000,
            max_us / 1_000_000
        ),
        function,
    )
    .set_detail(
        "Only the extension's owner may make buckets that refill more slowly, as named policies.",
    )
    .set_hint(
        "Use a higher rate or a smaller burst, or ask the extension's owner for a named policy \
         (rate_limit.create_policy), which rate_limit.take uses without this bound.",
    ))
}

/// Whether the role running the statement (outside any SECURITY DEFINER function) has the privileges of
/// the extension's owner.
fn caller_has_owner_privileges(function: &'static str) -> Result<bool, ErrorReport> {
    // read-only (Spi::get_one would take a transaction id: refused on a hot standby)
    let owner = Spi::connect(|client| {
        client
            .select(
                "SELECT extowner FROM pg_catalog.pg_extension \
                 WHERE extname OPERATOR(pg_catalog.=) 'rate_limit'",
                Some(1),
                &[],
            )?
            .first()
            .get::<pg_sys::Oid>(1)
    })
    .map_err(|e| error::internal(function, e))?;
    let Some(owner) = owner else {
        return Ok(false);
    };
    // SAFETY: GetOuterUserId reads a backend global; has_privs_of_role reads the catalog caches, valid
    // inside the transaction this SQL function runs in.
    Ok(unsafe { pg_sys::has_privs_of_role(pg_sys::GetOuterUserId(), owner) })
}

/// Checks that the buckets of a named policy (with `max_debt` and its penalty box) are full again within
/// `rate_limit.max_policy_refill_time` of any role's last call: emptied and charged to the deepest debt,
/// or blocked by the penalty box. 22023 otherwise, naming how long and the setting; the superuser raises the
/// setting for a policy that needs longer (a yearly quota fits the default, 400 days). Blocks by hand are
/// the owner's, bounded only by [`rate_limit_model::algorithm::MAX_BLOCK_US`].
pub fn policy(
    function: &'static str,
    numbers: &Policy,
    max_debt: i64,
    blocking: &Blocking,
) -> Result<(), ErrorReport> {
    let longest = numbers
        .longest_short_us(max_debt)
        .max(blocking.penalty_for.unwrap_or(0));
    let max_us = gucs::max_policy_refill_time_us();
    if longest <= max_us {
        return Ok(());
    }
    let what = if blocking.penalty_for.is_some_and(|b| b == longest) {
        "its penalty box blocks a key"
    } else if max_debt > 0 {
        "a bucket emptied and charged to max_debt refills"
    } else {
        "a bucket emptied refills"
    };
    Err(ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!(
            "{what} in {} s; rate_limit.max_policy_refill_time allows {} s",
            longest.saturating_add(999_999) / 1_000_000,
            max_us / 1_000_000
        ),
        function,
    )
    .set_detail(
        "Any role that may call the policy can leave its buckets short for that long, and the purge \
         deletes a bucket only once it is full again.",
    )
    .set_hint(
        "Lower max_debt, block_for or the window, or have a superuser raise \
         rate_limit.max_policy_refill_time.",
    ))
}

/// The instant (on [`clock::now_us`]) past which a `wait` of `timeout_us` must not sleep: `timeout_us`
/// from now, and never more than `rate_limit.max_wait` after the statement holding the caller's snapshot
/// started, however many waits it chains (a join, a PL/pgSQL loop).
pub fn wait_deadline(timeout_us: i64) -> i64 {
    clock::now_us()
        .saturating_add(timeout_us)
        .min(statement_started_us().saturating_add(gucs::max_wait_us()))
}

/// When the statement that holds the caller's snapshot started: the later of the statement's start and its
/// transaction's (a procedure that commits starts a new transaction, and a new snapshot, mid-statement).
fn statement_started_us() -> i64 {
    // SAFETY: both read timestamps PostgreSQL keeps for the current statement and transaction; they have no
    // preconditions inside a function call, which always runs in a transaction.
    unsafe {
        pg_sys::GetCurrentStatementStartTimestamp()
            .max(pg_sys::GetCurrentTransactionStartTimestamp())
    }
}

/// The most keys one `take_batch` may name: its keys and outcomes stay in the caller's memory until the
/// rows are returned (about 150 bytes a key besides its text, 150 MB at this bound); a larger job is
/// several batches.
pub const MAX_BATCH: usize = 1_000_000;

/// 22023 unless a batch of `keys` keys is within [`MAX_BATCH`].
pub fn batch_size(function: &'static str, keys: usize) -> Result<(), ErrorReport> {
    if keys > MAX_BATCH {
        return Err(error::invalid_value(
            function,
            format!("keys holds {keys} keys, more than {MAX_BATCH}"),
            &format!("Split the job into batches of at most {MAX_BATCH} keys."),
        ));
    }
    Ok(())
}

/// The most memory a batch's result rows take before they spill to a temporary file, when that is more
/// than `work_mem`: 64 MB, about 350 000 rows of 50-byte keys.
pub const MAX_BATCH_RESULT_KB: usize = 64 * 1024;

/// Kilobytes of memory for the result rows of a batch over `keys`: enough for all of them (about 128
/// bytes a row besides its key), at least `work_mem` and at most [`MAX_BATCH_RESULT_KB`] (or `work_mem` if
/// larger). A batch's keys are in memory already; its rows stay there too instead of going through a file.
pub fn batch_result_kb(keys: &[&str]) -> i32 {
    let bytes: usize = keys.iter().map(|k| 128 + k.len()).sum();
    // SAFETY: work_mem is a plain GUC variable of the backend, read on its only thread.
    let work_mem = unsafe { pg_sys::work_mem };
    let wanted = (bytes / 1024 + 1).min(MAX_BATCH_RESULT_KB);
    i32::try_from(wanted).map_or(work_mem, |kb| kb.max(work_mem))
}
