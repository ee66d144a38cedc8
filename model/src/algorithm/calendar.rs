//! Calendar windows: fixed windows whose boundaries are dates on a time zone's wall clock (every day at
//! midnight, every Monday, the 15th of each month at 00:00 Europe/Paris, every 1 January), so a monthly
//! quota resets on the first of the month, not every 30 days.
//!
//! A [`Calendar`] is a [`Step`] (whole months or whole days), an anchor (a wall-clock time, like
//! PostgreSQL's `timestamp without time zone`, in microseconds since 2000-01-01 00:00) and a [`Zone`].
//! Window `k` starts at the instant the zone's clocks read `anchor + k × step`, with PostgreSQL's interval
//! arithmetic: months first, the day of the month clamped to the month's length (the 31st of each month is
//! the 30th in April and the 29th in February of a leap year), each window counted from the anchor, never
//! from the window before (so a clamped month does not drag the next ones). The zone turns wall-clock times
//! into instants, with PostgreSQL's rules for times that a daylight-saving change skips or repeats.
//!
//! A bucket's state holds the count used in its window and the instant that window ends, packed in its
//! level (see [`pack_calendar`]); `at` is the last instant it moved, as for every algorithm. So a stored
//! state is read without the calendar (its window is over once `now` reaches the end); the calendar is
//! needed only to open a new window, and a change of zone or anchor applies from each bucket's next window.
//! Window ends are kept in whole seconds (rounded up): every zone offset is whole seconds, so only an anchor
//! with a fraction of a second would move. A clock that steps back mints nothing: the count stays until
//! the clock reads its window's end again, as a calendar quota resets when the wall clock says so.

use std::fmt;

use super::{until, Outcome, Policy, State, MAX_WINDOW_COUNT};

/// A day on a wall clock, in microseconds.
const DAY_US: i64 = 86_400_000_000;

/// A time zone: the bridge between instants (microseconds since 2000-01-01 00:00 UTC) and wall-clock times
/// (microseconds since 2000-01-01 00:00 on the zone's clocks).
pub trait Zone: Send + Sync {
    /// The zone's name, as the policy names it (`Europe/Paris`, `UTC`).
    fn name(&self) -> &str;
    /// What the zone's clocks read at the instant `utc`.
    fn local(&self, utc: i64) -> i64;
    /// The instant at which the zone's clocks read `local`. A wall-clock time that a change skips is read
    /// with the offset in force before the change; one that a change repeats, with the offset after it
    /// (PostgreSQL's rules).
    fn utc(&self, local: i64) -> i64;
}

/// How far apart window starts are on the wall clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Whole months (12 for a year).
    Months(i32),
    /// Whole days (7 for a week).
    Days(i32),
}

impl Step {
    /// The longest step in months: 100 years (so that window ends and the nominal length never overflow).
    pub const MAX_MONTHS: i32 = 1200;
    /// The longest step in days: 100 years of 365.25 days.
    pub const MAX_DAYS: i32 = 36_525;

    /// The step of a PostgreSQL interval `(months, days, microseconds)`: whole months only or whole days
    /// only, at least one and at most 100 years; `None` otherwise.
    pub fn of_interval(months: i32, days: i32, micros: i64) -> Option<Step> {
        match (months, days, micros) {
            (m, 0, 0) if m > 0 && m <= Self::MAX_MONTHS => Some(Step::Months(m)),
            (0, d, 0) if d > 0 && d <= Self::MAX_DAYS => Some(Step::Days(d)),
            _ => None,
        }
    }

    /// Whether an interval `(months, days)` is longer than the longest step (100 years).
    pub fn too_long(months: i32, days: i32) -> bool {
        months > Self::MAX_MONTHS || days > Self::MAX_DAYS
    }

    /// The nominal length in microseconds: an average Gregorian month (30.436875 days) per month, 24 hours
    /// per day. It is the window `w` of the HTTP fields, never a boundary.
    pub fn nominal_us(self) -> i64 {
        const MONTH_US: i64 = 2_629_746_000_000;
        match self {
            Step::Months(m) => i64::from(m) * MONTH_US,
            Step::Days(d) => i64::from(d) * DAY_US,
        }
    }

    /// The anchor used when none is given: 2000-01-01 00:00 for months (the first of the month, 1 January
    /// for a year), Monday 2000-01-03 00:00 for days (midnight, weeks from Monday, as ISO 8601).
    pub fn default_anchor(self) -> i64 {
        match self {
            Step::Months(_) => 0,
            Step::Days(_) => 2 * DAY_US,
        }
    }
}

