//! Blocks: a key of a policy denied outright for a while, by hand (`rate_limit.block`) or by the policy's
//! penalty box (`block_after` denials within one window of the policy block the key for `block_for`).
//!
//! A key's block lives in a bucket of its own beside the key's bucket: namespace [`block_namespace`] (the
//! policy's name, U+001F, `block`) and the caller's key, so it sits where the key's other buckets do (the
//! same Citus shard, the same database's share of the memory store). Its numbers ([`Policy::block_bucket`])
//! are algorithm [`Algorithm::Block`], `rate` = `burst` = the penalty box's `block_after` (1 when the policy
//! has none) and `period_us` = the policy's window, in which denials are counted. Its state is either
//!
//! | `level`  | meaning                                                                   | `at`                  |
//! | -------- | ------------------------------------------------------------------------- | --------------------- |
//! | `>= 0`   | denials counted in the window `[at, at + period_us)`, opened by the first | when the window opened |
//! | `< 0`    | blocked for `-level` µs                                                   | when the block began  |
//!
//! A bucket neither blocked nor counting (its block over, its window past, or no denial counted) is full:
//! a store may delete it, as it deletes any full bucket, and a missing one is exactly that. Time is
//! measured from `at`: a clock read before `at` (a clock stepped back) counts as no time elapsed since the
//! block began or the window opened, so a block never ends early and lasts at most the step longer.
//!
//! Reported as a bucket (a take of 0 tokens, which is all a block bucket answers to): a blocked key is
//! denied with `retry_after` and `reset_after` the time until its block ends and nothing `remaining`;
//! otherwise allowed, with `remaining` the denials the penalty box still tolerates in the open window.

use super::*;

/// The longest block, in microseconds: 100 years (so that `at + duration` never overflows).
pub const MAX_BLOCK_US: i64 = 100 * 366 * 86_400 * 1_000_000;

/// The namespace of the block buckets of policy `policy`'s keys: the policy's name, U+001F and `block`. No
/// policy is called that (policy names are printable ASCII), nor any lease slot (theirs end in a number).
pub fn block_namespace(policy: &str) -> String {
    crate::target::policy_part(policy, "block")
}

/// The namespace of the block buckets a policy's penalty box writes while its key's calls are in shadow
/// mode: the policy's name, U+001F and `shadow block`. Kept apart from [`block_namespace`] so that a block
/// a shadowed penalty box would have made is reported (as a would-be denial) while shadow mode lasts and
/// never enforced after it ends.
pub fn shadow_block_namespace(policy: &str) -> String {
    crate::target::policy_part(policy, "shadow block")
}

/// A state's block or window, read at `now` (never before `at`).
enum BlockState {
    /// Blocked until this instant.
    Blocked { until: i64 },
    /// `count` denials in the window that ends at `until`.
    Counting { count: i64, until: i64 },
    /// Neither: the bucket is full.
    Clear,
}

impl Policy {
    /// The numbers of the block buckets of a policy whose window is `window_us` and whose penalty box blocks
    /// after `block_after` denials (`None`: the policy has no penalty box, only blocks by hand).
    pub fn block_bucket(block_after: Option<i64>, window_us: i64) -> Result<Policy, PolicyError> {
        let n = block_after.unwrap_or(1);
        Policy::new(Algorithm::Block, n, window_us, n)
    }

    fn block_state(&self, state: State, now: i64) -> BlockState {
        let now = now.max(state.at);
        if state.level < 0 {
            let until = state.at.saturating_add(state.level.saturating_neg());
            if now < until {
                return BlockState::Blocked { until };
            }
        } else if state.level > 0 {
            let until = state.at.saturating_add(self.period_us());
            if now < until {
                return BlockState::Counting {
                    count: state.level,
                    until,
                };
            }
        }
        BlockState::Clear
    }

    /// Whether a block bucket's `state` blocks its key at `now`.
    pub fn blocked(&self, state: State, now: i64) -> bool {
        matches!(self.block_state(state, now), BlockState::Blocked { .. })
    }

