//! Weighted, work-conserving sharing of a parent's tokens among its children, as one call decides it: the
//! fairness half of hierarchical quotas (a child's call also takes from its own bucket, its ceiling, and
//! from its parent's, all or nothing; that part is [`crate::pipeline::take`] over several targets).
//!
//! Children that ask for more than the parent can give share it in proportion to their weights, as a
//! start-time fair queue would share a link, but without a queue: every call is granted or denied at once.
//! Each child keeps a *tag* ([`Tag`]): the tokens it was granted divided by its weight (its normalized
//! service, in millionths), and when it was last denied for want of the parent's tokens. The parent keeps
//! its *front*: the highest tag a grant left. A child is *demanding* while it was so denied within the
//! last `demand_us`: it wants more than it gets.
//! - A child's call may take from the parent only while its tag is at most `lead` above the lowest tag of
//!   the demanding children (the *floor*); when none is demanding (nobody wants more than it gets),
//!   every call may, and the parent's spare goes to whoever asks: work-conserving.
//! - `demand_us` is short: longer than the clients take to retry a denied call (a child that hammers
//!   stays demanding), and short enough that a light child denied once on an empty parent (it holds the
//!   floor and so holds back the others until it calls again or the time is up) delays the parent's
//!   tokens by at most `demand_us`: none is lost while the parent's bucket can hold `demand_us` of its
//!   refill.
//! - A tag is never read lower than `lag` below the front (its *effective* tag): a child back from idle
//!   may catch up at most `lag` of normalized service, then shares as the others do; a light child,
//!   whose calls are all granted, never demands and so never holds the others back.
//! - A denial for want of the parent's tokens (its bucket empty, or the child too far ahead) marks the
//!   child demanding; a denial by the child's own bucket does not (it could not use more anyway).
//!
//! The bound ([`Fairness::bound`]): while two children are both demanding, and neither is read at the
//! lag's floor, each tag stays within `[floor, floor + lead + cost / weight]`, so over any interval of
//! that time the normalized grants `g_i / w_i` and `g_j / w_j` differ by at most
//! `2 lead + cost / w_i + cost / w_j`: each child's grants stay within that much (times its weight) of
//! its weighted share. The parent never grants more than its own bucket holds, whatever the tags say.

/// Millionths: the unit of a normalized service.
pub const UNITS: i64 = 1_000_000;

/// A child's fairness state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    /// Tokens granted divided by the child's weight, in [`UNITS`] (raised to `front - lag` when lower).
    pub service: i64,
    /// When the child was last denied for want of the parent's tokens (`i64::MIN`: never).
    pub denied_at: i64,
}

impl Tag {
    /// A child never seen: no service, never denied.
    pub const NEW: Tag = Tag {
        service: i64::MIN,
        denied_at: i64::MIN,
    };
}

/// How a parent shares its tokens: the lead a child may take over the floor, the lag it may catch up,
/// both in normalized service ([`UNITS`] per token of weight 1), and how long a denial keeps it demanding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fairness {
    /// How far above the floor a child's tag may be and still take from the parent.
    pub lead: i64,
    /// How far below the front a tag is ever read.
    pub lag: i64,
    /// How long after a denial a child counts as demanding, µs.
    pub demand_us: i64,
}

impl Fairness {
    /// The most two demanding children's normalized grants (tokens ÷ weight) can differ by over any
    /// interval during which both stay demanding, for calls of at most `cost` tokens and weights
    /// `w_i`, `w_j`: `2 lead + cost / w_i + cost / w_j`, in tokens (rounded up).
    pub fn bound(&self, cost: i64, w_i: i64, w_j: i64) -> f64 {
        let units = 2 * self.lead + per_weight(cost, w_i) + per_weight(cost, w_j);
        units as f64 / UNITS as f64
    }

    /// `tag` as it is read, at most `lag` below `front`.
    pub fn effective(&self, tag: Tag, front: i64) -> i64 {
        tag.service.max(front.saturating_sub(self.lag))
    }

    /// Whether `tag` is demanding at `now`.
    pub fn demanding(&self, tag: Tag, now: i64) -> bool {
        tag.denied_at != i64::MIN && now.saturating_sub(tag.denied_at) <= self.demand_us
    }

    /// The floor at `now`: the lowest effective tag of the demanding children among `tags` (every child
    /// of the parent, the caller's included), `None` when none is demanding.
    pub fn floor(&self, tags: &[Tag], front: i64, now: i64) -> Option<i64> {
        tags.iter()
            .filter(|t| self.demanding(**t, now))
            .map(|t| self.effective(*t, front))
            .min()
    }

    /// Whether a child with tag `mine` may take from the parent now (`tags`: every child's, its own
    /// included; `front`: the parent's): false when its tag is more than `lead` above the floor (others
    /// that want more have had less).
    pub fn admit(&self, mine: Tag, tags: &[Tag], front: i64, now: i64) -> bool {
        self.floor(tags, front, now)
            .is_none_or(|floor| self.effective(mine, front) <= floor.saturating_add(self.lead))
    }

    /// A grant of `cost` tokens to a child of weight `weight` with tag `mine`: its tag and the parent's
    /// front afterwards.
    pub fn granted(&self, mine: Tag, front: i64, cost: i64, weight: i64) -> (Tag, i64) {
        let service = self
            .effective(mine, front)
            .saturating_add(per_weight(cost, weight));
        (
            Tag {
                service,
                denied_at: mine.denied_at,
            },
            front.max(service),
        )
    }

    /// A denial for want of the parent's tokens at `now`: the child is demanding from now.
    pub fn denied(&self, mine: Tag, now: i64) -> Tag {
        Tag {
            denied_at: now,
            ..mine
        }
    }
}

/// `cost` tokens of a child of weight `weight`, in normalized service (rounded up: a grant never counts
/// for less than it took).
fn per_weight(cost: i64, weight: i64) -> i64 {
    let w = i128::from(weight.max(1));
    let units = (i128::from(cost) * i128::from(UNITS) + w - 1) / w;
    i64::try_from(units).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