/// The windows of a calendar-window policy. Copied freely: the zone is shared for the process's lifetime.
#[derive(Clone, Copy)]
pub struct Calendar {
    step: Step,
    anchor: i64,
    zone: &'static dyn Zone,
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calendar")
            .field("step", &self.step)
            .field("anchor", &self.anchor)
            .field("zone", &self.zone.name())
            .finish()
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        self.step == other.step
            && self.anchor == other.anchor
            && self.zone.name() == other.zone.name()
    }
}

impl Eq for Calendar {}

/// Days since 2000-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468 - 10_957
}

/// The date `(year, month, day)` of a day number since 2000-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 10_957 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Months since January 2000 of a wall-clock time.
fn month_index(local: i64) -> i64 {
    let (year, month, _) = civil_from_days(local.div_euclid(DAY_US));
    (year - 2000) * 12 + month - 1
}

/// `local + months`, as PostgreSQL adds an interval of months to a timestamp: same day of the month,
/// clamped to the month's length, same time of day.
fn add_months(local: i64, months: i64) -> i64 {
    let days = local.div_euclid(DAY_US);
    let time = local.rem_euclid(DAY_US);
    let (year, month, day) = civil_from_days(days);
    let index = year * 12 + month - 1 + months;
    let (year, month) = (index.div_euclid(12), index.rem_euclid(12) + 1);
    let day = day.min(days_in_month(year, month));
    days_from_civil(year, month, day) * DAY_US + time
}

impl Calendar {
    /// A calendar of `step`s from `anchor` (a wall-clock time) on `zone`'s clocks.
    pub fn new(step: Step, anchor: i64, zone: &'static dyn Zone) -> Calendar {
        Calendar { step, anchor, zone }
    }

    /// The step between window starts.
    pub fn step(&self) -> Step {
        self.step
    }

    /// The wall-clock time the windows count from.
    pub fn anchor(&self) -> i64 {
        self.anchor
    }

    /// The zone's name.
    pub fn zone_name(&self) -> &str {
        self.zone.name()
    }

    /// The wall-clock start of window `k`.
    fn local_start(&self, k: i64) -> i64 {
        match self.step {
            Step::Months(m) => add_months(self.anchor, k.saturating_mul(i64::from(m))),
            Step::Days(d) => self
                .anchor
                .saturating_add(k.saturating_mul(i64::from(d)).saturating_mul(DAY_US)),
        }
    }

    /// The instant window `k` starts.
    fn start(&self, k: i64) -> i64 {
        self.zone.utc(self.local_start(k))
    }

    /// The window containing the instant `t`: `(start, end)` with `start <= t < end`.
    ///
    /// The index is estimated on the wall clock, then moved until the window brackets `t`: window starts
    /// are at least a day apart on the wall clock, and a zone's offset changes by less than that, so the
    /// estimate is off by at most one and the loops run at most twice (the bound keeps any zone total).
    pub fn window(&self, t: i64) -> (i64, i64) {
        let local = self.zone.local(t);
        let mut k = match self.step {
            Step::Months(m) => {
                (month_index(local) - month_index(self.anchor)).div_euclid(i64::from(m))
            }
            Step::Days(d) => (local - self.anchor)
                .div_euclid(DAY_US)
                .div_euclid(i64::from(d)),
        };
        for _ in 0..8 {
            if self.start(k) > t {
                k -= 1;
            } else if self.start(k + 1) <= t {
                k += 1;
            } else {
                break;
            }
        }
        let (start, end) = (self.start(k), self.start(k + 1));
        // a zone that skips whole days can make a window empty; a window always moves forward
        (start.min(t), end.max(t + 1))
    }
}

/// Bits of a calendar window's packed level that hold its count ([`MAX_WINDOW_COUNT`] fits).
const COUNT_BITS: u32 = 31;

/// The level of a calendar window: `end_seconds << 31 | count`, where `end_seconds` is the second (since
/// 2000-01-01 UTC, rounded up, at most 2^32 − 1: the year 2136) its window ends. Both fit in a
/// non-negative `i64`, so a state stays two integers and its `at` the last instant it moved, as the stores
/// expect of every algorithm.
fn pack_calendar(end_us: i64, count: i64) -> i64 {
    let end_s = end_us.div_euclid(1_000_000) + i64::from(end_us.rem_euclid(1_000_000) != 0);
    (end_s.clamp(0, (1 << 32) - 1) << COUNT_BITS) | count.clamp(0, MAX_WINDOW_COUNT)
}

/// `(count, end_us)` of a packed calendar level.
fn unpack_calendar(level: i64) -> (i64, i64) {
    let level = level.max(0);
    (level & MAX_WINDOW_COUNT, (level >> COUNT_BITS) * 1_000_000)
}

