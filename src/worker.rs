//! The background worker, started when the library is preloaded.
//!
//! `rate_limit launcher` (one per server, connected to no database; in `pg_stat_activity` with that
//! `backend_type`) wakes every `rate_limit.purge_interval`:
//! 1. purges the memory store's full buckets of every database (lossless: a missing bucket is a full one);
//! 2. on a primary, starts `rate_limit purge` in each database that accepts connections, one at a time,
//!    and waits for it; that worker does nothing where the extension is not installed (or not at the
//!    library's version: it says so in the log), else deletes the rows of `rate_limit.bucket_state` that
//!    are full and untouched for at least the purge interval (a bucket in use is kept, not deleted and
//!    inserted again), reading [`SPAN`] rows per transaction in the primary key's order, skipping rows a
//!    caller holds locked (`FOR UPDATE SKIP LOCKED`): callers never wait for the worker, and wait at most
//!    one span's transaction for a row the worker locked first. It waits at most [`LOCK_TIMEOUT_MS`] for a
//!    lock: a transaction that holds the table (VACUUM FULL, CLUSTER, ALTER TABLE, LOCK TABLE) makes that
//!    database's purge fail, logged, instead of stalling the launcher, which purges the memory store,
//!    writes snapshots and serves the other databases.
//!
//! On a streaming standby it samples, every [`CLOCK_SAMPLE_INTERVAL`], how far this server's clock is off
//! the primary's, and saves the table store's clock shift when the server is promoted
//! ([`crate::time::clock_shift`]). It also writes the memory store's snapshot every `rate_limit.memory_snapshot_interval` (0: only at a
//! clean shutdown). A purge interval of 0 disables the purges. Errors are logged by PostgreSQL: a
//! database's worker that fails exits (the next round tries again), and a launcher that fails exits with
//! code 1 and is restarted by the postmaster after [`RESTART_SECONDS`]; neither takes the server down.

use std::time::{Duration, Instant};

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use crate::gucs;
use crate::stats;
use crate::store;
use crate::time::{clock, clock_shift};

/// Rows a database's purge reads per transaction (deleting the full, idle ones): the most a caller can
/// wait for the worker is the time one such transaction takes, a few milliseconds.
pub const SPAN: i64 = store::PURGE_SPAN_ROWS;

/// Milliseconds a database's purge waits for a lock (`lock_timeout`) before it fails; the next round
/// tries again.
pub const LOCK_TIMEOUT_MS: i32 = 1000;

/// How often the launcher of a standby samples its clock's skew (see [`crate::time::clock_shift`]).
pub const CLOCK_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// Seconds before the postmaster restarts a launcher that exited with an error.
pub const RESTART_SECONDS: u64 = 10;

/// Registers the launcher. Called from `_PG_init` while preloading.
pub fn register() {
    BackgroundWorkerBuilder::new("rate_limit launcher")
        .set_type("rate_limit launcher")
        .set_library("rate_limit")
        .set_function("rate_limit_launcher_main")
        .enable_shmem_access(None)
        .enable_spi_access() // connected to no database, but able to read the shared catalogs
        .set_start_time(BgWorkerStartTime::ConsistentState)
        .set_restart_time(Some(Duration::from_secs(RESTART_SECONDS)))
        .load();
}

/// When a job that last ran at `last` (None: never) is due again every `interval_seconds` (0: never);
/// a job that never ran is due at once.
fn due(last: Option<Instant>, interval_seconds: i32) -> Option<Instant> {
    let every = (interval_seconds > 0).then(|| Duration::from_secs(interval_seconds as u64))?;
    Some(last.map_or_else(Instant::now, |at| at + every))
}