    /// A block bucket reported at `now` (see the module comment); its state is the stored one, or the
    /// missing bucket's when it is clear.
    pub fn block_outcome(&self, state: State, now: i64) -> Outcome {
        let at = now.max(state.at);
        match self.block_state(state, now) {
            BlockState::Blocked { until: end } => {
                let wait = until(end.into(), at);
                Outcome {
                    allowed: false,
                    state,
                    remaining: 0,
                    retry_after: Some(wait),
                    reset_after: wait,
                }
            }
            BlockState::Counting { count, until: end } => Outcome {
                allowed: true,
                state,
                remaining: (self.rate() - count).max(0),
                retry_after: None,
                reset_after: until(end.into(), at),
            },
            BlockState::Clear => Outcome {
                allowed: true,
                state: self.full(now),
                remaining: self.rate(),
                retry_after: None,
                reset_after: 0,
            },
        }
    }

    /// Counts one denial of the key at `now` in its block bucket `state` (the penalty box): the first
    /// denial opens a window of `period_us`; the `rate`-th denial within it blocks the key for
    /// `block_for` µs from `now`. A key already blocked stays as it is. Always allowed: the state to write.
    pub fn count_denial(&self, state: State, now: i64, block_for: i64) -> Outcome {
        let count = match self.block_state(state, now) {
            BlockState::Blocked { .. } => return self.block_outcome(state, now),
            BlockState::Counting { count, .. } => count + 1,
            BlockState::Clear => 1,
        };
        let at = now.max(state.at);
        let after = if count >= self.rate() {
            State {
                level: -block_for.clamp(1, MAX_BLOCK_US),
                at: now,
            }
        } else if count == 1 {
            State { level: 1, at: now }
        } else {
            State {
                level: count,
                at: state.at,
            }
        };
        Outcome {
            allowed: true,
            ..self.block_outcome(after, at)
        }
    }

    /// Blocks the key for `duration` µs from `now`, whatever its block bucket held (a block by hand replaces
    /// an earlier block and the denials counted). Always allowed: the state to write.
    pub fn block_for(&self, now: i64, duration: i64) -> Outcome {
        let state = State {
            level: -duration.clamp(1, MAX_BLOCK_US),
            at: now,
        };
        Outcome {
            allowed: true,
            ..self.block_outcome(state, now)
        }
    }

