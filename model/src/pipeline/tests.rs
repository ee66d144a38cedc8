//! The pipeline against an in-memory store, with plain `cargo test`: generated sequences of calls over a
//! few policies and keys (every kind that reaches a take: overrides, blocks by hand and the penalty box,
//! shadow mode, debt charged and tokens refunded between takes ([`single`]), all-or-nothing over several
//! targets, batches of keys each decided alone ([`batch`], with or without a bulk path that denies), a
//! read-only store),
//! checked call by call against a slow reference decision, for the lock order, all-or-nothing, exact
//! states and conservation; and the backend's memory of short buckets shown never to change a decision.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;
use crate::algorithm::{Algorithm, Policy};
use crate::target::{granted, Ask, Blocking, Namespace, Stored, Verdict};

const S: i64 = 1_000_000;

/// A bucket's place in the test store: (namespace, key).
pub(super) type Place = (String, String);

/// A lock taken by a call, in the order taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Lock {
    /// A key's bucket.
    Bucket(Place),
    /// A key's block bucket; `owner` the key's bucket.
    Block { bucket: Place, owner: Place },
}

/// An in-memory store that takes as the stores promise (all or nothing, the targets' buckets locked in
/// (namespace, key) order) and logs the locks each call takes.
#[derive(Default)]
pub(super) struct TestStore {
    pub(super) now: Cell<i64>,
    pub(super) buckets: RefCell<BTreeMap<Place, Stored>>,
    pub(super) locks: RefCell<Vec<Lock>>,
    pub(super) read_only: bool,
    pub(super) hand_blocks_anyway: bool,
    /// Whether a batch's bulk path decides denials too (as the table store's does), or leaves every key
    /// it cannot grant to the pipeline (as the memory store's does).
    pub(super) bulk_denies: bool,
}

/// Where `t`'s bucket is in the test store.
pub(super) fn place(t: &Target<'_>) -> Place {
    (t.namespace.stored_name().to_string(), t.key.to_string())
}

impl TestStore {
    /// The bucket of `t` as stored.
    pub(super) fn stored(&self, t: &Target<'_>) -> Option<Stored> {
        self.buckets.borrow().get(&place(t)).copied()
    }

    /// Stores `state` as `t`'s bucket.
    fn write_state(&self, t: &Target<'_>, state: State) {
        let stored = Stored {
            state,
            policy: t.policy,
        };
        self.buckets.borrow_mut().insert(place(t), stored);
    }

    /// Answers `ask` in `t`'s bucket outside the pipeline (a block by hand), or for [`Store::write`].
    pub(super) fn answer(&self, t: &Target<'_>, ask: Ask) -> Outcome {
        let o = t.answer(self.stored(t), self.now.get(), ask);
        self.write_state(t, o.state);
        o
    }
}

impl Store for TestStore {
    type Error = ();

    fn now(&self) -> Result<i64, ()> {
        Ok(self.now.get())
    }

