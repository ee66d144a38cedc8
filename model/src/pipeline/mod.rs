//! The call pipeline: how one take combines everything that can decide it, written once over a narrow
//! [`Store`] that both of the extension's stores (and the tests' in-memory one) implement; the calls of
//! one key that are not takes (a charge, a refund, a lease acquired or released) are [`single`]'s, and
//! many keys each decided alone (a batch) [`batch`]'s, over the same store. Per-key overrides and
//! policies are resolved by the caller (they are in each [`Target`]); what is decided here:
//!
//! 1. a bucket this backend remembers short denies a call of one bucket from that memory (the memory is
//!    the caller's: it is asked through a function, and told what to remember through [`Memo`]);
//! 2. else the keys' block buckets are read ([`blocks::blocked`]); a key's override answer (deny, exempt)
//!    comes before its block;
//! 3. a key denied by its override or block denies the call unless it is in shadow mode: no bucket is
//!    touched; else the store takes `cost` from every target left open, all or nothing;
//! 4. the denials are counted in their policies' penalty boxes ([`blocks::count_denials`]).
//!
//! The result is one [`Answer`] per target: its outcome, whether its block denied it (statistics), and
//! what the backend's short-bucket memory should do with its bucket. The caller applies those effects
//! and counts the statistics; the Citus guard, blocks by hand and read-only rules stay in the store
//! adapters.
//!
//! # The lock order
//! A store that holds locks until the caller's transaction ends (the table store) must never be asked in
//! an order that lets two calls wait for each other in a cycle. Every call here locks:
//! - the buckets it writes through one [`Store::take`] (a store locks them in (namespace, key) order);
//! - then, through [`Store::count_denial`], each denied key's bucket (if not held already) and after it
//!   that key's block bucket, the denied keys in (namespace, key) order.
//!
//! A charge, a refund or a release locks the one bucket it writes (waiting for it); an acquire tries its
//! key's slots without waiting for any (a slot another transaction holds is skipped), then counts a
//! denial as a take does.
//!
//! So every bucket a call locks after its first is above the ones it holds, in (namespace, key) order,
//! and a block bucket is locked only by a call that holds its key's bucket, so a call waiting for a block
//! bucket never waits for a call that waits for it. Block buckets are only read ([`Store::read`]), never
//! locked, before the take. The tests check the locks of every generated call.
//!
//! # Why the store has these methods
//! Each method of [`Store`] is one rule of concurrency a store keeps, and the lock order above rests on
//! each: `read` locks nothing; `take` locks its buckets all or nothing; `take_each` may decide keys in
//! bulk under the store's own locks; `write` creates a missing bucket and `update` never does (a refund
//! or a release must not insert a bucket nobody holds); `acquire` never waits for a slot; `count_denial`
//! locks in the lock order; `now` and `reads_block_anyway` are facts of the store. Folding two of them
//! into one method with a flag would move a rule out of the trait, where the tests check it call by call,
//! into each store's code.

pub mod batch;
pub mod blocks;
#[cfg(test)]
mod booking_tests;
#[cfg(test)]
mod lease_tests;
#[cfg(test)]
mod reservation_tests;
pub mod single;
#[cfg(test)]
mod tests;

use smallvec::SmallVec;

use crate::algorithm::{Outcome, State};
use crate::target::{Ask, Stored, Target};

/// A call's values, one per target, inline for a call of up to two targets (most calls have one), so
/// that the pipeline allocates nothing for them.
pub type PerTarget<T> = SmallVec<[T; 2]>;

/// What the pipeline needs of a store. Every method answers from the store itself.
pub trait Store {
    /// The store's error (the extension's is a PostgreSQL error report).
    type Error;

    /// Now on this store's clock, in µs.
    fn now(&self) -> Result<i64, Self::Error>;

