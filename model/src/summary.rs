//! The heavy-hitters summary behind `rate_limit.top_limited`: Space-Saving (Metwally, Agrawal and El
//! Abbadi, "Efficient Computation of Frequent and Top-k Elements in Data Streams", 2005) over the denied
//! keys of one policy, in a fixed array of [`TOP_KEYS`] counters. Pure Rust, no PostgreSQL types; the
//! shared-memory code keeps one [`Summary`] per policy and calls [`Summary::record`] under that policy's
//! lock.
//!
//! Each counter holds a key, a `count` and an `error`. A key already counted is incremented; a new key takes
//! a free counter, or else replaces the counter with the smallest count `m`, starting at `m + 1` with
//! `error = m`. With `N` denials recorded and `k` counters:
//! - every counter overestimates its key: `count - error <= true denials <= count`;
//! - the smallest count, hence every `error`, is at most `N / k`;
//! - every key denied more than `N / k` times is in the summary.
//!
//! The property tests below check these bounds against exact counting.

/// Counters per policy: keys denied more than 1/32 of a policy's denials are always listed.
pub const TOP_KEYS: usize = 32;

/// Bytes of a key kept for display (longer keys end with an ellipsis in the view).
pub const KEY_PREFIX: usize = 46;

/// One counter: a key (its 64-bit keyed hash identifies it, its first bytes are shown), its count and the
/// count it may have inherited from the key it replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Counter {
    /// Keyed hash of the whole key; 0 with `count == 0` marks a free counter.
    pub hash: u64,
    /// Denials counted for this key (an overestimate by at most `error`).
    pub count: u64,
    /// The count inherited when this key replaced another.
    pub error: u64,
    /// Length of the whole key in bytes.
    pub key_len: u16,
    /// The first bytes of the key.
    pub key_prefix: [u8; KEY_PREFIX],
}

impl Counter {
    /// A free counter.
    pub const EMPTY: Counter = Counter {
        hash: 0,
        count: 0,
        error: 0,
        key_len: 0,
        key_prefix: [0; KEY_PREFIX],
    };

    /// The displayed key: the prefix, with `…` when the key was longer (cut at a character boundary).
    pub fn display_key(&self) -> String {
        let kept = usize::from(self.key_len).min(KEY_PREFIX);
        let text = String::from_utf8_lossy(&self.key_prefix[..kept]);
        if usize::from(self.key_len) > KEY_PREFIX {
            let text = text.trim_end_matches('\u{FFFD}');
            format!("{text}…")
        } else {
            text.into_owned()
        }
    }
}

/// The Space-Saving summary of one policy's denied keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Summary {
    /// The counters; free ones have `count == 0`.
    pub counters: [Counter; TOP_KEYS],
}

impl Default for Summary {
    fn default() -> Self {
        Summary {
            counters: [Counter::EMPTY; TOP_KEYS],
        }
    }
}

impl Summary {
    /// Records `weight` denials of the key whose keyed hash is `hash` (`key` is its text, for display).
    pub fn record(&mut self, hash: u64, key: &[u8], weight: u64) {
        let weight = weight.max(1);
        let mut smallest = 0;
        for i in 0..TOP_KEYS {
            let c = &mut self.counters[i];
            if c.count != 0 && c.hash == hash {
                c.count = c.count.saturating_add(weight);
                return;
            }
            if c.count < self.counters[smallest].count {
                smallest = i;
            }
        }
        let c = &mut self.counters[smallest];
        let inherited = c.count;
        let mut prefix = [0u8; KEY_PREFIX];
        let kept = key.len().min(KEY_PREFIX);
        prefix[..kept].copy_from_slice(&key[..kept]);
        *c = Counter {
            hash,
            count: inherited.saturating_add(weight),
            error: inherited,
            key_len: u16::try_from(key.len()).unwrap_or(u16::MAX),
            key_prefix: prefix,
        };
    }

    /// The counted keys, most denied first (ties: smaller error first).
    pub fn ranked(&self) -> Vec<Counter> {
        let mut counted: Vec<Counter> = self
            .counters
            .iter()
            .filter(|c| c.count != 0)
            .copied()
            .collect();
        counted.sort_by(|a, b| b.count.cmp(&a.count).then(a.error.cmp(&b.error)));
        counted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn hash(key: u32) -> u64 {
        u64::from(key) + 1
    }

    #[test]
    fn counts_exactly_while_there_is_room() {
        let mut s = Summary::default();
        for (key, times) in [(1u32, 5u64), (2, 3), (3, 1)] {
            for _ in 0..times {
                s.record(hash(key), key.to_string().as_bytes(), 1);
            }
        }
        let ranked: Vec<(String, u64, u64)> = s
            .ranked()
            .iter()
            .map(|c| (c.display_key(), c.count, c.error))
            .collect();
        assert_eq!(
            ranked,
            vec![
                ("1".to_string(), 5, 0),
                ("2".to_string(), 3, 0),
                ("3".to_string(), 1, 0)
            ]
        );
    }

    #[test]
    fn a_new_key_replaces_the_smallest_counter_and_inherits_its_count() {
        let mut s = Summary::default();
        for key in 0..TOP_KEYS as u32 {
            s.record(hash(key), b"k", 2);
        }
        s.record(hash(1000), b"newcomer", 1);
        let newcomer = s
            .counters
            .iter()
            .find(|c| c.hash == hash(1000))
            .expect("listed");
        assert_eq!((newcomer.count, newcomer.error), (3, 2));
    }

    #[test]
    fn long_keys_are_shown_with_an_ellipsis() {
        let mut s = Summary::default();
        let key = "é".repeat(40); // 80 bytes: the prefix ends inside a character
        s.record(7, key.as_bytes(), 1);
        let shown = s.ranked()[0].display_key();
        assert!(shown.ends_with('…') && shown.starts_with("ééé"), "{shown}");
        assert!(!shown.contains('\u{FFFD}'));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Against exact counting: each listed count overestimates by at most its error, every error is at
        /// most N / k, and every key denied more than N / k times is listed.
        #[test]
        fn bounds_hold_against_exact_counts(
            stream in prop::collection::vec((0u32..200, 1u64..4), 1..3000),
            skew in 0u32..200,
        ) {
            let mut s = Summary::default();
            let mut exact: HashMap<u32, u64> = HashMap::new();
            let mut total = 0u64;
            for (raw, weight) in stream {
                // a skewed stream: small keys are much more frequent
                let key = (raw * raw) / (skew + 1) % 200;
                s.record(hash(key), key.to_string().as_bytes(), weight);
                *exact.entry(key).or_default() += weight;
                total += weight;
            }
            let bound = total / TOP_KEYS as u64;
            for c in s.ranked() {
                let key: u32 = c.display_key().parse().unwrap();
                let truth = exact[&key];
                prop_assert!(c.count >= truth, "count {} under the truth {}", c.count, truth);
                prop_assert!(c.count - c.error <= truth, "guaranteed part {} over the truth {}", c.count - c.error, truth);
                prop_assert!(c.error <= bound, "error {} over N/k = {}", c.error, bound);
            }
            for (key, truth) in &exact {
                if *truth > bound {
                    prop_assert!(s.counters.iter().any(|c| c.count != 0 && c.hash == hash(*key)),
                        "key {} denied {} > N/k = {} times is missing", key, truth, bound);
                }
            }
        }
    }
}
