//! Many keys of one policy, each decided alone (`take_batch`), written once over the [`Store`]: the store
//! picks the order (its lock order) and may decide in bulk the keys nothing but their buckets can
//! decide; every other key is decided by [`super::take`] of that key alone, when the store reaches it.

use super::{blocks, take, Answer, Memo, Store};
use crate::algorithm::Outcome;
use crate::target::Target;

/// One key of a batch as the store reaches it, handed back by the store that has it at hand (in a batch
/// of many keys a read of the batch's arrays at random costs a cache miss).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key<'k> {
    /// Its number in the batch (`keys[index]`).
    pub index: usize,
    /// The key.
    pub key: &'k str,
    /// Its cost (`costs[index]`).
    pub cost: i64,
}

/// What a store's [`Store::take_each`] tells of each key it reaches: the key, and what it did with it.
/// The stores take it as a generic argument, not a `dyn` one, and the pipeline's own visitor
/// ([`take_each`]'s) is a type whose `visit` is always inlined, so that its handling of a key decided in
/// bulk is compiled into the store's loop over the keys (a closure's body may stay a call of its own). Any
/// closure of the same signature is a visitor too.
pub trait Visit<E> {
    /// Tells what the store did with key `k`; an error stops the batch.
    fn visit(&mut self, k: Key<'_>, each: Each) -> Result<(), E>;
}

impl<E, F: FnMut(Key<'_>, Each) -> Result<(), E>> Visit<E> for F {
    fn visit(&mut self, k: Key<'_>, each: Each) -> Result<(), E> {
        self(k, each)
    }
}

/// What [`take_each`]'s caller does with each key's answer as soon as it is decided. A type whose method
/// is always inlined compiles into the store's loop over the keys (the extension's is one); any closure of
/// the same signature is one too.
pub trait Answered {
    /// Key `k` was decided: `answer`.
    fn answered(&mut self, k: Key<'_>, answer: Answer);
}

impl<F: FnMut(Key<'_>, Answer)> Answered for F {
    fn answered(&mut self, k: Key<'_>, answer: Answer) {
        self(k, answer)
    }
}

/// What the store did with one key of a batch, in [`Store::take_each`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Each {
    /// Decided in bulk by its bucket alone (granted: its tokens taken; denied: nothing written).
    Decided(Outcome),
    /// Left to the pipeline, which decides it now, as a take of that key alone.
    Alone,
}

/// Takes `costs[i]` tokens from the bucket of `keys[i]` (`template` with that key), each key alone, in
/// the order the store takes them in ([`Store::take_each`]); `answered(key, answer)` is told each key's
/// answer as soon as it is decided, so that a caller whose store keeps what it took when a later key
/// fails (the memory store) can count it; for a key decided in bulk a store may call it under its own
/// locks, so it must be bookkeeping that cannot fail. `remembered_short` is [`super::take`]'s.
///
/// A key is decided in bulk only when nothing but its bucket could decide it: no override's answer, no
/// shadow mode, no block possible under its policy. Either way its answer is what [`super::take`] of that
/// key alone would answer at that point of the order.
pub fn take_each<S: Store>(
    s: &S,
    mut remembered_short: impl FnMut(&Target<'_>, i64, i64) -> Result<Option<Outcome>, S::Error>,
    template: &Target<'_>,
    keys: &[&str],
    costs: &[i64],
    mut answered: impl Answered,
) -> Result<(), S::Error> {
    let bulk = bulk_applies(s, template)?;
    let mut visitor = Visitor {
        s,
        remembered_short: &mut remembered_short,
        template,
        answered: &mut answered,
    };
    s.take_each(template, keys, costs, bulk, &mut visitor)
}

/// [`take_each`]'s visitor: answers each key as the store reaches it and tells `answered`.
struct Visitor<'v, 't, S, R, A> {
    s: &'v S,
    remembered_short: &'v mut R,
    template: &'v Target<'t>,
    answered: &'v mut A,
}

impl<S, R, A> Visit<S::Error> for Visitor<'_, '_, S, R, A>
where
    S: Store,
    R: FnMut(&Target<'_>, i64, i64) -> Result<Option<Outcome>, S::Error>,
    A: Answered,
{
    /// A key decided in bulk costs a few instructions in the store's loop; a key left alone is a call of
    /// its own.
    #[inline(always)]
    fn visit(&mut self, k: Key<'_>, each: Each) -> Result<(), S::Error> {
        let answer = match each {
            Each::Decided(outcome) => decided(k.cost, outcome),
            Each::Alone => alone(self.s, &mut *self.remembered_short, self.template, k)?,
        };
        self.answered.answered(k, answer);
        Ok(())
    }
}

/// The answer of a key of `cost` tokens decided in bulk by its bucket.
#[inline(always)]
fn decided(cost: i64, outcome: Outcome) -> Answer {
    Answer {
        memo: match (cost > 0, outcome.allowed) {
            (false, _) => Memo::Keep,
            (true, true) => Memo::Forget,
            (true, false) => Memo::Remember(outcome.state),
        },
        ..Answer::of(outcome)
    }
}

/// The answer of key `k` left to the pipeline: [`take`] of that key alone.
#[inline(never)]
fn alone<S: Store>(
    s: &S,
    remembered_short: impl FnMut(&Target<'_>, i64, i64) -> Result<Option<Outcome>, S::Error>,
    template: &Target<'_>,
    k: Key<'_>,
) -> Result<Answer, S::Error> {
    let t = Target {
        key: k.key,
        ..*template
    };
    let answers = take(s, remembered_short, std::slice::from_ref(&t), k.cost)?;
    // one target, one answer
    Ok(answers[0])
}

/// Whether the keys of `template`'s policy may be decided by their buckets alone: nothing else could
/// decide one (see [`take_each`]).
fn bulk_applies<S: Store>(s: &S, template: &Target<'_>) -> Result<bool, S::Error> {
    Ok(!template.shadow && template.verdict.is_none() && blocks::holds_no_block(s, template)?)
}