    /// The denials a block bucket still tolerates at `now`, as tokens (0 while blocked), for display.
    pub(super) fn block_tokens(&self, state: State, now: i64) -> i64 {
        self.block_outcome(state, now).remaining
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: i64 = 1_000_000;

    fn bucket(n: i64) -> Policy {
        Policy::block_bucket(Some(n), 60 * S).unwrap()
    }

    #[test]
    fn the_nth_denial_within_a_window_blocks_for_block_for() {
        let p = bucket(3);
        let t0 = 1_000 * S;
        let a = p.count_denial(p.full(t0), t0, 3600 * S);
        assert_eq!(a.state, State { level: 1, at: t0 });
        assert_eq!((a.remaining, a.reset_after), (2, 60 * S));
        let b = p.count_denial(a.state, t0 + 10 * S, 3600 * S);
        assert_eq!(b.state, State { level: 2, at: t0 });
        assert_eq!((b.remaining, b.reset_after), (1, 50 * S));
        let c = p.count_denial(b.state, t0 + 59 * S, 3600 * S);
        assert!(c.allowed, "a count is always written");
        assert_eq!(
            c.state,
            State {
                level: -3600 * S,
                at: t0 + 59 * S
            }
        );
        let r = p.block_outcome(c.state, t0 + 60 * S);
        assert!(!r.allowed);
        assert_eq!(r.remaining, 0);
        assert_eq!(r.retry_after, Some(3599 * S));
        assert_eq!(r.reset_after, 3599 * S);
        // the block ends exactly block_for after the denial that started it
        assert!(p.blocked(c.state, t0 + 59 * S + 3600 * S - 1));
        assert!(!p.blocked(c.state, t0 + 59 * S + 3600 * S));
        assert!(p.is_full(c.state, t0 + 59 * S + 3600 * S));
    }

    #[test]
    fn denials_in_different_windows_do_not_add_up() {
        let p = bucket(2);
        let t0 = 5 * S;
        let a = p.count_denial(p.full(t0), t0, 10 * S);
        // the window opened by the first denial has passed: this one opens a new window
        let b = p.count_denial(a.state, t0 + 60 * S, 10 * S);
        assert_eq!(
            b.state,
            State {
                level: 1,
                at: t0 + 60 * S
            }
        );
        assert!(!p.blocked(b.state, t0 + 60 * S));
        assert!(p.is_full(a.state, t0 + 60 * S), "a past window is full");
        let c = p.count_denial(b.state, t0 + 119 * S, 10 * S);
        assert!(p.blocked(c.state, t0 + 119 * S));
    }

    #[test]
    fn a_blocked_key_stays_blocked_when_denied_again() {
        let p = bucket(1);
        let blocked = p.count_denial(p.full(0), 0, 30 * S);
        let again = p.count_denial(blocked.state, 20 * S, 30 * S);
        assert_eq!(again.state, blocked.state, "the block is not extended");
        assert_eq!(again.retry_after, Some(10 * S));
    }

    #[test]
    fn a_block_by_hand_replaces_what_the_bucket_held() {
        let p = bucket(5);
        let counted = p.count_denial(p.full(0), 0, S);
        let b = p.block_for(7 * S, 2 * S);
        assert_eq!(
            b.state,
            State {
                level: -2 * S,
                at: 7 * S
            }
        );
        assert!(p.blocked(b.state, 8 * S) && !p.blocked(b.state, 9 * S));
        assert!(!p.blocked(counted.state, 8 * S));
        // absurd durations are clamped, and nothing overflows
        let long = p.block_for(i64::MAX / 2, i64::MAX);
        assert_eq!(long.state.level, -MAX_BLOCK_US);
        assert!(p.blocked(long.state, i64::MAX / 2 + MAX_BLOCK_US - 1));
        assert!(!p.blocked(long.state, i64::MAX));
    }

    #[test]
    fn a_clock_read_before_the_block_counts_no_time() {
        let p = bucket(1);
        let b = p.block_for(100 * S, 10 * S);
        let r = p.block_outcome(b.state, 50 * S);
        assert_eq!(r.retry_after, Some(10 * S));
    }

    #[test]
    fn carry_over_keeps_a_block_under_new_numbers() {
        let old = bucket(3);
        let new = Policy::block_bucket(None, 5 * S).unwrap();
        let b = old.block_for(0, 100 * S);
        let carried = new.carry_over(b.state, &old, 10 * S, 20 * S);
        assert!(new.blocked(carried, 20 * S));
        assert_eq!(new.block_outcome(carried, 20 * S).retry_after, Some(80 * S));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Against a log of denial instants: a key is blocked after a denial exactly when `n` denials fell in
        /// the window opened by the first denial since the last block ended or window passed, and a block
        /// lasts exactly `block_for`.
        #[test]
        fn counting_matches_a_log_of_denials(
            n in 1i64..=5,
            gaps in proptest::collection::vec(0i64..40, 1..60),
        ) {
            let window = 30;
            let block_for = 45;
            let p = Policy::block_bucket(Some(n), window).unwrap();
            let mut state = p.full(0);
            let mut now = 0;
            // the slow model: open window start and its denials, or the block's end
            let mut window_start: Option<i64> = None;
            let mut denials = 0;
            let mut blocked_until: Option<i64> = None;
            for g in gaps {
                now += g;
                let model_blocked = blocked_until.is_some_and(|u| now < u);
                prop_assert_eq!(p.blocked(state, now), model_blocked);
                if !model_blocked {
                    blocked_until = None;
                    if window_start.is_none_or(|s| now >= s + window) {
                        window_start = Some(now);
                        denials = 0;
                    }
                    denials += 1;
                    if denials >= n {
                        blocked_until = Some(now + block_for);
                        window_start = None;
                        denials = 0;
                    }
                }
                state = p.count_denial(state, now, block_for).state;
                let o = p.block_outcome(state, now);
                match blocked_until {
                    Some(u) => prop_assert_eq!(o.retry_after, Some(u - now)),
                    None => prop_assert_eq!(o.remaining, n - denials),
                }
                prop_assert_eq!(p.is_full(state, now), blocked_until.is_none() && denials == 0);
            }
        }
    }
}