impl Policy {
    /// The instant the calendar window containing `t` ends. A policy rebuilt from a bucket's stored numbers
    /// has no calendar: it reads states (whose level holds their window's end), opens a window where
    /// [`Policy::open_until`] says, and otherwise (a clock stepped back across that end) counts a window of
    /// its nominal length from `t`.
    pub(super) fn calendar_window_end(&self, t: i64) -> i64 {
        match (&self.calendar, self.open_until) {
            (Some(c), _) => c.window(t).1,
            (None, Some(end)) if t < end => end,
            _ => t.saturating_add(self.period_us()),
        }
    }

    /// The count used in the calendar window of `state` at `t` (0 once that window is over), and the
    /// instant the window ends when one is open.
    fn calendar_open(state: State, t: i64) -> (i64, Option<i64>) {
        let (count, end) = unpack_calendar(state.level);
        if t < end && count > 0 {
            (count, Some(end))
        } else {
            (0, None)
        }
    }

    /// The state and outcome of a calendar window holding `count` at `t`, in the window ending at `end`
    /// when one is open (`end` is opened from the calendar when a count starts a window).
    fn calendar_outcome(
        &self,
        allowed: bool,
        count: i64,
        end: Option<i64>,
        retry_after: Option<i64>,
        t: i64,
    ) -> Outcome {
        let (level, reset_after) = if count > 0 {
            let end = end.unwrap_or_else(|| self.calendar_window_end(t));
            let level = pack_calendar(end, count);
            // the end as stored (whole seconds), so that every reading of the state agrees
            (level, until(unpack_calendar(level).1.into(), t))
        } else {
            (0, 0)
        };
        Outcome {
            allowed,
            state: State { level, at: t },
            remaining: (self.burst() - count).max(0),
            retry_after,
            reset_after,
        }
    }

    /// [`Policy::take`] for a calendar window.
    pub(super) fn take_calendar(&self, state: State, now: i64, cost: i64) -> Outcome {
        let (count, end) = Self::calendar_open(state, now);
        let allowed = i128::from(count) + i128::from(cost) <= i128::from(self.burst());
        if !allowed {
            // a count above 0 has its window's end; a cost above the limit can never be granted
            let retry_after = if cost > self.burst() {
                None
            } else {
                end.map(|end| until(end.into(), now))
            };
            return self.calendar_outcome(false, count, end, retry_after, now);
        }
        self.calendar_outcome(true, count + cost, end, None, now)
    }

    /// [`Policy::charge`] for a calendar window: the count may reach `burst + max_debt`.
    pub(super) fn charge_calendar(
        &self,
        state: State,
        now: i64,
        cost: i64,
        max_debt: i64,
    ) -> Outcome {
        let (count, end) = Self::calendar_open(state, now);
        let ceiling = self
            .burst()
            .saturating_add(max_debt)
            .clamp(count, MAX_WINDOW_COUNT);
        let after = count.saturating_add(cost).min(ceiling).max(count);
        self.calendar_outcome(true, after, end, None, now)
    }

    /// [`Policy::refund`] for a calendar window: the count goes down, the window stays.
    pub(super) fn refund_calendar(&self, state: State, now: i64, tokens: i64) -> State {
        let (count, end) = Self::calendar_open(state, now);
        let after = count - tokens.clamp(0, count);
        self.calendar_outcome(true, after, end, None, now).state
    }

    /// The tokens of a calendar window at `t` (negative in debt).
    pub(super) fn calendar_tokens(&self, state: State, t: i64) -> i64 {
        self.burst() - Self::calendar_open(state, t).0
    }

    /// The calendar-window state holding `available` tokens at `t`, carried over from `stored` under
    /// `stored_policy` (other numbers). A count carried from a calendar window stays in the window it was
    /// counted in while that window is open at `t`: its state holds that window's end, so a policy read
    /// from its numbers alone (which knows only the window open at the call, [`Policy::open_until`])
    /// carries it exactly where the calendar does, and a count from a window that ended before the call
    /// never lands in the window open at it. Any other count opens the window containing `t`.
    pub(super) fn calendar_carried(
        &self,
        stored: State,
        stored_policy: &Policy,
        available: i64,
        t: i64,
    ) -> State {
        let end = if stored_policy.algorithm == super::Algorithm::CalendarWindow {
            Self::calendar_open(stored, t).1
        } else {
            None
        };
        self.calendar_outcome(true, self.burst() - available, end, None, t)
            .state
    }
}

#[cfg(test)]
mod tests;