/// The launcher's main loop.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn rate_limit_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    if server_is_stopping() {
        return; // started after the shutdown was broadcast: no SIGTERM will come
    }
    BackgroundWorker::connect_worker_to_spi(None, None);
    set_idle();
    // When each job last ran (None: not yet). The next run is due `interval` after the last one, with the
    // interval read afresh at every wake-up, so a reload that shortens it takes effect at once.
    let mut last_purge: Option<Instant> = None;
    let mut last_snapshot: Option<Instant> = None;
    let mut clock_shift = clock_shift::Sampler::default();
    loop {
        if BackgroundWorker::sighup_received() {
            // SAFETY: called in the worker's main loop, outside any transaction, as PostgreSQL's own
            // processes reload their configuration.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        clock_shift.tick();
        let next_purge = due(last_purge, gucs::purge_interval());
        if next_purge.is_some_and(|at| Instant::now() >= at) {
            purge_round();
            last_purge = Some(Instant::now());
        }
        let next_snapshot = due(last_snapshot, gucs::memory_snapshot_interval());
        if next_snapshot.is_some_and(|at| Instant::now() >= at) {
            store::save_memory();
            last_snapshot = Some(Instant::now());
        }
        let now = Instant::now();
        let wake = [
            due(last_purge, gucs::purge_interval()),
            due(last_snapshot, gucs::memory_snapshot_interval()),
        ]
        .into_iter()
        .flatten()
        .min()
        .map_or(Duration::from_secs(60), |at| {
            at.saturating_duration_since(now)
        })
        .min(if clock_shift::Sampler::wants_ticks() {
            CLOCK_SAMPLE_INTERVAL
        } else {
            Duration::MAX
        });
        if !BackgroundWorker::wait_latch(Some(wake.max(Duration::from_millis(10))))
            || server_is_stopping()
        {
            break;
        }
    }
}

/// Whether the postmaster is shutting down, as it writes in `postmaster.pid` before it signals its
/// children (status line `stopping`, since PostgreSQL 10).
///
/// The postmaster can start a worker after it broadcast a fast shutdown's SIGTERM (seen once in 28
/// fast stops a fraction of a second after `pg_ctl -w start`: `reaper → maybe_start_bgworkers`); that
/// worker never receives the signal, and the postmaster waits for it. Read after the signal handlers
/// are attached, this closes the race: if the file does not say `stopping` yet, the postmaster has not
/// signalled yet, and will signal this process, already in its list. A file that cannot be read says
/// nothing (false).
fn server_is_stopping() -> bool {
    std::fs::read_to_string(data_directory().join("postmaster.pid")).is_ok_and(|pid_file| {
        pid_file
            .lines()
            .nth(POSTMASTER_PID_STATUS_LINE)
            .is_some_and(|status| status.trim() == "stopping")
    })
}

/// Index (from 0) of the status line in `postmaster.pid` (`LOCK_FILE_LINE_PM_STATUS`, 8, counts from 1).
const POSTMASTER_PID_STATUS_LINE: usize = 7;

/// The server's data directory.
fn data_directory() -> std::path::PathBuf {
    // SAFETY: DataDir is set by the postmaster before any child starts and never changes after; it points
    // to a NUL-terminated string in memory that lives as long as the process.
    let dir = unsafe { std::ffi::CStr::from_ptr(pg_sys::DataDir) };
    std::path::PathBuf::from(dir.to_string_lossy().into_owned())
}

/// One purge: the memory store, then the table store of every database, one worker at a time.
fn purge_round() {
    set_activity("purging the memory store");
    if store::memory_available() {
        // The databases holding buckets are read before pg_database, so a database created meanwhile
        // (whose backends could not have made buckets before it committed) is never taken for dropped.
        let holding = store::memory_shares("rate_limit launcher").unwrap_or_default();
        let existing: Vec<u32> = databases().iter().map(|(oid, _)| oid.to_u32()).collect();
        let dropped: Vec<u32> = holding
            .iter()
            .map(|(database, _)| *database)
            .filter(|database| !existing.contains(database))
            .collect();
        match store::purge_memory_of_server("rate_limit launcher", &dropped) {
            Ok(freed) => stats::note_memory_purge(clock::now_us(), freed),
            Err(e) => e.report(PgLogLevel::WARNING),
        }
    }
    // SAFETY: RecoveryInProgress only reads shared state.
    if unsafe { pg_sys::RecoveryInProgress() } {
        set_idle();
        return; // a standby's table store is the primary's, purged there
    }
    for (database, _) in databases()
        .into_iter()
        .filter(|(_, connectable)| *connectable)
    {
        set_activity("waiting for a database's purge");
        // SAFETY: MyProcPid is a plain global of this process.
        let me = unsafe { pg_sys::MyProcPid };
        let started = BackgroundWorkerBuilder::new("rate_limit purge")
            .set_type("rate_limit purge")
            .set_library("rate_limit")
            .set_function("rate_limit_purge_main")
            .enable_spi_access()
            .set_start_time(BgWorkerStartTime::RecoveryFinished)
            .set_argument(Some(pg_sys::Datum::from(database.to_u32())))
            .set_notify_pid(me)
            .load_dynamic();
        match started {
            Ok(worker) => {
                let _ = worker.wait_for_shutdown();
            }
            Err(_) => {
                log!("rate_limit launcher: no background worker slot free (max_worker_processes); the table store is purged next round");
                break;
            }
        }
        if BackgroundWorker::sigterm_received() {
            break;
        }
    }
    set_idle();
}

