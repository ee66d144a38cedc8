//! Blocks by hand: `block` denies a key of a policy outright for a while, `unblock` lifts it (owner only:
//! a block denies a key that may belong to anyone). Blocks by the penalty box (`create_policy(...,
//! block_after, block_for)`) need no call. See [`rate_limit_model::algorithm::block`] and [`crate::store::block`].

use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use super::{any_policy_arg, combine, key_arg, store_of, to_row, with_override};
use crate::cluster;
use crate::error;
use crate::gucs::Store;
use crate::policies;
use crate::store;
use rate_limit_model::algorithm::Outcome;
use rate_limit_model::target::{Namespace, Target};

/// Blocks by hand, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Blocks `key` under `policy` for `duration` from now, replacing any block it had: until then every
    /// call on that key and policy is denied without touching its bucket, with `retry_after` the time left.
    /// Returns the decision such a call gets now.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn block(
        policy: Option<&str>,
        key: Option<&str>,
        duration: Option<Interval>,
    ) -> Result<pgrx::composite_type!('static, "rate_limit.decision"), ErrorReport> {
        const F: &str = "rate_limit.block";
        let named = any_policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let duration = duration.ok_or_else(|| {
            error::null_argument(
                F,
                "duration",
                "Pass how long to block the key, e.g. interval '1 hour'; rate_limit.unblock lifts it.",
            )
        })?;
        let duration = policies::block_duration_us(F, "duration", duration)?;
        let t = with_override(&named, key, None);
        let store = store_of(Some(&named));
        let blocked = store::block(F, store, &t, duration)?;
        note_block_by_hand(F, store, &t)?;
        // what a call on the key is told from now on
        let reported = Outcome {
            allowed: false,
            ..blocked
        };
        to_row(F, &combine(&[t], &[reported]))
    }

    /// Lifts the block of `key` under `policy` and forgets the denials its penalty box counted: true if the
    /// key was blocked.
    #[pg_extern(volatile, parallel_unsafe, security_definer)]
    fn unblock(policy: Option<&str>, key: Option<&str>) -> Result<bool, ErrorReport> {
        const F: &str = "rate_limit.unblock";
        let named = any_policy_arg(F, policy)?;
        let key = key_arg(F, "key", key)?;
        let t = with_override(&named, key, None);
        store::unblock(F, store_of(Some(&named)), &t)
    }
}

/// Notes in the row of the policy of `target`, in the caller's transaction as the block itself, that a key
/// of it was blocked by hand in the table store, so that every call on the policy reads its key's block
/// from now on (the memory store notes it in its own memory, at once: a note in the row would be undone
/// by a ROLLBACK that leaves the block in place). Not under Citus, where a block by hand is delegated to
/// its key's node, which cannot write the policies (a reference table) there: every call reads its key's
/// block then.
fn note_block_by_hand(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
) -> Result<(), ErrorReport> {
    let noted = target.blocking.is_some_and(|b| b.blocks_by_hand);
    match target.namespace {
        Namespace::Policy { name, .. }
            if store == Store::Table && !noted && !cluster::citus::citus_installed() =>
        {
            policies::row::mark_blocked_by_hand(function, name)
        }
        _ => Ok(()),
    }
}
