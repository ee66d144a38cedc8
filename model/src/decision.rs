//! What a call decided: combining the outcomes of one call's buckets into the record `rate_limit.decision`
//! reports (the extension builds the SQL value from it).

use crate::algorithm::Outcome;

/// What a call decided, as `rate_limit.decision` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether every bucket granted.
    pub allowed: bool,
    /// Whole tokens left in the reported bucket (never negative).
    pub remaining: i64,
    /// The reported bucket's capacity.
    pub limit: i64,
    /// Microseconds until the call could be granted; `None` when allowed or never possible. A granted
    /// booking (`rate_limit.book`): microseconds until its tokens exist, the time to come back.
    pub retry_after: Option<i64>,
    /// Microseconds until the reported bucket is full.
    pub reset_after: i64,
    /// The reported policy (`None` for ad-hoc limits).
    pub policy: Option<String>,
    /// A bucket in shadow mode would have denied this call, which was allowed: the reported bucket is that
    /// one (with `retry_after` `None`, as the call was allowed).
    pub shadow_denied: bool,
    /// The lease an acquire got (concurrency policies), the reservation a reserve made or a settle
    /// settled, or the booking a book made for later or a cancel cancelled; `None` for every other call.
    pub lease: Option<i64>,
}

/// What a call's decision needs to know of one of its buckets besides its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reported<'a> {
    /// The bucket's policy (`None` for ad-hoc and request buckets).
    pub name: Option<&'a str>,
    /// Its capacity.
    pub limit: i64,
    /// Whether it is in shadow mode (never denies).
    pub shadow: bool,
}

impl Decision {
    /// Combines the outcomes of one call's buckets (`buckets[i]` describes the bucket of `outcomes[i]`).
    /// Allowed: every bucket not in shadow mode granted. The reported bucket is, when everything granted,
    /// the one with the fewest tokens left; otherwise a denying one with the longest wait (a bucket that can
    /// never grant counts as the longest), and `retry_after` is that wait: by then every other bucket grants
    /// too, since tokens only accumulate while nobody takes. A denial by a bucket not in shadow mode is
    /// reported before any in shadow mode; a call allowed although a bucket in shadow mode denied it
    /// reports that bucket, with `shadow_denied`.
    pub fn combine(buckets: &[Reported<'_>], outcomes: &[Outcome]) -> Decision {
        let enforced_denial = |i: &usize| !outcomes[*i].allowed && !buckets[*i].shadow;
        let allowed = !(0..outcomes.len()).any(|i| enforced_denial(&i));
        let shadow_denied = allowed && outcomes.iter().any(|o| !o.allowed);
        let wait = |i: &usize| outcomes[*i].retry_after.unwrap_or(i64::MAX);
        let pick = if shadow_denied {
            (0..outcomes.len())
                .filter(|&i| !outcomes[i].allowed)
                .max_by_key(wait)
        } else if allowed {
            (0..outcomes.len()).min_by_key(|&i| outcomes[i].remaining)
        } else {
            (0..outcomes.len()).filter(enforced_denial).max_by_key(wait)
        }
        .unwrap_or(0);
        let o = &outcomes[pick];
        Decision {
            allowed,
            remaining: o.remaining.max(0),
            limit: buckets[pick].limit,
            retry_after: if allowed { None } else { o.retry_after },
            reset_after: o.reset_after,
            policy: buckets[pick].name.map(str::to_string),
            shadow_denied,
            lease: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::State;

    fn outcome(allowed: bool, remaining: i64, retry: Option<i64>, reset: i64) -> Outcome {
        Outcome {
            allowed,
            state: State { level: 0, at: 0 },
            remaining,
            retry_after: retry,
            reset_after: reset,
        }
    }

    fn buckets<'a>(
        names: &[Option<&'a str>],
        limits: &[i64],
        shadow: &[bool],
    ) -> Vec<Reported<'a>> {
        names
            .iter()
            .zip(limits)
            .zip(shadow)
            .map(|((&name, &limit), &shadow)| Reported {
                name,
                limit,
                shadow,
            })
            .collect()
    }

    #[test]
    fn allowed_reports_the_tightest_bucket() {
        let d = Decision::combine(
            &buckets(&[Some("user"), Some("org")], &[10, 100], &[false, false]),
            &[outcome(true, 7, None, 3), outcome(true, 2, None, 9)],
        );
        assert_eq!(
            d,
            Decision {
                allowed: true,
                remaining: 2,
                limit: 100,
                retry_after: None,
                reset_after: 9,
                policy: Some("org".into()),
                shadow_denied: false,
                lease: None,
            }
        );
    }

    #[test]
    fn denied_reports_the_longest_wait() {
        let d = Decision::combine(
            &buckets(&[Some("a"), Some("b"), Some("c")], &[1, 2, 3], &[false; 3]),
            &[
                outcome(false, 0, Some(5), 5),
                outcome(true, 1, None, 1),
                outcome(false, 0, Some(8), 8),
            ],
        );
        assert_eq!(
            (d.allowed, d.retry_after, d.policy.as_deref(), d.limit),
            (false, Some(8), Some("c"), 3)
        );
        let never = Decision::combine(
            &buckets(&[Some("a"), None], &[1, 2], &[false, false]),
            &[outcome(false, 0, Some(5), 5), outcome(false, 2, None, 0)],
        );
        assert_eq!((never.retry_after, never.policy), (None, None));
    }

    #[test]
    fn a_denial_in_shadow_mode_allows_and_is_reported() {
        let outcomes = [outcome(true, 4, None, 2), outcome(false, 0, Some(9), 9)];
        let d = Decision::combine(
            &buckets(&[Some("live"), Some("trial")], &[5, 3], &[false, true]),
            &outcomes,
        );
        assert_eq!(
            d,
            Decision {
                allowed: true,
                remaining: 0,
                limit: 3,
                retry_after: None,
                reset_after: 9,
                policy: Some("trial".into()),
                shadow_denied: true,
                lease: None,
            }
        );
        // an enforced denial is reported before a longer one in shadow mode
        let outcomes = [outcome(false, 0, Some(2), 2), outcome(false, 0, Some(9), 9)];
        let d = Decision::combine(
            &buckets(&[Some("live"), Some("trial")], &[5, 3], &[false, true]),
            &outcomes,
        );
        assert_eq!(
            (
                d.allowed,
                d.retry_after,
                d.policy.as_deref(),
                d.shadow_denied
            ),
            (false, Some(2), Some("live"), false)
        );
    }
}