/// Every database, and whether it accepts connections, read from the shared catalog `pg_database`.
fn databases() -> Vec<(pg_sys::Oid, bool)> {
    BackgroundWorker::transaction(|| {
        let mut oids = Vec::new();
        // SAFETY: inside a transaction with a snapshot (BackgroundWorker::transaction); pg_database is a
        // shared catalog any process may scan, as the autovacuum launcher does; every tuple returned by
        // heap_getnext is a valid pg_database row until the next call.
        unsafe {
            let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
            let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, lock);
            let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
            loop {
                let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
                if tuple.is_null() {
                    break;
                }
                let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tuple);
                oids.push(((*form).oid, (*form).datallowconn));
            }
            pg_sys::table_endscan(scan);
            pg_sys::table_close(rel, lock);
        }
        oids
    })
}

/// Shows `what` in the `query` column of `pg_stat_activity`, with state `active`.
fn set_activity(what: &str) {
    report(pg_sys::BackendState::STATE_RUNNING, what);
}

/// Shows the launcher as `idle` in `pg_stat_activity`, waiting for its next round.
fn set_idle() {
    report(
        pg_sys::BackendState::STATE_IDLE,
        "waiting for the next purge",
    );
}

fn report(state: pg_sys::BackendState::Type, what: &str) {
    let text = std::ffi::CString::new(what).unwrap_or_default();
    // SAFETY: pgstat_report_activity copies the string; the state is a valid enum value.
    unsafe { pg_sys::pgstat_report_activity(state, text.as_ptr()) };
}

/// One database's purge: the memory buckets of its dropped policies, then the table store's full rows (a
/// dynamic worker; `arg` is the database's OID).
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn rate_limit_purge_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    if server_is_stopping() {
        return; // as for the launcher
    }
    let database = pg_sys::Oid::from(arg.value() as u32);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(database), None);
    let installed = BackgroundWorker::transaction(|| {
        // for the whole session of this worker
        Spi::run(&format!("SET lock_timeout = {LOCK_TIMEOUT_MS}"))?;
        // a purge's deletes lost in a crash come back as full rows, deleted next round: no commit of this
        // worker needs to wait for its WAL to reach the disk
        Spi::run("SET synchronous_commit = off")?;
        Spi::get_one::<String>(
            "SELECT extversion FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'rate_limit'",
        )
    });
    match installed {
        Ok(Some(version)) if version == env!("CARGO_PKG_VERSION") => {}
        Ok(Some(version)) => {
            log!(
                "rate_limit purge: skipped database {}: the extension is at version {version}, the library at {}; run ALTER EXTENSION rate_limit UPDATE",
                database.to_u32(),
                env!("CARGO_PKG_VERSION")
            );
            return;
        }
        _ => return, // not installed here
    }
    set_activity("freeing the memory buckets of dropped policies");
    if let Err(e) =
        BackgroundWorker::transaction(|| store::free_memory_of_dropped_policies("rate_limit purge"))
    {
        e.report(PgLogLevel::WARNING);
    }
    set_activity("purging full buckets from rate_limit.bucket_state");
    // a bucket untouched for a whole interval (since before the last round) is idle: one in use is kept
    let idle_us = i64::from(gucs::purge_interval()).saturating_mul(1_000_000);
    match purge_table_store(idle_us) {
        // a finished purge is noted (for rate_limit.metrics_purge); a failed or interrupted one is not
        Ok(Some(freed)) => stats::note_table_purge(clock::now_us(), freed),
        Ok(None) => {}
        Err(e) => e.report(PgLogLevel::WARNING),
    }
}

/// Deletes the full rows of the table store untouched for `idle_us` microseconds, span by span (see
/// [`store::purge_table_span`]), each span its own transaction; returns how many, or `None` when SIGTERM
/// stopped it first.
fn purge_table_store(idle_us: i64) -> Result<Option<i64>, ErrorReport> {
    let targets = BackgroundWorker::transaction(|| store::purge_table_targets("rate_limit purge"))?;
    let mut freed = 0i64;
    for table in &targets {
        let mut after = None;
        loop {
            if BackgroundWorker::sigterm_received() {
                return Ok(None);
            }
            let span = BackgroundWorker::transaction(|| {
                store::purge_table_span("rate_limit purge", table, after.as_ref(), SPAN, idle_us)
            })?;
            freed = freed.saturating_add(span.deleted);
            match span.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    Ok(Some(freed))
}