    fn read(&self, buckets: &[Target<'_>]) -> Result<Vec<Outcome>, ()> {
        let now = self.now.get();
        Ok(buckets
            .iter()
            .map(|b| b.evaluate(self.stored(b), now, 0))
            .collect())
    }

    fn take(&self, targets: &[Target<'_>], costs: &[i64]) -> Result<PerTarget<Outcome>, ()> {
        let now = self.now.get();
        let outcomes: PerTarget<Outcome> = targets
            .iter()
            .zip(costs)
            .map(|(t, cost)| t.evaluate(self.stored(t), now, *cost))
            .collect();
        if costs.iter().any(|c| *c > 0) && granted(targets, &outcomes) {
            // the rows it writes stay locked (a denial locks nothing: it writes nothing)
            let mut order: Vec<Place> = targets.iter().map(place).collect();
            order.sort();
            self.locks
                .borrow_mut()
                .extend(order.into_iter().map(Lock::Bucket));
            for (t, o) in targets.iter().zip(&outcomes).filter(|(_, o)| o.allowed) {
                self.write_state(t, o.state);
            }
        }
        Ok(outcomes)
    }

    fn take_each(
        &self,
        template: &Target<'_>,
        keys: &[&str],
        costs: &[i64],
        bulk: bool,
        each: &mut impl batch::Visit<()>,
    ) -> Result<(), ()> {
        for i in batch_order(keys) {
            let k = batch::Key {
                index: i,
                key: keys[i],
                cost: costs[i],
            };
            let t = Target {
                key: keys[i],
                ..*template
            };
            if bulk {
                let o = t.evaluate(self.stored(&t), self.now.get(), costs[i]);
                if o.allowed || self.bulk_denies {
                    // a bulk path locks every row it decides, granted or not
                    self.locks.borrow_mut().push(Lock::Bucket(place(&t)));
                    if o.allowed && costs[i] > 0 {
                        self.write_state(&t, o.state);
                    }
                    each.visit(k, batch::Each::Decided(o))?;
                    continue;
                }
            }
            each.visit(k, batch::Each::Alone)?;
        }
        Ok(())
    }

    fn write(&self, target: &Target<'_>, ask: Ask) -> Result<Outcome, ()> {
        self.locks.borrow_mut().push(Lock::Bucket(place(target)));
        Ok(self.answer(target, ask))
    }

    fn update<R>(
        &self,
        target: &Target<'_>,
        step: impl FnOnce(Option<Stored>, i64) -> (Option<State>, R),
    ) -> Result<R, ()> {
        self.locks.borrow_mut().push(Lock::Bucket(place(target)));
        let stored = self.stored(target);
        let (state, answer) = step(stored, self.now.get());
        if let (Some(state), Some(_)) = (state, stored) {
            self.write_state(target, state);
        }
        Ok(answer)
    }

    fn acquire(
        &self,
        slots: &[Target<'_>],
        random: u64,
    ) -> Result<(Vec<State>, Option<State>, i64), ()> {
        // every slot tried in order, none waited for (so none logged as a lock a call waits on)
        let now = self.now.get();
        let mut states = Vec::new();
        let mut granted = None;
        for (slot, t) in (0_i64..).zip(slots) {
            let ask = match granted {
                None => Ask::Acquire {
                    lease: crate::algorithm::lease_id(random, slot),
                },
                Some(_) => Ask::Take(0),
            };
            let o = t.answer(self.stored(t), now, ask);
            if granted.is_none() && o.allowed {
                self.write_state(t, o.state);
                granted = Some(o.state);
            }
            states.push(o.state);
        }
        Ok((states, granted, now))
    }

    fn count_denial(
        &self,
        owner: &Target<'_>,
        bucket: &Target<'_>,
        block_for: i64,
    ) -> Result<Option<Outcome>, ()> {
        if self.read_only {
            return Ok(None);
        }
        self.locks.borrow_mut().extend([
            Lock::Bucket(place(owner)),
            Lock::Block {
                bucket: place(bucket),
                owner: place(owner),
            },
        ]);
        Ok(Some(self.answer(bucket, Ask::CountDenial { block_for })))
    }

    fn reads_block_anyway(&self, _: &Target<'_>) -> Result<bool, ()> {
        Ok(self.hand_blocks_anyway)
    }
}

/// The order the test store takes a batch's keys in: by key (the table store's lock order), a key named
/// twice in the order given.
fn batch_order(keys: &[&str]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&i| keys[i]);
    order
}

/// A backend's memory of short buckets, as the extension keeps it.
#[derive(Default)]
struct Memory(RefCell<HashMap<Place, Remembered>>);

impl Memory {
    fn denial(&self, t: &Target<'_>, now: i64, cost: i64) -> Option<Outcome> {
        let mut m = self.0.borrow_mut();
        let denied = m.get(&place(t))?.denial(t, now, cost);
        if denied.is_none() {
            m.remove(&place(t));
        }
        denied
    }

    fn apply(&self, targets: &[Target<'_>], answers: &[Answer]) {
        for (t, a) in targets.iter().zip(answers) {
            match a.memo {
                Memo::Keep => {}
                Memo::Forget => {
                    self.0.borrow_mut().remove(&place(t));
                }
                Memo::Remember(state) => {
                    self.0
                        .borrow_mut()
                        .insert(place(t), Remembered::of(t, state));
                }
            }
        }
    }

    fn forget(&self, t: &Target<'_>) {
        self.0.borrow_mut().remove(&place(t));
    }
}

/// The policies of a generated world: a name, numbers and a penalty box.
#[derive(Clone, Debug)]
struct PolicySpec {
    name: &'static str,
    policy: Policy,
    /// (block_after, block_for µs)
    penalty: Option<(i64, i64)>,
    blocks_by_hand: bool,
}

const NAMES: [&str; 3] = ["a", "b", "c"];
const KEYS: [&str; 3] = ["k1", "k2", "k3"];

fn policy_spec(name: &'static str) -> impl Strategy<Value = PolicySpec> {
    (
        prop_oneof![
            3 => Just(Algorithm::TokenBucket),
            1 => Just(Algorithm::FixedWindow),
            1 => Just(Algorithm::SlidingWindow),
        ],
        1..5i64,
        1..4i64,
        prop::option::weighted(0.6, (1..4i64, 1..3 * S)),
        any::<bool>(),
    )
        .prop_map(
            move |(algorithm, rate, burst_factor, penalty, blocks_by_hand)| {
                let burst = if algorithm == Algorithm::TokenBucket {
                    rate * burst_factor
                } else {
                    rate
                };
                PolicySpec {
                    name,
                    policy: Policy::new(algorithm, rate, S, burst).expect("valid numbers"),
                    penalty,
                    blocks_by_hand,
                }
            },
        )
}

impl PolicySpec {
    fn blocking(&self) -> Blocking {
        Blocking {
            bucket: Policy::block_bucket(self.penalty.map(|p| p.0), S).expect("valid numbers"),
            penalty_for: self.penalty.map(|p| p.1),
            blocks_by_hand: self.blocks_by_hand,
        }
    }

    fn target<'a>(&'a self, key: &'a str, shadow: bool, verdict: Option<Verdict>) -> Target<'a> {
        Target {
            namespace: Namespace::Policy {
                name: self.name,
                created_at: 0,
            },
            key,
            policy: self.policy,
            changed_at: i64::MIN,
            shadow,
            blocking: Some(self.blocking()),
            verdict,
        }
    }
}

/// One target of a generated call: (policy index, key index, shadow, override).
type TargetSpec = (usize, usize, bool, Option<Verdict>);

/// One step of a generated sequence.
#[derive(Clone, Debug)]
enum Step {
    /// The clock moves on by this many µs.
    Wait(i64),
    /// A take of `costs[i]` from distinct targets `targets[i]` (every cost above 0, or every cost 0).
    Take {
        targets: Vec<TargetSpec>,
        costs: Vec<i64>,
    },
    /// A charge of `cost` tokens with up to `max_debt` of debt ([`single::charge`]), the key perhaps with
    /// an override's answer.
    Charge {
        policy: usize,
        key: usize,
        cost: i64,
        max_debt: i64,
        verdict: Option<Verdict>,
    },
    /// A refund of up to `tokens` ([`single::refund`]).
    Refund {
        policy: usize,
        key: usize,
        tokens: i64,
    },
    /// A batch of one policy's keys (a key may be named twice), each decided alone, perhaps in shadow
    /// mode ([`batch::take_each`]); `(key, cost)` each.
    Batch {
        policy: usize,
        keys: Vec<(usize, i64)>,
        shadow: bool,
    },
    /// A block by hand of the key for `duration` µs (the policy notes that blocks by hand exist).
    Block {
        policy: usize,
        key: usize,
        duration: i64,
    },
}

fn verdict() -> impl Strategy<Value = Option<Verdict>> {
    prop_oneof![
        8 => Just(None),
        1 => Just(Some(Verdict::Exempt)),
        1 => (0..3 * S).prop_map(|u| Some(Verdict::Deny { until: Some(u) })),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let target = (
        0..NAMES.len(),
        0..KEYS.len(),
        prop::bool::weighted(0.15),
        verdict(),
    );
    prop_oneof![
        3 => (0..700_000i64).prop_map(Step::Wait),
        8 => (prop::collection::vec((target, 1..4i64), 1..4), prop::bool::weighted(0.25))
            .prop_map(|(mut targets, reports)| {
                let mut seen = Vec::new();
                targets.retain(|(t, _)| {
                    let fresh = !seen.contains(&(t.0, t.1));
                    seen.push((t.0, t.1));
                    fresh
                });
                let (targets, costs) = targets
                    .into_iter()
                    .map(|(t, c)| (t, if reports { 0 } else { c }))
                    .unzip();
                Step::Take { targets, costs }
            }),
        1 => (0..NAMES.len(), 0..KEYS.len(), 1..5i64, 0..4i64, verdict())
            .prop_map(|(policy, key, cost, max_debt, verdict)| {
                Step::Charge { policy, key, cost, max_debt, verdict }
            }),
        1 => (0..NAMES.len(), 0..KEYS.len(), 1..4i64)
            .prop_map(|(policy, key, tokens)| Step::Refund { policy, key, tokens }),
        1 => (0..NAMES.len(), 0..KEYS.len(), 1..2 * S)
            .prop_map(|(policy, key, duration)| Step::Block { policy, key, duration }),
        2 => (0..NAMES.len(), prop::collection::vec((0..KEYS.len(), 0..4i64), 1..7), prop::bool::weighted(0.2))
            .prop_map(|(policy, keys, shadow)| Step::Batch { policy, keys, shadow }),
    ]
}

fn world() -> impl Strategy<Value = Vec<PolicySpec>> {
    (
        policy_spec(NAMES[0]),
        policy_spec(NAMES[1]),
        policy_spec(NAMES[2]),
    )
        .prop_map(|(a, b, c)| vec![a, b, c])
}

/// The slow reference decision of a take of `costs[i]` from each of `targets` against the store as it is: whether
/// the call is granted, and for every target asked of its bucket its outcome (`None`: decided without
/// it). Written apart from the pipeline, from the rules in the docs: an override's answer first, then
/// the key's block (the real one, or under shadow mode the shadowed penalty box's too), and only if no
/// key is denied that way outside shadow mode, every other bucket, all or nothing.
fn reference(
    store: &TestStore,
    targets: &[Target<'_>],
    costs: &[i64],
) -> (bool, Vec<Option<Outcome>>) {
    let now = store.now.get();
    let blocked_in = |t: &Target<'_>, ns: String| -> bool {
        let b = t.blocking.expect("policy targets");
        let bucket = Target {
            namespace: Namespace::Policy {
                name: &ns,
                created_at: 0,
            },
            policy: b.bucket,
            changed_at: i64::MIN,
            shadow: false,
            blocking: None,
            verdict: None,
            ..*t
        };
        !bucket.evaluate(store.stored(&bucket), now, 0).allowed
    };
    let mut denied_without_bucket = false;
    let mut asked = Vec::new();
    for t in targets {
        let name = t.namespace.stored_name();
        let by_override = t.verdict.map(|v| v.outcome(&t.policy, now).allowed);
        let may_be_blocked =
            t.blocking.is_some_and(|b| b.may_be_blocked()) || store.hand_blocks_anyway;
        let by_block = may_be_blocked
            && (blocked_in(t, crate::algorithm::block_namespace(name))
                || (t.shadow && blocked_in(t, crate::algorithm::shadow_block_namespace(name))));
        match (by_override, by_block) {
            (Some(allowed), _) => denied_without_bucket |= !allowed && !t.shadow,
            (None, true) => denied_without_bucket |= !t.shadow,
            (None, false) => {}
        }
        asked.push(by_override.is_none() && !by_block);
    }
    if denied_without_bucket {
        return (false, vec![None; targets.len()]);
    }
    let outcomes: Vec<Option<Outcome>> = targets
        .iter()
        .zip(costs)
        .zip(&asked)
        .map(|((t, cost), &a)| a.then(|| t.evaluate(store.stored(t), now, *cost)))
        .collect();
    let call_granted = targets
        .iter()
        .zip(&outcomes)
        .all(|(t, o)| o.is_none_or(|o| o.allowed || t.shadow));
    (call_granted, outcomes)
}

/// Checks the locks one call took: every bucket it locks after a first one in ascending (namespace, key)
/// order, and a block bucket only while its key's bucket is held. A call that waits for a block bucket
/// then holds that key's bucket, so the holder of the block bucket cannot be waiting for it: only bucket
/// locks can form a cycle, and ascending order rules that out.
pub(super) fn check_lock_order(locks: &[Lock]) -> Result<(), TestCaseError> {
    let mut held: Vec<Place> = Vec::new();
    for lock in locks {
        match lock {
            Lock::Bucket(p) if held.contains(p) => {}
            Lock::Bucket(p) => {
                prop_assert!(held.iter().all(|h| h < p), "{p:?} out of order: {locks:?}");
                held.push(p.clone());
            }
            Lock::Block { bucket, owner } => {
                prop_assert!(
                    held.contains(owner),
                    "block {bucket:?} before its key's bucket: {locks:?}"
                );
            }
        }
    }
    Ok(())
}

/// What a run of a generated sequence returns: every call's answers, the tokens (in millionths) granted
/// or charged per policy bucket, and the time that passed.
type Run = (Vec<Vec<Answer>>, BTreeMap<Place, i64>, i64);

/// Runs `steps` in `world` on a store (with or without the memory of short buckets), checking every
/// call; returns every call's answers, and the tokens (in millionths) granted or charged per policy
/// bucket with the time that passed.
fn run(
    world: &[PolicySpec],
    steps: &[Step],
    with_memory: bool,
    read_only: bool,
    hand_blocks_anyway: bool,
    bulk_denies: bool,
) -> Result<Run, TestCaseError> {
    let store = TestStore {
        now: Cell::new(10 * S),
        read_only,
        hand_blocks_anyway,
        bulk_denies,
        ..TestStore::default()
    };
    let memory = Memory::default();
    let start = store.now.get();
    let mut answers_of_calls = Vec::new();
    let mut granted_tokens: BTreeMap<Place, i64> = BTreeMap::new();
    for step in steps {
        match step {
            Step::Wait(us) => store.now.set(store.now.get() + us),
            Step::Charge {
                policy,
                key,
                cost,
                max_debt,
                verdict,
            } => {
                let t = world[*policy].target(KEYS[*key], false, *verdict);
                let (before, now) = (store.stored(&t), store.now.get());
                let level = t.current(before, now).level;
                let a = single::charge(&store, &t, *cost, *max_debt)
                    .map_err(|_| TestCaseError::fail("store error"))?;
                memory.apply(std::slice::from_ref(&t), &[a]);
                prop_assert!(a.outcome.allowed || verdict.is_some());
                if let Some(v) = verdict {
                    // an override's key is charged nothing
                    prop_assert_eq!(a.outcome, v.outcome(&t.policy, now));
                    prop_assert_eq!(store.stored(&t), before);
                } else {
                    prop_assert_eq!(store.stored(&t).map(|s| s.state), Some(a.outcome.state));
                    // what the charge removed (down to its debt limit), in millionths
                    *granted_tokens.entry(place(&t)).or_default() += level - a.outcome.state.level;
                }
            }
            Step::Refund {
                policy,
                key,
                tokens,
            } => {
                let t = world[*policy].target(KEYS[*key], false, None);
                let (before, now) = (store.stored(&t), store.now.get());
                let a = single::refund(&store, &t, *tokens)
                    .map_err(|_| TestCaseError::fail("store error"))?;
                memory.apply(std::slice::from_ref(&t), &[a]);
                let (expected, _) = t.refund(before, now, *tokens);
                prop_assert_eq!(
                    store.stored(&t).map(|s| s.state),
                    expected.or(before.map(|s| s.state))
                );
                if let (Some(b), Some(after)) = (before, expected) {
                    // what it gave back, in millionths: granted again by later calls
                    *granted_tokens.entry(place(&t)).or_default() -=
                        after.level - t.current(Some(b), now).level;
                }
            }
            Step::Block {
                policy,
                key,
                duration,
            } => {
                let spec = &world[*policy];
                let t = spec.target(KEYS[*key], false, None);
                let (name, blocking) = blocks::block_of(&t).expect("a policy's key");
                store.answer(
                    &blocks::block_target(&t, &name, &blocking),
                    Ask::Block {
                        duration: *duration,
                    },
                );
                memory.forget(&t);
            }
            Step::Batch {
                policy,
                keys,
                shadow,
            } => {
                let spec = &world[*policy];
                let names: Vec<&str> = keys.iter().map(|&(k, _)| KEYS[k]).collect();
                let costs: Vec<i64> = keys.iter().map(|&(_, c)| c).collect();
                let template = spec.target("", *shadow, None);
                // what the batch must answer: each key taken alone, in the store's order, on a copy
                let copy = TestStore {
                    now: Cell::new(store.now.get()),
                    buckets: RefCell::new(store.buckets.borrow().clone()),
                    read_only,
                    hand_blocks_anyway,
                    ..TestStore::default()
                };
                let mut expected = vec![None; names.len()];
                for i in batch_order(&names) {
                    let t = spec.target(names[i], *shadow, None);
                    let a = take(&copy, |_, _, _| Ok(None), &[t], costs[i])
                        .map_err(|_| TestCaseError::fail("store error"))?;
                    expected[i] = Some(a[0].outcome);
                }
                store.locks.borrow_mut().clear();
                let mut answers = vec![None; names.len()];
                let remembered = |t: &Target<'_>, now, cost| {
                    Ok(if with_memory {
                        memory.denial(t, now, cost)
                    } else {
                        None
                    })
                };
                batch::take_each(
                    &store,
                    remembered,
                    &template,
                    &names,
                    &costs,
                    |k: batch::Key<'_>, a: Answer| {
                        assert_eq!((k.key, k.cost), (names[k.index], costs[k.index]));
                        let t = spec.target(k.key, *shadow, None);
                        memory.apply(&[t], &[a]);
                        answers[k.index] = Some(a);
                    },
                )
                .map_err(|_| TestCaseError::fail("store error"))?;
                check_lock_order(&store.locks.borrow())?;
                let answers: Vec<Answer> = answers.into_iter().flatten().collect();
                prop_assert_eq!(answers.len(), names.len(), "a key left undecided");
                for (i, a) in answers.iter().enumerate() {
                    prop_assert_eq!(Some(a.outcome), expected[i], "key {} of {:?}", i, keys);
                    if a.outcome.allowed && costs[i] > 0 {
                        let t = spec.target(names[i], *shadow, None);
                        *granted_tokens.entry(place(&t)).or_default() += costs[i] * S;
                    }
                }
                prop_assert_eq!(&*store.buckets.borrow(), &*copy.buckets.borrow());
                answers_of_calls.push(answers);
            }
            Step::Take { targets, costs } => {
                let targets: Vec<Target<'_>> = targets
                    .iter()
                    .map(|&(p, k, shadow, verdict)| world[p].target(KEYS[k], shadow, verdict))
                    .collect();
                // a block by hand is noted in its policy: the world's flag stands for that note
                let before = store.buckets.borrow().clone();
                let (expect_granted, expected) = reference(&store, &targets, costs);
                store.locks.borrow_mut().clear();
                let remembered = |t: &Target<'_>, now, cost| {
                    Ok(if with_memory {
                        memory.denial(t, now, cost)
                    } else {
                        None
                    })
                };
                let answers = take_costs(&store, remembered, &targets, costs)
                    .map_err(|_| TestCaseError::fail("store error"))?;
                memory.apply(&targets, &answers);
                check_lock_order(&store.locks.borrow())?;
                let outcomes = outcomes(&answers);
                let call_granted = granted(&targets, &outcomes);
                prop_assert_eq!(
                    call_granted,
                    expect_granted,
                    "granted? {:?} {:?}",
                    targets,
                    answers
                );
                let after = store.buckets.borrow().clone();
                for (i, t) in targets.iter().enumerate() {
                    let (a, before_t, after_t) =
                        (&answers[i], before.get(&place(t)), after.get(&place(t)));
                    if let Some(e) = expected[i] {
                        // as the reference evaluates it, but a denial its penalty box counted to a block
                        // is reported as the block
                        let blocked_now = !e.allowed
                            && t.blocking.is_some_and(|b| b.penalty_for.is_some())
                            && !a.outcome.allowed
                            && a.outcome.state.level < 0;
                        prop_assert!(
                            a.outcome == e || blocked_now,
                            "{:?}: {:?} against {:?}",
                            t,
                            a,
                            e
                        );
                    }
                    let cost = costs[i];
                    match (call_granted && cost > 0, expected[i]) {
                        // taken exactly as the reference evaluates it, or left alone (shadow mode)
                        (true, Some(e)) => {
                            if e.allowed {
                                prop_assert_eq!(after_t.map(|s| s.state), Some(e.state));
                                *granted_tokens.entry(place(t)).or_default() += cost * S;
                            } else {
                                prop_assert_eq!(after_t, before_t);
                            }
                        }
                        // a call that takes nothing leaves every policy bucket as it was
                        _ => prop_assert_eq!(after_t, before_t, "{:?} changed by {:?}", t, answers),
                    }
                    if let Some(Verdict::Exempt) = t.verdict {
                        prop_assert!(a.outcome.allowed);
                    }
                }
                answers_of_calls.push(answers.to_vec());
            }
        }
    }
    Ok((answers_of_calls, granted_tokens, store.now.get() - start))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Every call decides as the reference does, takes exactly, all or nothing, in the lock order; the
    /// memory of short buckets never changes an answer.
    #[test]
    fn every_call_decides_as_the_reference_in_the_lock_order(
        world in world(),
        steps in prop::collection::vec(step(), 1..40),
        read_only in prop::bool::weighted(0.1),
        hand_blocks_anyway in prop::bool::weighted(0.2),
        bulk_denies in any::<bool>(),
    ) {
        let (with, _, _) = run(&world, &steps, true, read_only, hand_blocks_anyway, bulk_denies)?;
        let (without, _, _) = run(&world, &steps, false, read_only, hand_blocks_anyway, bulk_denies)?;
        prop_assert_eq!(with.len(), without.len());
        for (w, wo) in with.iter().zip(&without) {
            let (w, wo) = (outcomes(w), outcomes(wo));
            prop_assert_eq!(w, wo);
        }
    }

    /// A token bucket never grants more than its burst plus what refilled over the run, whatever the
    /// mix of calls (charges count as taken).
    #[test]
    fn token_buckets_conserve_tokens(
        world in world(),
        steps in prop::collection::vec(step(), 1..60),
        bulk_denies in any::<bool>(),
    ) {
        let (_, granted_tokens, elapsed) = run(&world, &steps, true, false, false, bulk_denies)?;
        for spec in world.iter().filter(|s| s.policy.algorithm() == Algorithm::TokenBucket) {
            for key in KEYS {
                let granted = granted_tokens.get(&(spec.name.to_string(), key.to_string())).copied().unwrap_or(0);
                let debt = steps.iter().map(|s| match s { Step::Charge { max_debt, .. } => *max_debt, _ => 0 }).max().unwrap_or(0);
                let bound = (spec.policy.burst() + debt) * S + spec.policy.rate() * elapsed;
                prop_assert!(granted <= bound, "{} {}: {} granted > {}", spec.name, key, granted, bound);
            }
        }
    }
}
