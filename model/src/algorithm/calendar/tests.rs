//! Calendar windows against the IANA time zones (chrono-tz), read with PostgreSQL's rules for skipped and
//! repeated wall-clock times, and against an oracle built on chrono's own date arithmetic.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use chrono::{LocalResult, Months, NaiveDate, NaiveDateTime, TimeDelta, TimeZone};
use chrono_tz::Tz;
use proptest::prelude::*;

use super::*;
use crate::algorithm::{Algorithm, Policy};

const S: i64 = 1_000_000;
const H: i64 = 3600 * S;
const D: i64 = 24 * H;

/// The zones of the tests: DST in both hemispheres and at midnight, half-hour offsets and DST steps, and a
/// zone that skipped a whole day.
const ZONES: [&str; 9] = [
    "UTC",
    "Europe/Paris",
    "America/New_York",
    "America/Santiago",
    "America/St_Johns",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Pacific/Apia",
    "America/Havana",
];

/// An IANA zone, read as PostgreSQL reads wall-clock times.
struct Iana {
    name: &'static str,
    tz: Tz,
}

fn naive(local: i64) -> NaiveDateTime {
    NaiveDate::from_ymd_opt(2000, 1, 1)
        .expect("a date")
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        + TimeDelta::microseconds(local)
}

fn micros(n: NaiveDateTime) -> i64 {
    (n - naive(0)).num_microseconds().expect("in range")
}

impl Zone for Iana {
    fn name(&self) -> &str {
        self.name
    }

    fn local(&self, utc: i64) -> i64 {
        micros(self.tz.from_utc_datetime(&naive(utc)).naive_local())
    }

    fn utc(&self, local: i64) -> i64 {
        let n = naive(local);
        match self.tz.from_local_datetime(&n) {
            LocalResult::Single(t) => micros(t.naive_utc()),
            // repeated: the offset after the change (the later instant)
            LocalResult::Ambiguous(_, later) => micros(later.naive_utc()),
            // skipped: the offset in force before the change
            LocalResult::None => {
                let before = (1..=48)
                    .find_map(
                        |h| match self.tz.from_local_datetime(&(n - TimeDelta::hours(h))) {
                            LocalResult::None => None,
                            r => r.latest(),
                        },
                    )
                    .expect("a time before the gap");
                let offset = micros(before.naive_local()) - micros(before.naive_utc());
                local - offset
            }
        }
    }
}

/// The zone called `name`, made once for the process (a calendar borrows it for `'static`).
fn zone(name: &'static str) -> &'static dyn Zone {
    static ZONES: OnceLock<Mutex<HashMap<&'static str, &'static Iana>>> = OnceLock::new();
    let mut zones = ZONES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    *zones.entry(name).or_insert_with(|| {
        Box::leak(Box::new(Iana {
            name,
            tz: name.parse().expect("an IANA zone"),
        }))
    })
}

/// Microseconds since 2000-01-01 of a date and time (on whatever clock it is read).
fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
    micros(
        NaiveDate::from_ymd_opt(y, mo, d)
            .expect("a date")
            .and_hms_opt(h, mi, 0)
            .expect("a time"),
    )
}

fn monthly(zone_name: &'static str, anchor: i64) -> Calendar {
    Calendar::new(Step::Months(1), anchor, zone(zone_name))
}

#[test]
fn the_civil_date_arithmetic_agrees_with_chrono_on_every_day_of_four_centuries() {
    let mut date = NaiveDate::from_ymd_opt(1900, 1, 1).expect("a date");
    let end = NaiveDate::from_ymd_opt(2300, 1, 1).expect("a date");
    let epoch = NaiveDate::from_ymd_opt(2000, 1, 1).expect("a date");
    while date < end {
        let days = (date - epoch).num_days();
        let (y, m, d) = civil_from_days(days);
        assert_eq!(
            (y, m, d),
            (
                i64::from(chrono::Datelike::year(&date)),
                i64::from(chrono::Datelike::month(&date)),
                i64::from(chrono::Datelike::day(&date))
            )
        );
        assert_eq!(days_from_civil(y, m, d), days);
        date = date.succ_opt().expect("a next day");
    }
}