    /// Reports every bucket of `buckets` as it is now, writing nothing and locking nothing (in a fresh
    /// snapshot where the store has snapshots: a block committed since the caller's transaction began is
    /// seen).
    fn read(&self, buckets: &[Target<'_>]) -> Result<Vec<Outcome>, Self::Error>;

    /// Takes `costs[i]` tokens from `targets[i]`, every target, all or nothing (every cost is above 0, or
    /// every cost is 0: the call only reports), under the store's concurrency: one outcome per target. Denied: nothing written. Granted: every allowed outcome's state written (a denied one is of a
    /// bucket in shadow mode, and keeps its state).
    fn take(
        &self,
        targets: &[Target<'_>],
        costs: &[i64],
    ) -> Result<PerTarget<Outcome>, Self::Error>;

    /// Visits every key of a batch once (`template` with `keys[i]`, `costs[i]` tokens each), in the
    /// order this store takes keys in (its lock order; a key named twice in the order given), telling
    /// `each(key, …)` what it did with each ([`batch::Key`]: its number, the key and its cost): when `bulk` (nothing but a key's bucket can decide it, see
    /// [`batch::take_each`]) it may decide a key by its bucket alone ([`batch::Each::Decided`]: taken as
    /// [`Store::take`] of that key would); any key it does not decide so it leaves to the pipeline
    /// ([`batch::Each::Alone`]), which decides it inside `each` through this store's other methods. Stops
    /// at the first error, `each`'s or its own. `each` of a key decided in bulk calls no method of the
    /// store (only the caller's `answered`), so a store may call it under its own locks.
    fn take_each(
        &self,
        template: &Target<'_>,
        keys: &[&str],
        costs: &[i64],
        bulk: bool,
        each: &mut impl batch::Visit<Self::Error>,
    ) -> Result<(), Self::Error>;

    /// Answers `ask` (a charge) in the bucket of `target` under the store's concurrency (locked, read,
    /// answered, written), creating it when missing: the bucket afterwards.
    fn write(&self, target: &Target<'_>, ask: Ask) -> Result<Outcome, Self::Error>;

    /// Creates the fresh buckets `held` (one call's reservations, under ids nobody else knows yet),
    /// `held[i]` holding `amounts[i]` tokens (each above 0): whether every one was recorded. The same as
    /// [`Store::write`] of a take of each, which is what it does unless the store can do it in one pass
    /// (the memory store locks their partitions once).
    fn record(&self, held: &[Target<'_>], amounts: &[i64]) -> Result<bool, Self::Error> {
        record_each(self, held, amounts)
    }

    /// Locks and reads the bucket of `target`, asks `step` what to write given it and the clock, and
    /// writes that state if the bucket exists (a missing bucket is full: nothing is inserted): a refund, a
    /// release. `step` is pure arithmetic (the memory store runs it under a lock).
    fn update<R>(
        &self,
        target: &Target<'_>,
        step: impl FnOnce(Option<Stored>, i64) -> (Option<State>, R),
    ) -> Result<R, Self::Error>;

    /// Acquires a lease in the first free slot of `slots` (one key's, in slot order) with id
    /// `lease_id(random, slot)`, never waiting for a slot another call holds: every slot's state as seen,
    /// the granted slot's state, and the instant.
    fn acquire(
        &self,
        slots: &[Target<'_>],
        random: u64,
    ) -> Result<(Vec<State>, Option<State>, i64), Self::Error>;

    /// Counts one denial of `owner`'s key in `bucket` (its block bucket, created when missing), after
    /// locking `owner`'s bucket (the lock order above): the block bucket afterwards, `None` when the store
    /// cannot write now (a read-only transaction of the table store).
    fn count_denial(
        &self,
        owner: &Target<'_>,
        bucket: &Target<'_>,
        block_for: i64,
    ) -> Result<Option<Outcome>, Self::Error>;

    /// Whether a call on `target` must read its key's block bucket although its policy says no key can be
    /// blocked: blocks by hand the store could not note in the policy (see
    /// [`crate::target::Blocking::may_be_blocked`]).
    fn reads_block_anyway(&self, target: &Target<'_>) -> Result<bool, Self::Error>;
}

/// [`Store::record`] done bucket by bucket: a [`Store::write`] of a take of `amounts[i]` from each
/// `held[i]`; whether every one was granted. The default of every store that has no single pass.
pub fn record_each<S: Store + ?Sized>(
    store: &S,
    held: &[Target<'_>],
    amounts: &[i64],
) -> Result<bool, S::Error> {
    let mut all = true;
    for (t, amount) in held.iter().zip(amounts) {
        all &= store.write(t, Ask::Take(*amount))?.allowed;
    }
    Ok(all)
}

/// What the backend's memory of short buckets should do with a target's bucket after a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memo {
    /// Nothing: the bucket was not asked.
    Keep,
    /// Forget it: tokens were taken from it, or its key is blocked now (what was remembered would report
    /// more than it holds, or answer before the block).
    Forget,
    /// Remember it short, in this state (under the target's numbers).
    Remember(State),
}

/// The answer of a call for one of its targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The target's outcome; a bucket the call did not need to look at is reported as allowed.
    pub outcome: Outcome,
    /// Whether the key's block (not an override) denied it.
    pub by_block: bool,
    /// What to remember of its bucket.
    pub memo: Memo,
}

impl Answer {
    /// The answer `outcome` of a target decided by its bucket, with nothing to remember yet.
    pub fn of(outcome: Outcome) -> Answer {
        Answer {
            outcome,
            by_block: false,
            memo: Memo::Keep,
        }
    }

    /// A target the call did not look at.
    fn not_looked_at() -> Answer {
        Answer::of(Outcome {
            allowed: true,
            state: State { level: 0, at: 0 },
            remaining: 0,
            retry_after: None,
            reset_after: 0,
        })
    }
}

/// The outcomes of `answers`, in order.
pub fn outcomes(answers: &[Answer]) -> PerTarget<Outcome> {
    answers.iter().map(|a| a.outcome).collect()
}

/// Asks every target for `cost` tokens, all or nothing (cost 0 only reports); one answer per target.
/// `remembered_short(target, now, cost)` is the backend's memory of short buckets: the denial it
/// remembers for that bucket, if any, or an error when the bucket may not be answered here at all (the
/// memory store under Citus, off the key's node): it is asked before the store is.
///
/// Denied ([`crate::target::granted`] false over the outcomes): at least one outcome of a target not in
/// shadow mode is denied and nothing was taken. Granted: every allowed outcome's tokens were taken, and a
/// denied one (of a target in shadow mode) took nothing. A key with an override's answer is never asked
/// of its bucket; an exempt key is granted with nothing taken.
pub fn take<S: Store>(
    s: &S,
    remembered_short: impl FnMut(&Target<'_>, i64, i64) -> Result<Option<Outcome>, S::Error>,
    targets: &[Target<'_>],
    cost: i64,
) -> Result<PerTarget<Answer>, S::Error> {
    let costs: PerTarget<i64> = smallvec::smallvec![cost; targets.len()];
    take_costs(s, remembered_short, targets, &costs)
}

/// [`take`] of `costs[i]` tokens from `targets[i]` (one cost per target, e.g. a reservation over several
/// policies that weigh one call differently), all or nothing. Every cost is above 0, or every cost is 0
/// (the call only reports).
pub fn take_costs<S: Store>(
    s: &S,
    remembered_short: impl FnMut(&Target<'_>, i64, i64) -> Result<Option<Outcome>, S::Error>,
    targets: &[Target<'_>],
    costs: &[i64],
) -> Result<PerTarget<Answer>, S::Error> {
    debug_assert_eq!(targets.len(), costs.len());
    debug_assert!(costs.iter().all(|c| *c > 0) || costs.iter().all(|c| *c == 0));
    let mut answers: PerTarget<Answer> =
        smallvec::smallvec![Answer::not_looked_at(); targets.len()];
    match known_short(s, remembered_short, targets, costs)? {
        Some((i, denied)) => answers[i].outcome = denied,
        None => decide(s, targets, costs, &mut answers)?,
    }
    if costs.iter().any(|c| *c > 0) {
        blocks::count_denials(s, targets, &mut answers)?;
    }
    Ok(answers)
}

/// The target denied from the backend's memory, and its denial: only a call of one bucket (a call of
/// several is denied with the longest wait of its short buckets, which the store alone knows), and not a
/// bucket in shadow mode (which never denies) nor one with an override's answer (not asked of its bucket).
fn known_short<S: Store>(
    s: &S,
    mut remembered_short: impl FnMut(&Target<'_>, i64, i64) -> Result<Option<Outcome>, S::Error>,
    targets: &[Target<'_>],
    costs: &[i64],
) -> Result<Option<(usize, Outcome)>, S::Error> {
    let ([t], [cost]) = (targets, costs) else {
        return Ok(None);
    };
    let cost = *cost;
    if cost == 0 || t.shadow || t.verdict.is_some() {
        return Ok(None);
    }
    let now = s.now()?;
    Ok(remembered_short(t, now, cost)?.map(|denied| (0, denied)))
}

/// Decides a call no memory answered: overrides and blocks first, then the store for the targets they
/// leave open.
fn decide<S: Store>(
    s: &S,
    targets: &[Target<'_>],
    costs: &[i64],
    answers: &mut [Answer],
) -> Result<(), S::Error> {
    // each target's outcome decided without its bucket: its override's answer, else its block
    let mut decided = blocks::blocked(s, targets)?;
    for (a, d) in answers.iter_mut().zip(&decided) {
        a.by_block = d.is_some();
    }
    if targets.iter().any(|t| t.verdict.is_some()) {
        let now = s.now()?;
        for (t, d) in targets.iter().zip(decided.iter_mut()) {
            if let Some(v) = t.verdict {
                *d = Some(v.outcome(&t.policy, now));
            }
        }
    }
    let enforced_denial = targets
        .iter()
        .zip(&decided)
        .position(|(t, d)| d.is_some_and(|o| !o.allowed) && !t.shadow);
    if let Some(i) = enforced_denial {
        // a blocked or denied key denies the call: no bucket is touched
        if let Some(o) = decided[i] {
            answers[i].outcome = o;
        }
        return Ok(());
    }
    for (a, d) in answers.iter_mut().zip(&decided) {
        if let Some(o) = d {
            a.outcome = *o;
        }
    }
    let taken = if decided.iter().all(Option::is_none) {
        // the common call: every target asked, nothing copied
        s.take(targets, costs)?
    } else {
        // the decided keys (exempt, or in shadow mode) leave their buckets alone
        let (open, open_costs): (Vec<Target<'_>>, PerTarget<i64>) = targets
            .iter()
            .zip(costs)
            .zip(&decided)
            .filter(|(_, d)| d.is_none())
            .map(|((t, c), _)| (*t, *c))
            .unzip();
        if open.is_empty() {
            return Ok(());
        }
        s.take(&open, &open_costs)?
    };
    let asked = answers
        .iter_mut()
        .zip(costs)
        .zip(&decided)
        .filter(|(_, d)| d.is_none());
    for (((a, cost), _), o) in asked.zip(taken) {
        a.outcome = o;
        if *cost > 0 {
            a.memo = if o.allowed {
                Memo::Forget
            } else {
                Memo::Remember(o.state)
            };
        }
    }
    Ok(())
}

/// A bucket a backend remembers short: its state at the instant of the denial, under the numbers of the
/// call that saw it (see [`Remembered::denial`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remembered {
    /// The numbers the state was evaluated under.
    pub policy: crate::algorithm::Policy,
    /// When those numbers took effect (the target's `changed_at`).
    pub changed_at: i64,
    /// The bucket's state at the denial.
    pub state: State,
}

impl Remembered {
    /// What a backend remembers of `target`'s bucket found short in `state`.
    pub fn of(target: &Target<'_>, state: State) -> Remembered {
        Remembered {
            policy: target.policy,
            changed_at: target.changed_at,
            state,
        }
    }

    /// The denial of `cost` tokens of `target` at `now` that this memory proves, or `None` when it proves
    /// none (the entry is then stale: the caller drops it and asks the store).
    ///
    /// Sound because, between the denial and now, other sessions can only have removed tokens from the
    /// bucket (the exceptions, which add tokens, make the backend forget it: its own rollback, refund or
    /// reset; another backend's are seen once the remembered state would grant): if the remembered state
    /// cannot grant, the real one cannot either. Not used when the numbers changed, or when the clock is
    /// behind the remembered instant or behind the instant the numbers changed (the store rebases, and
    /// carries over at the change's instant, which the memory would not).
    pub fn denial(&self, target: &Target<'_>, now: i64, cost: i64) -> Option<Outcome> {
        if cost < 1
            || self.policy != target.policy
            || self.changed_at != target.changed_at
            || now < self.state.at
            || now < target.changed_at
        {
            return None;
        }
        Some(self.policy.take(self.state, now, cost)).filter(|o| !o.allowed)
    }
}
