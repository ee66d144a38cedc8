//! When a backend adds its denials to the shared summary of the keys denied most. A client hammering a key
//! is denied many times in a row; adding each denial to the shared summary would make every backend write
//! the same cache lines under the summary's lock. So a backend keeps the denials of the last key it denied
//! as one [`Batch`] and hands it over ([`note`]) after [`FLUSH_AFTER_DENIALS`] denials, when another key is
//! denied, or [`FLUSH_AFTER_US`] after the first of them ([`Batch::due`], checked at each denial and at the
//! end of each transaction); the extension also hands it over when the backend reads or resets the
//! statistics and when it exits.

/// Denials of one key a backend adds to the summary at once, at most.
pub const FLUSH_AFTER_DENIALS: u64 = 64;
/// How long (µs) a backend keeps denials from the summary, at most, while it runs transactions.
pub const FLUSH_AFTER_US: i64 = 100_000;

/// Denials of one key (in one policy's summary) not yet added to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// The summary's entry (one per database and policy).
    pub entry: u32,
    /// The key's keyed hash.
    pub hash: u64,
    /// The key.
    pub key: String,
    /// Denials counted.
    pub count: u64,
    /// When the first of them happened (µs).
    pub since: i64,
}

impl Batch {
    /// Whether the batch must be added now (it is full, or its first denial is old enough).
    pub fn due(&self, now: i64) -> bool {
        self.count >= FLUSH_AFTER_DENIALS || now.saturating_sub(self.since) >= FLUSH_AFTER_US
    }
}

/// Counts a denial of `key` (hash `hash`) in summary `entry` at `now` into `pending`; returns the batch to
/// add to the summary now, if any: the pending one when it is due or when it is of another key.
pub fn note(
    pending: &mut Option<Batch>,
    entry: u32,
    hash: u64,
    key: &str,
    now: i64,
) -> Option<Batch> {
    match pending.as_mut() {
        Some(p) if p.entry == entry && p.hash == hash => {
            p.count += 1;
            if p.due(now) {
                pending.take()
            } else {
                None
            }
        }
        _ => pending.replace(Batch {
            entry,
            hash,
            key: key.to_string(),
            count: 1,
            since: now,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_denials_of_one_key_are_handed_over_in_full_batches() {
        let mut pending = None;
        let mut handed = Vec::new();
        for i in 0..200 {
            if let Some(b) = note(&mut pending, 1, 7, "k", i) {
                handed.push(b.count);
            }
        }
        assert_eq!(handed, vec![64, 64, 64]);
        assert_eq!(pending.as_ref().map(|p| p.count), Some(8));
        // every denial is counted once: handed over or still pending
        assert_eq!(handed.iter().sum::<u64>() + 8, 200);
    }

    #[test]
    fn another_key_or_policy_hands_over_the_pending_batch() {
        let mut pending = None;
        assert_eq!(note(&mut pending, 1, 7, "k", 0), None);
        assert_eq!(note(&mut pending, 1, 7, "k", 1), None);
        let previous = note(&mut pending, 1, 8, "other", 2).expect("handed over");
        assert_eq!((previous.key.as_str(), previous.count), ("k", 2));
        let previous = note(&mut pending, 2, 8, "other", 3).expect("another policy");
        assert_eq!((previous.entry, previous.count), (1, 1));
        assert_eq!(pending.as_ref().map(|p| (p.entry, p.count)), Some((2, 1)));
    }

    #[test]
    fn an_old_batch_is_due_and_handed_over_at_its_next_denial() {
        let mut pending = None;
        note(&mut pending, 1, 7, "k", 1_000);
        let batch = pending.clone().expect("pending");
        assert!(!batch.due(1_000 + FLUSH_AFTER_US - 1));
        assert!(batch.due(1_000 + FLUSH_AFTER_US));
        assert!(
            !batch.due(i64::MIN),
            "a clock that went back makes nothing due"
        );
        let handed = note(&mut pending, 1, 7, "k", 1_000 + FLUSH_AFTER_US).expect("due");
        assert_eq!(handed.count, 2);
        assert_eq!(pending, None);
    }
}
