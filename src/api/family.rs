//! The buckets a call on a named policy takes from: the policy's own bucket of the key and, for a child
//! (option `parent`, [`crate::policies::family`]), its parent's bucket of the same key, all or nothing.
//! The decision then names whichever of them decided, and reports the tighter of the two.

use std::rc::Rc;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

use super::{policy_arg, policy_target};
use crate::error;
use crate::policies::Named;
use rate_limit_model::algorithm::Outcome;
use rate_limit_model::pipeline::PerTarget;
use rate_limit_model::target::{Target, MAX_TARGETS};

/// The parent of `named`, if it has one, from the policy cache: 42704 when the parent it names no longer
/// exists, 42809 when it limits leases (both only if the table was written around `alter_policy`).
pub fn parent_of(function: &'static str, named: &Named) -> Result<Option<Rc<Named>>, ErrorReport> {
    named
        .row
        .parent
        .as_deref()
        .map(|parent| policy_arg(function, Some(parent)))
        .transpose()
}

/// The buckets of `key` that a call on `named` (with `parent`, [`parent_of`]) takes from: its own
/// first, then its parent's. Inline: a call allocates nothing for them.
pub fn family_targets<'a>(
    function: &'static str,
    named: &'a Named,
    parent: Option<&'a Named>,
    key: &'a str,
) -> Result<PerTarget<Target<'a>>, ErrorReport> {
    let mut targets = PerTarget::new();
    targets.push(policy_target(function, named, key)?);
    if let Some(parent) = parent {
        targets.push(policy_target(function, parent, key)?);
    }
    Ok(targets)
}

/// `named` (the policies of one call, in order) followed by the parent of each that has one, and
/// `tokens` (one per policy) followed by each parent's: its child's. A parent also named, or the parent
/// of two of them, is then named twice, which the call refuses ([`super::limits::each_bucket_once`]).
pub fn with_parents(
    function: &'static str,
    mut named: Vec<Rc<Named>>,
    mut tokens: Vec<i64>,
) -> Result<(Vec<Rc<Named>>, Vec<i64>), ErrorReport> {
    for i in 0..named.len() {
        if let Some(parent) = parent_of(function, &named[i])? {
            named.push(parent);
            tokens.push(tokens[i]);
        }
    }
    if named.len() > MAX_TARGETS {
        return Err(too_many_buckets(function, named.len()));
    }
    Ok((named, tokens))
}

/// 22023: a call's policies and their parents name `count` buckets, more than
/// [`MAX_TARGETS`].
pub fn too_many_buckets(function: &'static str, count: usize) -> ErrorReport {
    error::invalid_value(
        function,
        format!("the policies of one call and their parents must name at most {MAX_TARGETS} buckets, got {count}"),
        "Split the limits over several calls: a call on a child also takes from its parent's bucket.",
    )
}

/// 0A000 for a call that does not take from a parent's bucket (yet) on a child policy: `call` names it.
pub fn no_parent(function: &'static str, named: &Named, call: &str) -> Result<(), ErrorReport> {
    let Some(parent) = named.row.parent.as_deref() else {
        return Ok(());
    };
    Err(ErrorReport::new(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!(
            "{call} does not take from a parent's bucket: policy {} has parent {}",
            error::quoted(&named.name),
            error::quoted(parent)
        ),
        function,
    )
    .set_hint("Call rate_limit.take (or take_many, reserve, charge) on a child policy, or give it no parent."))
}

/// The order a call over several limits settles them in: its policies' buckets' (namespace, key) order
/// (one key: their namespaces'), the order every call locks buckets in.
pub fn lock_order(targets: &[Target<'_>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..targets.len()).collect();
    order.sort_by(|&a, &b| {
        targets[a]
            .namespace
            .stored_name()
            .as_bytes()
            .cmp(targets[b].namespace.stored_name().as_bytes())
    });
    order
}

/// Runs `write` on each of `targets` (its index, the target) in the lock order ([`lock_order`]): their
/// outcomes, in `targets`' order. A call that writes several buckets one by one (a charge, a refund)
/// locks them as every other call does.
pub fn in_lock_order(
    targets: &[Target<'_>],
    mut write: impl FnMut(usize, &Target<'_>) -> Result<Outcome, ErrorReport>,
) -> Result<Vec<Outcome>, ErrorReport> {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; targets.len()];
    for i in lock_order(targets) {
        outcomes[i] = Some(write(i, &targets[i])?);
    }
    Ok(outcomes.into_iter().flatten().collect())
}
