//! Many keys of one policy decided in one call, each alone (`take_batch`): the model's flow
//! ([`pipeline::batch::take_each`]) over either store, through the seam's one `match`; each store's way
//! through a batch (its [`Buckets::take_each`]) is its own: the table store in key order (its lock
//! order), the memory store in the order of the keys' buckets in memory. Either way a key named twice is
//! taken in the order given, and every outcome is returned in the order given.

use pgrx::pg_sys::panic::ErrorReport;

use super::buckets::{with_store, Buckets};
use super::{count, remember, short, Seam};
use crate::gucs::Store;
use crate::stats;
use rate_limit_model::algorithm::Outcome;
use rate_limit_model::pipeline::batch::{Answered, Key};
use rate_limit_model::pipeline::{self, Answer, Memo};
use rate_limit_model::target::Target;

/// Decides each of `keys` alone under the policy of `template` (`template` with each key), `costs[i]`
/// tokens for `keys[i]`, as [`super::take`] decides one target: one outcome per key, in the order given
/// (`take_batch`). A cancel or `statement_timeout` is checked for between keys.
///
/// The table store holds every row it writes locked until the transaction ends, so it locks the keys in
/// key order, the lock order (see [`super`]): two batches over the same keys never wait for each other in
/// a cycle. When nothing but the bucket applies to a key, the whole batch is three statements
/// (the table store's `batch`: lock or create every row in key order, read them, write the granted ones);
/// otherwise each key is taken alone, in key order. A key named twice is still taken in the order given
/// (the sort is stable), and keys are independent, so the outcomes are those of the order given.
///
/// The memory store takes them in runs of many keys, each in the order of the keys'
/// buckets in memory (a key named twice in the order given; see its `run`), each bucket loaded into
/// the CPU cache a few keys ahead. A key whose bucket exists and has the tokens is taken with the
/// lock-free swap straight away when nothing else could apply to it: no block (the policy has no penalty
/// box, and no block by hand may have been made under it), no shadow mode, no Citus (a key may live on
/// another node). Every other key, and every denial, is decided by the model as a take of that key.
pub fn take_each(
    function: &'static str,
    store: Store,
    template: &Target<'_>,
    keys: &[&str],
    costs: &[i64],
) -> Result<Vec<Outcome>, ErrorReport> {
    with_store!(store, s => take_each_in(s, function, template, keys, costs))
}

/// [`take_each`] in the store `s`: the model's flow, each key's answer applied as it comes (the memory
/// store keeps what it took when a later key fails, so its grants are counted either way).
fn take_each_in<S: Buckets>(
    s: &S,
    function: &'static str,
    template: &Target<'_>,
    keys: &[&str],
    costs: &[i64],
) -> Result<Vec<Outcome>, ErrorReport> {
    let remembered = short::remembered(S::STORE);
    let mut applied = Applied {
        store: S::STORE,
        template,
        taken: vec![None; keys.len()],
        grants: 0,
        tokens: 0,
    };
    let decided = pipeline::batch::take_each(
        &Seam { s, function },
        remembered,
        template,
        keys,
        costs,
        &mut applied,
    );
    // grants are counted together (one batch, one write to the statistics), denials one by one
    stats::record_grants(template, applied.grants, applied.tokens);
    decided?;
    applied
        .taken
        .into_iter()
        .map(|o| o.ok_or_else(|| crate::error::bug(function, "a key was not decided")))
        .collect()
}

/// Each key's answer applied as it comes: its outcome kept, the common grant counted with the others at
/// the end, any other answer's effects applied at once ([`apply_one`]).
struct Applied<'a, 't> {
    store: Store,
    template: &'a Target<'t>,
    /// Each key's outcome, by its number in the batch.
    taken: Vec<Option<Outcome>>,
    /// The grants and their tokens, counted in the statistics once.
    grants: u64,
    tokens: u64,
}

impl Answered for &mut Applied<'_, '_> {
    /// The common grant costs a few instructions in the store's loop over the keys.
    #[inline(always)]
    fn answered(&mut self, k: Key<'_>, answer: Answer) {
        self.taken[k.index] = Some(answer.outcome);
        if answer.outcome.allowed && k.cost > 0 {
            self.grants += 1;
            self.tokens += k.cost as u64;
            if answer.memo == Memo::Forget {
                short::forget_taken(&self.template.namespace, k.key);
                return;
            }
        }
        apply_one(self.store, self.template, k, &answer);
    }
}

/// The effects of the answer of key `k` that is not the common grant: what the backend remembers of its
/// bucket, and the statistics of a denial or of a call that only reports. A call of its own, so that the
/// common grant compiles into the store's loop.
#[inline(never)]
fn apply_one(store: Store, template: &Target<'_>, k: Key<'_>, answer: &Answer) {
    let t = Target {
        key: k.key,
        ..*template
    };
    let (t, a) = (std::slice::from_ref(&t), std::slice::from_ref(answer));
    remember(store, t, a);
    if !(answer.outcome.allowed && k.cost > 0) {
        count(t, &[answer.outcome], a, &[k.cost]);
    }
}