#[test]
fn a_utc_month_is_its_own_length_and_february_knows_leap_years() {
    let c = monthly("UTC", Step::Months(1).default_anchor());
    assert_eq!(
        c.window(at(2024, 2, 15, 12, 0)),
        (at(2024, 2, 1, 0, 0), at(2024, 3, 1, 0, 0))
    );
    assert_eq!(
        c.window(at(2023, 2, 15, 12, 0)),
        (at(2023, 2, 1, 0, 0), at(2023, 3, 1, 0, 0))
    );
    // the boundary belongs to the window it starts
    assert_eq!(c.window(at(2024, 3, 1, 0, 0)).0, at(2024, 3, 1, 0, 0));
    assert_eq!(c.window(at(2024, 3, 1, 0, 0) - 1).1, at(2024, 3, 1, 0, 0));
}

#[test]
fn a_billing_day_in_paris_follows_the_clocks_across_daylight_saving() {
    // the 15th of each month at 00:00 Europe/Paris: CET (UTC+1) in winter, CEST (UTC+2) in summer
    let c = monthly("Europe/Paris", at(2026, 1, 15, 0, 0));
    let (start, end) = c.window(at(2026, 3, 20, 12, 0));
    assert_eq!(start, at(2026, 3, 14, 23, 0));
    assert_eq!(end, at(2026, 4, 14, 22, 0));
    // 31 days, less the hour the clocks went forward on 29 March
    assert_eq!(end - start, 31 * D - H);
    // and October gives it back
    let (start, end) = c.window(at(2026, 10, 20, 0, 0));
    assert_eq!(end - start, 31 * D + H);
}

#[test]
fn the_31st_of_each_month_is_the_last_day_of_the_shorter_ones() {
    let c = monthly("UTC", at(2024, 1, 31, 0, 0));
    let starts: Vec<i64> = [
        at(2024, 2, 10, 0, 0),
        at(2024, 3, 10, 0, 0),
        at(2024, 4, 10, 0, 0),
        at(2024, 5, 10, 0, 0),
    ]
    .into_iter()
    .map(|t| c.window(t).0)
    .collect();
    assert_eq!(
        starts,
        [
            at(2024, 1, 31, 0, 0),
            at(2024, 2, 29, 0, 0),
            at(2024, 3, 31, 0, 0),
            at(2024, 4, 30, 0, 0)
        ]
    );
}

#[test]
fn weeks_start_on_monday_and_days_at_midnight_even_on_a_23_hour_day() {
    let weekly = Calendar::new(Step::Days(7), Step::Days(7).default_anchor(), zone("UTC"));
    // Wednesday 2026-11-25: the week of Monday 23 November
    assert_eq!(
        weekly.window(at(2026, 11, 25, 9, 0)),
        (at(2026, 11, 23, 0, 0), at(2026, 11, 30, 0, 0))
    );
    let daily = Calendar::new(
        Step::Days(1),
        Step::Days(1).default_anchor(),
        zone("Europe/Paris"),
    );
    let (start, end) = daily.window(at(2026, 3, 29, 12, 0));
    assert_eq!((start, end - start), (at(2026, 3, 28, 23, 0), 23 * H));
}

#[test]
fn a_day_that_a_zone_skipped_is_an_empty_window() {
    // Samoa moved across the date line: 2011-12-30 never happened in Pacific/Apia
    let daily = Calendar::new(
        Step::Days(1),
        Step::Days(1).default_anchor(),
        zone("Pacific/Apia"),
    );
    // 29 December 23:59 local (UTC-10) is 30 December 09:59 UTC; the next midnight is the 31st's (UTC+14)
    let (start, end) = daily.window(at(2011, 12, 30, 9, 0));
    assert_eq!(
        (start, end),
        (at(2011, 12, 29, 10, 0), at(2011, 12, 30, 10, 0))
    );
    let (start, end) = daily.window(at(2011, 12, 30, 10, 0));
    assert_eq!(
        (start, end),
        (at(2011, 12, 30, 10, 0), at(2011, 12, 31, 10, 0))
    );
}

