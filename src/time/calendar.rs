//! The calendars of `calendar_window` policies, on PostgreSQL's own time zones: the zone database the
//! server uses for `AT TIME ZONE` and `timestamptz` input, with its rules for wall-clock times that a
//! daylight-saving change skips or repeats. The model does the calendar arithmetic (`algorithm::calendar`);
//! this module gives it the zones and checks a policy's `per`, `time_zone` and `anchor`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};

use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self};

use crate::error;
use rate_limit_model::algorithm::{Calendar, Step, Zone};

/// The zone used when a calendar-window policy names none.
pub const DEFAULT_ZONE: &str = "UTC";

/// A PostgreSQL time zone, loaded once per backend.
struct PgZone {
    /// The canonical name (`pg_get_timezone_name`).
    name: String,
    tz: *mut pg_sys::pg_tz,
}

// SAFETY: a PostgreSQL backend runs one thread, and the model only needs `Zone: Send + Sync` to keep
// zones in shared, `'static` calendars. The `pg_tz` a PgZone points to lives in PostgreSQL's zone cache
// (TopMemoryContext) for the life of the process and is never changed after it is loaded.
unsafe impl Send for PgZone {}
// SAFETY: as above: one thread, and the zone is read-only once loaded.
unsafe impl Sync for PgZone {}

impl Zone for PgZone {
    fn name(&self) -> &str {
        &self.name
    }

    fn local(&self, utc: i64) -> i64 {
        let mut tm = pg_sys::pg_tm::default();
        let mut fsec: pg_sys::fsec_t = 0;
        let mut offset: std::ffi::c_int = 0;
        let mut local: pg_sys::Timestamp = 0;
        // SAFETY: timestamp2tm and tm2timestamp only write the out-parameters given, all valid locals,
        // and report a timestamp out of range by returning non-zero (they never raise an error); `tz` is
        // a loaded zone (see PgZone). This is what timestamptz's AT TIME ZONE does.
        let ok = unsafe {
            pg_sys::timestamp2tm(
                utc,
                &mut offset,
                &mut tm,
                &mut fsec,
                std::ptr::null_mut(),
                self.tz,
            ) == 0
                && pg_sys::tm2timestamp(&mut tm, fsec, std::ptr::null_mut(), &mut local) == 0
        };
        // instants the extension handles (now, window starts near it) are always in range
        if ok {
            local
        } else {
            utc
        }
    }

    fn utc(&self, local: i64) -> i64 {
        let mut tm = pg_sys::pg_tm::default();
        let mut fsec: pg_sys::fsec_t = 0;
        let mut utc: pg_sys::Timestamp = 0;
        // SAFETY: as in `local`; DetermineTimeZoneOffset reads the broken-down time and the loaded zone
        // and never raises an error. This is what timestamp's AT TIME ZONE (timestamp2timestamptz) does,
        // with its rules for skipped and repeated wall-clock times.
        let ok = unsafe {
            if pg_sys::timestamp2tm(
                local,
                std::ptr::null_mut(),
                &mut tm,
                &mut fsec,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ) != 0
            {
                false
            } else {
                let mut offset = pg_sys::DetermineTimeZoneOffset(&mut tm, self.tz);
                pg_sys::tm2timestamp(&mut tm, fsec, &mut offset, &mut utc) == 0
            }
        };
        if ok {
            utc
        } else {
            local
        }
    }
}

thread_local! {
    /// Zones by the name they were asked for: each loaded once and kept for the backend's life (at most
    /// one per distinct name a policy holds).
    static ZONES: RefCell<HashMap<String, &'static PgZone>> = RefCell::new(HashMap::new());
}

/// The zone called `name` (a name of `pg_timezone_names`, or a POSIX-style zone), if PostgreSQL knows it.
fn zone(name: &str) -> Option<&'static PgZone> {
    if let Some(z) = ZONES.with(|z| z.borrow().get(name).copied()) {
        return Some(z);
    }
    let c_name = CString::new(name).ok()?;
    // SAFETY: pg_tzset reads a NUL-terminated name and returns a zone from PostgreSQL's cache, or NULL
    // for an unknown name; it does not raise an error.
    let tz = unsafe { pg_sys::pg_tzset(c_name.as_ptr()) };
    if tz.is_null() {
        return None;
    }
    // SAFETY: `tz` is a loaded zone, whose name is a NUL-terminated string inside it.
    let canonical = unsafe { CStr::from_ptr(pg_sys::pg_get_timezone_name(tz)) }
        .to_string_lossy()
        .into_owned();
    let zone: &'static PgZone = Box::leak(Box::new(PgZone {
        name: canonical,
        tz,
    }));
    ZONES.with(|z| z.borrow_mut().insert(name.to_string(), zone));
    Some(zone)
}

