//! How far a streaming standby's wall clock is off its primary's, learned from the replication stream; and
//! the shift the table store's clock keeps after a promotion, so that a promoted standby whose clock is off
//! neither refills every bucket (clock ahead: a burst per key) nor holds them back (clock behind).
//!
//! Every message a primary sends its standby carries the instant it was sent (on the primary's clock), and
//! the standby notes the instant it received it (on its own). `receipt - send` is the skew plus the
//! message's transit time, which is never negative: the smallest of recent samples is the best estimate,
//! too high by the shortest transit. An estimate within [`DEAD_BAND_US`] of zero is a transit time, not a
//! skew, and counts as none.
//!
//! The table store's clock is the wall clock minus the shift. A server inherits the shift of the primary
//! it was copied from (its data directory's file); a standby adds the skew it measures to it, and keeps the
//! sum as its own shift when promoted. Rows written on the primary's table clock are then read on the same
//! clock after the promotion, whatever the two wall clocks say.

/// Samples the estimate is the smallest of (the newest ones).
pub const SAMPLES: usize = 16;

/// Estimates of at most this many microseconds either way count as no skew (5 ms: a transit time; a skew
/// that small refills at most 5 ms of tokens once).
pub const DEAD_BAND_US: i64 = 5_000;

/// The recent samples of one standby's skew.
#[derive(Clone, Debug, Default)]
pub struct Estimator {
    samples: Vec<i64>,
    next: usize,
    last_receipt: Option<i64>,
}

impl Estimator {
    /// Notes one message: sent at `send` (the primary's clock, µs), received at `receipt` (this server's).
    /// Ignored, and false returned: a message already noted (the same receipt instant), an instant of zero
    /// (none received yet), and two equal instants (what PostgreSQL's WAL receiver sets both to, from its
    /// own clock, when it starts: no message at all).
    pub fn note(&mut self, send: i64, receipt: i64) -> bool {
        if send == 0 || receipt == 0 || send == receipt || self.last_receipt == Some(receipt) {
            return false;
        }
        self.last_receipt = Some(receipt);
        let sample = receipt.saturating_sub(send);
        if self.samples.len() < SAMPLES {
            self.samples.push(sample);
        } else {
            self.samples[self.next] = sample;
        }
        self.next = (self.next + 1) % SAMPLES;
        true
    }

    /// The skew (µs, positive when this server's clock is ahead of the primary's): the smallest recent
    /// sample, 0 inside the dead band; `None` before any sample.
    pub fn skew(&self) -> Option<i64> {
        let smallest = self.samples.iter().copied().min()?;
        Some(if smallest.abs() <= DEAD_BAND_US {
            0
        } else {
            smallest
        })
    }
}

/// The shift of a server that inherited `inherited` and measured `skew` against its primary (none: it
/// measured nothing, and keeps what it inherited).
pub fn shift(inherited: i64, skew: Option<i64>) -> i64 {
    inherited.saturating_add(skew.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOUR: i64 = 3_600_000_000;

    #[test]
    fn no_sample_is_no_estimate_and_keeps_the_inherited_shift() {
        let e = Estimator::default();
        assert_eq!(e.skew(), None);
        assert_eq!(shift(7, e.skew()), 7);
    }

    #[test]
    fn the_smallest_sample_is_the_estimate() {
        let mut e = Estimator::default();
        assert!(e.note(1_000_000, 1_000_000 + HOUR + 40_000));
        assert!(e.note(2_000_000, 2_000_000 + HOUR + 9_000));
        assert!(e.note(3_000_000, 3_000_000 + HOUR + 25_000));
        assert_eq!(e.skew(), Some(HOUR + 9_000));
        assert_eq!(shift(0, e.skew()), HOUR + 9_000);
    }

    #[test]
    fn a_clock_behind_gives_a_negative_skew() {
        let mut e = Estimator::default();
        e.note(10 * HOUR, 9 * HOUR + 300);
        assert_eq!(e.skew(), Some(-HOUR + 300));
    }

    #[test]
    fn the_same_message_and_empty_instants_are_not_samples() {
        let mut e = Estimator::default();
        assert!(!e.note(0, 5));
        assert!(!e.note(5, 0));
        assert!(
            !e.note(77, 77),
            "a receiver that just started: both instants are its own clock's"
        );
        assert!(e.note(100, 100 + HOUR));
        assert!(
            !e.note(50, 100 + HOUR),
            "the same receipt instant: the same message"
        );
        assert_eq!(e.skew(), Some(HOUR));
    }

    #[test]
    fn a_transit_time_is_no_skew() {
        let mut e = Estimator::default();
        e.note(1_000, 1_000 + DEAD_BAND_US);
        assert_eq!(e.skew(), Some(0));
        e.note(2_000, 2_000 - DEAD_BAND_US);
        assert_eq!(e.skew(), Some(0));
        let mut e = Estimator::default();
        e.note(1_000, 1_000 + DEAD_BAND_US + 1);
        assert_eq!(e.skew(), Some(DEAD_BAND_US + 1));
    }

    #[test]
    fn old_samples_are_forgotten() {
        let mut e = Estimator::default();
        e.note(1, 1 - HOUR); // the clock was an hour behind, then fixed
        for i in 0..SAMPLES as i64 {
            e.note(1_000 + i, 1_000 + i + 20_000);
        }
        assert_eq!(e.skew(), Some(20_000));
    }

    proptest! {
        /// Whatever the transit times, the estimate lies between the true skew and the true skew plus the
        /// shortest transit (or is 0 inside the dead band), and the shifted clock reads the primary's clock
        /// within that transit.
        #[test]
        fn the_estimate_is_the_skew_plus_the_shortest_transit(
            skew in -2 * HOUR..2 * HOUR,
            transits in proptest::collection::vec(0i64..50_000, 1..40),
        ) {
            let mut e = Estimator::default();
            for (i, t) in transits.iter().enumerate() {
                let send = 1_000_000 + i as i64 * 1_000_000;
                e.note(send, send + skew + t);
            }
            let kept = &transits[transits.len().saturating_sub(SAMPLES)..];
            let shortest = *kept.iter().min().expect("samples");
            let estimate = e.skew().expect("an estimate");
            if (skew + shortest).abs() <= DEAD_BAND_US {
                prop_assert_eq!(estimate, 0);
            } else {
                prop_assert_eq!(estimate, skew + shortest);
            }
            // the primary's clock at some instant, read on this server's shifted clock
            let primary = 123 * HOUR;
            let read = (primary + skew) - shift(0, Some(estimate));
            prop_assert!((read - primary).abs() <= shortest.max(DEAD_BAND_US));
        }
    }
}
