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
    /// Microseconds until the call could be granted; `None` when allowed or never possible.
    pub retry_after: Option<i64>,
    /// Microseconds until the reported bucket is full.
    pub reset_after: i64,
    /// The reported policy (`None` for ad-hoc limits).
    pub policy: Option<String>,
}

impl Decision {
    /// Combines the outcomes of one call's buckets (`names[i]` is the policy of `outcomes[i]`, `None` for
    /// ad-hoc and request buckets; `limits[i]` its capacity). Allowed: every bucket granted; the reported bucket is the one with
    /// the fewest tokens left. Denied: the reported bucket is the denying one with the longest wait (a
    /// bucket that can never grant counts as the longest), and `retry_after` is that wait: by then every
    /// other bucket grants too, since tokens only accumulate while nobody takes.
    pub fn combine(names: &[Option<&str>], limits: &[i64], outcomes: &[Outcome]) -> Decision {
        let allowed = outcomes.iter().all(|o| o.allowed);
        let pick = if allowed {
            (0..outcomes.len()).min_by_key(|&i| outcomes[i].remaining)
        } else {
            (0..outcomes.len())
                .filter(|&i| !outcomes[i].allowed)
                .max_by_key(|&i| outcomes[i].retry_after.unwrap_or(i64::MAX))
        }
        .unwrap_or(0);
        let o = &outcomes[pick];
        Decision {
            allowed,
            remaining: o.remaining.max(0),
            limit: limits[pick],
            retry_after: if allowed { None } else { o.retry_after },
            reset_after: o.reset_after,
            policy: names[pick].map(str::to_string),
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

    #[test]
    fn allowed_reports_the_tightest_bucket() {
        let d = Decision::combine(
            &[Some("user"), Some("org")],
            &[10, 100],
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
                policy: Some("org".into())
            }
        );
    }

    #[test]
    fn denied_reports_the_longest_wait() {
        let d = Decision::combine(
            &[Some("a"), Some("b"), Some("c")],
            &[1, 2, 3],
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
            &[Some("a"), None],
            &[1, 2],
            &[outcome(false, 0, Some(5), 5), outcome(false, 2, None, 0)],
        );
        assert_eq!((never.retry_after, never.policy), (None, None));
    }
}
