//! The memory store's settles, applied when the caller's transaction commits. A table-store settle
//! writes rows in the caller's transaction, so a ROLLBACK undoes it; the memory store is not
//! transactional, so its settles wait here, in this backend, until the transaction ends: applied at
//! `COMMIT` (each as [`super::settle`] of the table store would be, through the model's pipeline), dropped
//! at `ROLLBACK`, and those of a subtransaction dropped at its `ROLLBACK TO SAVEPOINT`. `PREPARE
//! TRANSACTION` is refused while any waits (0A000): a prepared transaction's fate is decided in another
//! session, which this backend's memory does not reach.
//!
//! What is lost: a settle is applied after the transaction's commit record, when nothing may raise an
//! error any more; a settle the memory store then cannot apply (its memory full when a charge must create
//! the key's bucket) is logged as a WARNING and not applied, so its reservation expires at its estimate.
//! A backend that dies between its commit and the apply (a crash) loses its settles the same way; a crash
//! of the server loses the memory store itself.

use std::cell::RefCell;

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;

use super::buckets::MemoryBuckets;
use super::{remember, Seam};
use crate::gucs::Store;
use rate_limit_model::algorithm::Policy;
use rate_limit_model::pipeline;
use rate_limit_model::target::{Blocking, Namespace, Target, Verdict};

/// One settle waiting for its transaction's commit: the call's two targets, owned.
struct Pending {
    /// The subtransaction that made it (re-tagged to its parent when that one commits).
    subtransaction: pg_sys::SubTransactionId,
    policy: String,
    created_at: i64,
    key: String,
    numbers: Policy,
    changed_at: i64,
    shadow: bool,
    blocking: Option<Blocking>,
    verdict: Option<Verdict>,
    reservation: String,
    reservation_numbers: Policy,
    actual: i64,
    max_debt: i64,
}

impl Pending {
    /// The settle's targets again: the key's bucket and the reservation's.
    fn targets(&self) -> (Target<'_>, Target<'_>) {
        let key = Target {
            namespace: Namespace::Policy {
                name: &self.policy,
                created_at: self.created_at,
            },
            key: &self.key,
            policy: self.numbers,
            changed_at: self.changed_at,
            shadow: self.shadow,
            blocking: self.blocking,
            verdict: self.verdict,
        };
        let reservation = Target {
            namespace: Namespace::Policy {
                name: &self.reservation,
                created_at: self.created_at,
            },
            policy: self.reservation_numbers,
            changed_at: i64::MIN,
            shadow: false,
            blocking: None,
            verdict: None,
            ..key
        };
        (key, reservation)
    }
}

thread_local! {
    /// This backend's settles waiting for the commit of its transaction, in the order they were made.
    static PENDING: RefCell<Vec<Pending>> = const { RefCell::new(Vec::new()) };
}

/// Whether a settle of the reservation `reservation` of `key` waits for this transaction's commit.
pub fn waiting(reservation: &Target<'_>) -> bool {
    let name = reservation.namespace.stored_name();
    PENDING.with(|p| {
        p.borrow()
            .iter()
            .any(|s| s.reservation == name && s.key == reservation.key)
    })
}

/// Keeps the settle of `reservation` on `actual` tokens used by the key of `target` until this
/// transaction commits.
pub fn defer(target: &Target<'_>, reservation: &Target<'_>, actual: i64, max_debt: i64) {
    // SAFETY: reads the current subtransaction's id, a plain global of this backend, on its only thread.
    let subtransaction = unsafe { pg_sys::GetCurrentSubTransactionId() };
    let Namespace::Policy { name, created_at } = target.namespace else {
        return; // reservations are named policies' only
    };
    let pending = Pending {
        subtransaction,
        policy: name.to_string(),
        created_at,
        key: target.key.to_string(),
        numbers: target.policy,
        changed_at: target.changed_at,
        shadow: target.shadow,
        blocking: target.blocking,
        verdict: target.verdict,
        reservation: reservation.namespace.stored_name().to_string(),
        reservation_numbers: reservation.policy,
        actual,
        max_debt,
    };
    PENDING.with(|p| p.borrow_mut().push(pending));
}

/// At `COMMIT`: applies every waiting settle in order, logging one the memory store cannot apply.
pub fn on_commit() {
    let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    for settle in &pending {
        if let Err(e) = apply(settle) {
            pgrx::warning!(
                "rate_limit: a settle of policy \"{}\" could not be applied at commit: {}",
                settle.policy,
                e.message()
            );
        }
    }
}

/// Applies one settle in the memory store, with its effect on this backend's memory of short buckets.
fn apply(settle: &Pending) -> Result<(), ErrorReport> {
    const F: &str = "rate_limit.settle";
    let (target, reservation) = settle.targets();
    // the call checked that the key's memory bucket is this node's
    let s = &MemoryBuckets::checked(&settle.key);
    let seam = Seam { s, function: F };
    let (answer, _) =
        pipeline::single::settle(&seam, &target, &reservation, settle.actual, settle.max_debt)?;
    remember(
        Store::Memory,
        std::slice::from_ref(&target),
        std::slice::from_ref(&answer),
    );
    Ok(())
}

/// At `ROLLBACK` (or any abort): drops every waiting settle.
pub fn on_abort() {
    PENDING.with(|p| p.borrow_mut().clear());
}

/// Before `PREPARE TRANSACTION`: 0A000 while a settle waits.
pub fn on_prepare() {
    if PENDING.with(|p| !p.borrow().is_empty()) {
        pgrx::ereport!(
            ERROR,
            pgrx::PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "cannot PREPARE a transaction that settled reservations of the memory store",
            "A memory-store settle is applied when its transaction commits in this session; settle \
             outside the prepared transaction, or use a policy of the table store."
        );
    }
}

/// At the commit of subtransaction `my` into `parent`: its settles now wait for the parent's end.
pub fn on_subtransaction_commit(my: pg_sys::SubTransactionId, parent: pg_sys::SubTransactionId) {
    PENDING.with(|p| {
        for s in p.borrow_mut().iter_mut().filter(|s| s.subtransaction == my) {
            s.subtransaction = parent;
        }
    });
}

/// At the abort of subtransaction `my` (`ROLLBACK TO SAVEPOINT`, an exception block): drops its settles,
/// and those of its committed children (re-tagged to it when they committed).
pub fn on_subtransaction_abort(my: pg_sys::SubTransactionId) {
    PENDING.with(|p| p.borrow_mut().retain(|s| s.subtransaction != my));
}