#[test]
fn a_quota_resets_at_the_boundary_with_an_exact_reset_after() {
    let c = monthly("Europe/Paris", Step::Months(1).default_anchor());
    let p = Policy::calendar(3, c).expect("valid");
    assert_eq!(p.algorithm(), Algorithm::CalendarWindow);
    let t = at(2026, 2, 27, 12, 0); // 13:00 in Paris
    let end = at(2026, 2, 28, 23, 0); // 1 March 00:00 in Paris
    let mut s = p.full(t);
    for remaining in [2, 1, 0] {
        let o = p.take(s, t, 1);
        assert!(o.allowed);
        assert_eq!((o.remaining, o.reset_after), (remaining, end - t));
        s = o.state;
    }
    let denied = p.take(s, t, 1);
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after, Some(end - t));
    assert!(!p.take(s, end - 1, 1).allowed);
    let next = p.take(s, end, 1);
    assert!(next.allowed);
    assert_eq!(next.remaining, 2);
    // March has 31 days, less the hour of 29 March
    assert_eq!(next.reset_after, 31 * D - H);
    // a cost above the quota can never be granted
    assert_eq!(p.take(p.full(t), t, 4).retry_after, None);
}

#[test]
fn a_stored_state_reads_the_same_without_the_calendar_and_a_zone_change_waits_for_the_next_window()
{
    let paris = Policy::calendar(10, monthly("Europe/Paris", 0)).expect("valid");
    let tokyo = Policy::calendar(10, monthly("Asia/Tokyo", 0)).expect("valid");
    // the numbers are what a bucket stores: equal, so no carry-over
    assert_eq!(paris, tokyo);
    let stored = Policy::new(Algorithm::CalendarWindow, 10, paris.period_us(), 10).expect("valid");
    assert_eq!(stored, paris);
    let t = at(2026, 5, 10, 0, 0);
    let s = paris.take(paris.full(t), t, 4).state;
    assert_eq!(stored.tokens_exact(s, t), (6, 1));
    assert_eq!(tokyo.take(s, t, 0).remaining, 6);
    let paris_end = at(2026, 5, 31, 22, 0);
    assert_eq!(tokyo.take(s, paris_end, 0).remaining, 10);
    assert!(stored.is_full(s, paris_end));
    assert!(!stored.is_full(s, paris_end - 1));
}

#[test]
fn refunds_charges_and_carry_over_keep_the_window() {
    let p = Policy::calendar(10, monthly("UTC", 0)).expect("valid");
    let t = at(2026, 6, 5, 0, 0);
    let end = at(2026, 7, 1, 0, 0);
    let s = p.take(p.full(t), t, 8).state;
    assert_eq!(unpack_calendar(p.refund(s, t, 3).level), (5, end));
    assert_eq!(p.refund(s, t, 30), State { level: 0, at: t });
    // a charge goes into debt down to max_debt, and the takes wait for the next window
    let charged = p.charge(s, t, 100, 5);
    assert_eq!(unpack_calendar(charged.state.level), (15, end));
    assert_eq!(p.tokens_exact(charged.state, t), (-5, 1));
    assert_eq!(p.take(charged.state, t, 1).retry_after, Some(end - t));
    // a charge on a fresh bucket opens the window
    assert_eq!(
        unpack_calendar(p.charge(p.full(t), t, 2, 0).state.level),
        (2, end)
    );
    // carried over from a token bucket holding 4 of its 10 tokens: 6 used in this window
    let tb = Policy::new(Algorithm::TokenBucket, 1, 3600 * S, 10).expect("valid");
    let tb_state = tb.take(tb.full(t), t, 6).state;
    assert_eq!(
        unpack_calendar(p.carry_over(tb_state, &tb, t, t).level),
        (6, end)
    );
}