/// The step of a calendar window's `per`: whole months or whole days, at most 100 years.
pub fn step(function: &'static str, per: Interval) -> Result<Step, ErrorReport> {
    if Step::too_long(per.months(), per.days()) {
        return Err(error::invalid_value(
            function,
            format!("a calendar window's per must be at most 100 years, got {per}"),
            "Use a shorter window, e.g. interval '1 year' with a proportionally lower rate.",
        ));
    }
    Step::of_interval(per.months(), per.days(), per.micros()).ok_or_else(|| {
        error::invalid_value(
            function,
            format!("a calendar window's per must be whole months or whole days, got {per}"),
            "Use interval '1 day', '1 week', '1 month', '3 months' or '1 year'; for shorter windows use \
             algorithm => 'fixed_window'.",
        )
    })
}

/// The zone called `name`, or 22023.
fn known_zone(function: &'static str, name: &str) -> Result<&'static PgZone, ErrorReport> {
    zone(name).ok_or_else(|| {
        error::invalid_value(
            function,
            format!("unknown time zone {}", error::quoted(name)),
            "Use a name from pg_timezone_names, e.g. 'Europe/Paris' or 'UTC'.",
        )
    })
}

/// The anchor as microseconds of a wall-clock time, or 22023 unless it is a finite timestamp in whole
/// seconds (windows end on whole seconds, see `algorithm::calendar`).
pub fn anchor_us(
    function: &'static str,
    anchor: pgrx::datum::Timestamp,
) -> Result<i64, ErrorReport> {
    let us = anchor.into_inner();
    if us == i64::MAX || us == i64::MIN || us % 1_000_000 != 0 {
        return Err(error::invalid_value(
            function,
            "a calendar window's anchor must be a finite timestamp in whole seconds".into(),
            "Pass the wall-clock start of one window, e.g. timestamp '2026-01-15 00:00'.",
        ));
    }
    Ok(us)
}

/// The calendar of a `calendar_window` policy: `per`'s step, from `anchor` (the step's default when
/// `None`), on the zone called `time_zone`.
pub fn calendar(
    function: &'static str,
    per: Interval,
    time_zone: &str,
    anchor: Option<i64>,
) -> Result<Calendar, ErrorReport> {
    let step = step(function, per)?;
    let zone = known_zone(function, time_zone)?;
    Ok(Calendar::new(
        step,
        anchor.unwrap_or_else(|| step.default_anchor()),
        zone,
    ))
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use super::*;

    fn micros(query: &str) -> i64 {
        Spi::get_one::<i64>(query)
            .expect("the query runs")
            .expect("a value")
    }

    /// The zones the model sees read wall clocks exactly as `AT TIME ZONE` does, including the times a
    /// daylight-saving change skips (02:30 on 29 March in Paris) or repeats (02:30 on 25 October), and the
    /// day Samoa skipped.
    #[pg_test]
    fn zones_read_wall_clocks_as_at_time_zone_does() {
        const EPOCH: &str = "timestamp '2000-01-01'";
        for (name, local) in [
            ("Europe/Paris", "2026-03-29 02:30"),
            ("Europe/Paris", "2026-10-25 02:30"),
            ("Europe/Paris", "2026-07-01 00:00"),
            ("America/New_York", "2026-03-08 02:15"),
            ("Australia/Lord_Howe", "2026-04-05 01:45"),
            ("Pacific/Apia", "2011-12-30 00:00"),
            ("Asia/Kolkata", "2026-01-01 00:00"),
        ] {
            let zone = zone(name).expect("a zone PostgreSQL knows");
            let local_us = micros(&format!(
                "SELECT (extract(epoch FROM timestamp '{local}' - {EPOCH}) * 1000000)::bigint"
            ));
            let utc_us = micros(&format!(
                "SELECT (extract(epoch FROM (timestamp '{local}' AT TIME ZONE '{name}') \
                 - timestamptz '2000-01-01 UTC') * 1000000)::bigint"
            ));
            assert_eq!(zone.utc(local_us), utc_us, "{name} {local}");
            let back = micros(&format!(
                "SELECT (extract(epoch FROM ((timestamp '{local}' AT TIME ZONE '{name}') \
                 AT TIME ZONE '{name}') - {EPOCH}) * 1000000)::bigint"
            ));
            assert_eq!(zone.local(utc_us), back, "{name} {local}");
        }
    }

    /// A zone is named as PostgreSQL names it, and an unknown one refused (22023: see pg_regress).
    #[pg_test]
    fn zone_names_are_canonical_and_unknown_ones_refused() {
        assert_eq!(
            zone("europe/paris").map(|z| z.name.as_str()),
            Some("Europe/Paris")
        );
        assert!(zone("Mars/Olympus_Mons").is_none());
        assert!(zone("").is_none());
        assert!(known_zone("f", "Mars/Olympus_Mons").is_err());
    }
}
