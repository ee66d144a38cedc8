//! Planning the statements a backend keeps for its whole life for the table they will run on, not for the
//! table as it happens to be when they are planned.
//!
//! A kept plan (an SPI plan saved with `keep`) is planned when it first runs, and again only when something
//! invalidates it (the table altered, its statistics updated). PostgreSQL costs it with the table's size at
//! that moment: planned while the state table was empty (a new installation, or after the purge deleted
//! every bucket and VACUUM truncated the table), a lookup by key is a sequential scan, the cheapest way to
//! read an empty table; as the table grew back, every call of that backend read all of it, until autovacuum
//! happened to invalidate the plan (the bench saw rounds twenty times slower;
//! `tests/integration/tests/plans.rs`). Every kept statement names one row through its table's primary
//! key (or a unique index), for which an index scan is right at every size; so they run with the planner's
//! sequential scan disabled, which PostgreSQL uses only when no index can serve the statement.
//!
//! Statements planned once per call (a batch's, the purge's) keep the planner's own choice: they are planned
//! with the table as it is when they run.

use pgrx::pg_sys;

/// While alive, the planner of this backend avoids sequential scans (`enable_seqscan` off); dropping it
/// restores the value it found. Nested guards restore in turn.
struct SeqScanOff {
    was: bool,
}

impl SeqScanOff {
    fn new() -> SeqScanOff {
        // SAFETY: `enable_seqscan` is the plain `bool` behind the GUC of that name, a global of this
        // backend read by the planner on the backend's only thread. Its value is changed only while
        // this guard lives, around statements of this extension, and put back when it drops, also when
        // an ERROR unwinds through the guard (pgrx turns it into a Rust panic before re-raising it), so no
        // statement of the caller is planned with it changed. No SET runs in between: the extension's
        // statements call only its own functions (a trigger the owner added to its tables could, and its
        // SET would be undone when the guard drops).
        let was = unsafe { pg_sys::enable_seqscan };
        // SAFETY: as above.
        unsafe { pg_sys::enable_seqscan = false };
        SeqScanOff { was }
    }
}

impl Drop for SeqScanOff {
    fn drop(&mut self) {
        // SAFETY: as in `new`: the value this guard found goes back.
        unsafe { pg_sys::enable_seqscan = self.was };
    }
}

/// Runs `f`, whose SPI statements are kept plans that each address one row by a key, with the planner
/// choosing an index for any of them it plans (see the module's documentation).
pub fn by_key<R>(f: impl FnOnce() -> R) -> R {
    let _off = SeqScanOff::new();
    f()
}