/// A policy's rate changed in one window, and a key untouched since before the change called in a later
/// window: read with the calendar (the memory store, a table-store denial) or from its numbers alone with
/// the end of the window open at the call (the table store's conditional UPDATE), the count carried over
/// stays in the window it was counted in, which is over: the key starts the new window fresh either way.
/// (Before: the numbers-only reading carried the count into the window open at the call, so it denied
/// what the calendar granted and the table store's take retried until it gave up with 40001.)
#[test]
fn a_count_carried_over_stays_in_its_window_read_with_or_without_the_calendar() {
    let daily =
        |rate| Policy::calendar(rate, Calendar::new(Step::Days(1), 0, zone("Europe/Paris")));
    let (old, new) = (daily(2).expect("valid"), daily(5).expect("valid"));
    let stored = old
        .take(old.full(at(2030, 6, 12, 1, 0)), at(2030, 6, 12, 1, 0), 2)
        .state;
    let changed_at = at(2030, 6, 12, 1, 20);
    let now = at(2030, 7, 16, 5, 38);
    let numbers_only = Policy::new(Algorithm::CalendarWindow, 5, new.period_us(), 5)
        .expect("valid")
        .open_until(new.window_end(now).expect("a calendar window"));
    for (how, p) in [("calendar", new), ("numbers", numbers_only)] {
        let carried = p.carry_over(stored, &old, changed_at, now);
        let o = p.take(carried, now, 2);
        assert!(o.allowed, "{how}");
        assert_eq!(o.remaining, 3, "{how}");
    }
    // while the window it was counted in is open, its tokens (none left) carry over into it under the new
    // numbers: 5 used of 5 until that window's end (midnight in Paris)
    let before_end = at(2030, 6, 12, 21, 0);
    for p in [new, numbers_only] {
        let carried = p.carry_over(stored, &old, changed_at, before_end);
        assert_eq!(p.take(carried, before_end, 0).remaining, 0);
        assert_eq!(unpack_calendar(carried.level), (5, at(2030, 6, 12, 22, 0)));
    }
}

#[test]
fn a_clock_stepped_back_mints_nothing_and_the_window_ends_when_the_clock_reads_its_boundary() {
    let p = Policy::calendar(2, monthly("UTC", 0)).expect("valid");
    let t = at(2026, 8, 31, 23, 0);
    let end = at(2026, 9, 1, 0, 0);
    let s = p.take(p.full(t), t, 2).state;
    // an hour back, into the same month: still used up, until midnight on the 1st
    let back = p.take(s, t - H, 1);
    assert!(!back.allowed);
    assert_eq!(back.retry_after, Some(end - (t - H)));
    assert_eq!(unpack_calendar(back.state.level), (2, end));
    assert_eq!(back.state.at, t - H, "rebased on the clock");
    assert!(p.take(s, end, 2).allowed);
}

#[test]
fn a_policy_known_by_its_numbers_opens_its_window_where_it_is_told() {
    let calendar = Policy::calendar(3, monthly("Europe/Paris", 0)).expect("valid");
    let numbers =
        Policy::new(Algorithm::CalendarWindow, 3, calendar.period_us(), 3).expect("valid");
    let t = at(2026, 3, 20, 12, 0);
    let end = calendar.window_end(t).expect("a calendar window");
    assert_eq!(end, at(2026, 3, 31, 22, 0));
    let told = numbers.open_until(end).take(numbers.full(t), t, 1);
    assert_eq!(told, calendar.take(calendar.full(t), t, 1));
    // told of a window that is over (a clock stepped back across it): a nominal window from the call
    let late = numbers.open_until(end).take(numbers.full(end), end, 1);
    assert_eq!(late.reset_after, numbers.period_us());
    assert_eq!(
        Policy::new(Algorithm::FixedWindow, 3, 60 * S, 3)
            .expect("valid")
            .window_end(t),
        None
    );
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1..=12_i32).prop_map(Step::Months),
        (1..=14_i32).prop_map(Step::Days)
    ]
}

/// The oracle: window starts made with chrono's date arithmetic, the window of `t` found by scanning.
fn oracle(c: &Calendar, zone: &dyn Zone, t: i64) -> (i64, i64) {
    let anchor = naive(c.anchor());
    let local_start = |k: i64| -> i64 {
        match c.step() {
            Step::Months(m) => {
                let months = k * i64::from(m);
                let date = if months >= 0 {
                    anchor.checked_add_months(Months::new(months as u32))
                } else {
                    anchor.checked_sub_months(Months::new((-months) as u32))
                };
                micros(date.expect("in range"))
            }
            Step::Days(d) => micros(anchor + TimeDelta::days(k * i64::from(d))),
        }
    };
    let local = zone.local(t);
    let k0 = (local - c.anchor()).div_euclid(c.step().nominal_us());
    // the last start at or before t, among the windows on both sides of the estimate
    let k = (k0 - 3..=k0 + 3)
        .filter(|&k| zone.utc(local_start(k)) <= t)
        .max()
        .expect("a window starts before t");
    (zone.utc(local_start(k)), zone.utc(local_start(k + 1)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn every_instant_is_in_the_window_the_oracle_finds(
        zone_index in 0..ZONES.len(),
        step in step(),
        anchor_day in 0..(40 * 366_i64),
        anchor_time in prop_oneof![Just(0_i64), 0..D],
        t in 0..(80 * 366 * D),
    ) {
        let z = zone(ZONES[zone_index]);
        let c = Calendar::new(step, anchor_day * D + anchor_time, z);
        let (start, end) = c.window(t);
        prop_assert!(start <= t && t < end, "{start} <= {t} < {end}");
        prop_assert_eq!((start, end), oracle(&c, z, t));
        // the next window starts where this one ends
        prop_assert_eq!(c.window(end).0, end);
    }

    /// A quota against a slow model: per window of the oracle, a take is granted while the window's
    /// count stays within the rate; `remaining`, `reset_after` and `retry_after` are exact.
    #[test]
    fn a_calendar_quota_grants_exactly_its_rate_in_every_window(
        zone_index in 0..ZONES.len(),
        step in step(),
        rate in 1..20_i64,
        start in 0..(60 * 366 * D),
        calls in prop::collection::vec((0..(6 * D), 0..6_i64), 1..80),
    ) {
        let z = zone(ZONES[zone_index]);
        let c = Calendar::new(step, step.default_anchor(), z);
        let p = Policy::calendar(rate, c).expect("valid");
        let mut state = p.full(start);
        let mut t = start;
        let mut counts: HashMap<i64, i64> = HashMap::new();
        for (dt, cost) in calls {
            t += dt;
            let (w_start, w_end) = oracle(&c, z, t);
            let used = counts.entry(w_start).or_insert(0);
            let o = p.take(state, t, cost);
            let allowed = *used + cost <= rate;
            prop_assert_eq!(o.allowed, allowed);
            if allowed {
                *used += cost;
                state = o.state;
            }
            prop_assert_eq!(o.remaining, rate - *used);
            prop_assert_eq!(o.reset_after, if *used > 0 { w_end - t } else { 0 });
            let retry = (!allowed && cost <= rate).then_some(w_end - t);
            prop_assert_eq!(o.retry_after, retry);
        }
    }
}

/// A step is at most 100 years, in months or in days, so that its nominal length (the header's `w`) and
/// its window ends never overflow (before: 213503983 days gave `w=57491`, and 584542 years and a month
/// a negative length).
#[test]
fn steps_longer_than_100_years_are_refused() {
    assert_eq!(Step::of_interval(1200, 0, 0), Some(Step::Months(1200)));
    assert_eq!(Step::of_interval(1201, 0, 0), None);
    assert_eq!(Step::of_interval(0, 36_525, 0), Some(Step::Days(36_525)));
    assert_eq!(Step::of_interval(0, 36_526, 0), None);
    assert_eq!(Step::of_interval(0, 213_503_983, 0), None);
    assert_eq!(Step::of_interval(584_542 * 12 + 1, 0, 0), None);
    assert!(Step::too_long(1201, 0) && Step::too_long(0, 213_503_983));
    assert!(!Step::too_long(1200, 36_525));
    assert_eq!(Step::Months(1200).nominal_us(), 1200 * 2_629_746_000_000);
    assert_eq!(Step::Days(36_525).nominal_us(), 36_525 * D);
}
