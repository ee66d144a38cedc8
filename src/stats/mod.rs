//! Statistics in shared memory: per policy (and for `rate_limiting_request` and the ad-hoc limits, each as
//! a whole), per database, the calls, grants, denials, tokens granted, the last denial and since when, plus
//! the keys denied most ([`summary`]). Nothing is written to a table on the call path; the counters need
//! the library preloaded (without it nothing is counted and the views raise 55000).
//!
//! Locking contract.
//! - An entry is created once per (database, namespace) under the tranche's single LWLock (exclusive):
//!   its identity is written first, then it is published in the open-addressing index with a release
//!   store. Lookups read the index without any lock (acquire loads); entries are never removed or reused
//!   while the server runs, so an index a backend cached stays valid. When every entry is taken, calls of
//!   new namespaces are counted in `untracked` only.
//! - Counters are atomics updated without a lock, spread over [`STRIPES`] cache lines per entry (chosen by
//!   the backend's pid) so that backends hitting one hot policy do not all write one cache line; readers add
//!   the stripes up. `since` and `last_denial` are single atomic words.
//! - The denied-keys summary of an entry is guarded by a spin lock of its own, held only to update or copy
//!   the summary: a few dozen comparisons, no allocation, nothing that can fail. A backend adds repeated
//!   denials of one key in batches ([`Pending`]): `top_limited` may lag behind `denied` by up to
//!   [`FLUSH_AFTER_DENIALS`] denials per backend, for [`FLUSH_AFTER_US`] while it runs transactions, and
//!   until its next transaction or its exit when it goes idle.
//! - A reset zeroes counters and summaries in place; calls running meanwhile may land on either side.
//!
//! Counting. A call with cost ≥ 1 counts once per (namespace, key) it names: `calls`; `granted` and
//! `tokens` when the whole call was granted and this namespace's bucket gave its tokens; `denied` when
//! this namespace's bucket refused it (in a multi-limit call, another policy may be the one that refused:
//! then only `calls` grows here). A bucket in shadow mode that would have refused counts as `denied` (and
//! in the top limited keys) although the call went through. A charge counts as granted. Calls with cost 0
//! (`peek`, reports) are not counted; every attempt of `wait` is.
//!
//! Persistence. A clean shutdown saves every entry with counts to `pg_stat/rate_limit.stats`, loaded by the
//! next start (then deleted); a crash loses them, as pg_stat_statements' do.

pub use rate_limit_model::denials::{FLUSH_AFTER_DENIALS, FLUSH_AFTER_US};
pub use rate_limit_model::summary;

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

use crate::backend::current_database;
use crate::gucs;
use crate::name_map::{self, NameMap};
use crate::time::clock;
use pending::{flush_pending, note_denial};
use rate_limit_model::algorithm::Outcome;
use rate_limit_model::pipeline::Answer;
use rate_limit_model::summary::{Counter, Summary};
use rate_limit_model::target::Target;
use segment::Stats;

mod pending;
mod purges;
mod segment;
mod snapshot;

pub use pending::flush_if_due;
pub use purges::Purge;
pub use segment::{attach_or_create, request_shmem, Totals, STRIPES};
pub use snapshot::{load_saved, save};

thread_local! {
    /// This backend's entry of each namespace (a backend stays in one database; entries are never reused).
    static ENTRIES: RefCell<NameMap<Box<str>, u32>> = const { RefCell::new(name_map::new()) };
}

fn entry_for(stats: &Stats, name: &str) -> Option<u32> {
    if let Some(i) = ENTRIES.with(|m| m.borrow().get(name).copied()) {
        return Some(i);
    }
    let i = stats.find_or_create(current_database(), name)?;
    ENTRIES.with(|m| m.borrow_mut().insert(name.into(), i));
    Some(i)
}

/// Counts a call of `costs[i]` tokens of `targets[i]` with their `outcomes`. Does nothing when the library
/// is not preloaded, for a report (every cost 0), or with `rate_limit.track_stats` off.
pub fn record(targets: &[Target<'_>], outcomes: &[Outcome], costs: &[i64]) {
    if costs.iter().all(|c| *c <= 0) || !gucs::track_stats() {
        return;
    }
    let Some(stats) = Stats::attach() else {
        return;
    };
    let allowed = rate_limit_model::target::granted(targets, outcomes);
    // SAFETY: MyProcPid is a plain global of the backend.
    let stripe = unsafe { pg_sys::MyProcPid } as usize % STRIPES;
    for ((t, o), cost) in targets.iter().zip(outcomes).zip(costs) {
        let Some(i) = entry_for(&stats, t.namespace.stored_name()) else {
            stats.header.untracked.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let e = stats.entry(i);
        let s = &e.stripes[stripe];
        s.calls.fetch_add(1, Ordering::Relaxed);
        if allowed && o.allowed {
            s.granted.fetch_add(1, Ordering::Relaxed);
            s.tokens.fetch_add(*cost as u64, Ordering::Relaxed);
        } else if !o.allowed {
            s.denied.fetch_add(1, Ordering::Relaxed);
            if t.shadow {
                s.shadow_denied.fetch_add(1, Ordering::Relaxed);
            }
            let now = clock::now_us();
            // to the millisecond: a denied flood does not make every backend write this word every call
            if e.last_denial.load(Ordering::Relaxed) < now - 1000 {
                e.last_denial.store(now, Ordering::Relaxed);
            }
            note_denial(&stats, i, t.key, now);
        }
    }
}

/// Counts `calls` granted calls of one bucket each under `target`'s namespace, which took `tokens` tokens
/// in all: what [`record`] counts for each of them, added at once (a batch's grants).
pub fn record_grants(target: &Target<'_>, calls: u64, tokens: u64) {
    if calls == 0 {
        return;
    }
    with_stripe(target, calls, |s| {
        s.calls.fetch_add(calls, Ordering::Relaxed);
        s.granted.fetch_add(calls, Ordering::Relaxed);
        s.tokens.fetch_add(tokens, Ordering::Relaxed);
    });
}

/// Counts the targets a block refused (or, in shadow mode, would have): `answers[i]` is the answer for
/// `targets[i]`. Called with [`record`], which counts their denials. A key with a fixed answer under an
/// override (deny, exempt) was decided by it, not by its block.
pub fn record_blocks(targets: &[Target<'_>], answers: &[Answer]) {
    for (t, _) in targets
        .iter()
        .zip(answers)
        .filter(|(t, a)| a.by_block && t.verdict.is_none())
    {
        // counted in `untracked` by `record` already when the namespace has no entry
        with_stripe(t, 0, |s| {
            s.blocked.fetch_add(1, Ordering::Relaxed);
        });
    }
}

/// Runs `f` on this backend's stripe of the entry of `target`'s namespace; without an entry, counts
/// `untracked` calls instead. Nothing when the library is not preloaded or `rate_limit.track_stats` is off.
fn with_stripe(target: &Target<'_>, untracked: u64, f: impl FnOnce(&segment::Stripe)) {
    if !gucs::track_stats() {
        return;
    }
    let Some(stats) = Stats::attach() else {
        return;
    };
    let Some(i) = entry_for(&stats, target.namespace.stored_name()) else {
        stats
            .header
            .untracked
            .fetch_add(untracked, Ordering::Relaxed);
        return;
    };
    // SAFETY: MyProcPid is a plain global of the backend.
    let stripe = unsafe { pg_sys::MyProcPid } as usize % STRIPES;
    f(&stats.entry(i).stripes[stripe]);
}

/// Notes that the background worker finished purging the memory store at `at`, deleting `freed` buckets.
pub fn note_memory_purge(at: i64, freed: i64) {
    if let Some(stats) = Stats::attach() {
        stats.header.purges.note_memory(at, freed);
    }
}

/// Notes that the background worker finished purging the current database's table store at `at`,
/// deleting `freed` rows.
pub fn note_table_purge(at: i64, freed: i64) {
    if let Some(stats) = Stats::attach() {
        stats
            .header
            .purges
            .note_database(current_database(), at, freed);
    }
}

/// The background worker's last purge of the current database's table store and of the memory store
/// (each `None` until the first since the server started); 55000 without preloading.
pub fn last_purges(function: &'static str) -> Result<(Option<Purge>, Option<Purge>), ErrorReport> {
    let stats = Stats::attach().ok_or_else(|| not_preloaded(function))?;
    let p = &stats.header.purges;
    Ok((p.database(current_database()), p.memory()))
}

/// 55000 with a hint: the statistics live in shared memory.
fn not_preloaded(function: &'static str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "rate_limit statistics are not available: the library was not preloaded",
        function,
    )
    .set_hint(
        "Add rate_limit to shared_preload_libraries in postgresql.conf and restart the server: the \
         statistics are kept in shared memory.",
    )
}

/// One namespace's statistics in the current database.
pub struct Row {
    /// The namespace name (a policy, `#request` or `#ad_hoc`).
    pub name: String,
    /// The counters.
    pub totals: Totals,
    /// Wall clock of the last denial (µs), if any.
    pub last_denial: Option<i64>,
    /// Wall clock of creation or reset (µs).
    pub since: i64,
    /// The most denied keys, most first.
    pub top: Vec<Counter>,
}

/// Every namespace of the current database with statistics; 55000 without preloading.
pub fn rows(function: &'static str) -> Result<Vec<Row>, ErrorReport> {
    let stats = Stats::attach().ok_or_else(|| not_preloaded(function))?;
    flush_pending(&stats);
    let database = current_database();
    let used = stats.header.used.load(Ordering::Acquire);
    let mut rows = Vec::new();
    for i in 0..used {
        let e = stats.entry(i);
        if e.database != database {
            continue;
        }
        let mut summary = Summary::default();
        e.with_summary(|s| summary = *s);
        let last = e.last_denial.load(Ordering::Relaxed);
        rows.push(Row {
            name: e.name().to_string(),
            totals: e.totals(),
            last_denial: (last != 0).then_some(last),
            since: e.since.load(Ordering::Relaxed),
            top: summary.ranked(),
        });
    }
    Ok(rows)
}

/// Calls of namespaces that found no free entry (all databases); 55000 without preloading.
pub fn untracked(function: &'static str) -> Result<u64, ErrorReport> {
    let stats = Stats::attach().ok_or_else(|| not_preloaded(function))?;
    Ok(stats.header.untracked.load(Ordering::Relaxed))
}

/// Zeroes the statistics of the current database's namespace `name`, or of all of them; returns how many
/// entries were reset.
pub fn reset(function: &'static str, name: Option<&str>) -> Result<i64, ErrorReport> {
    let stats = Stats::attach().ok_or_else(|| not_preloaded(function))?;
    flush_pending(&stats);
    let database = current_database();
    let used = stats.header.used.load(Ordering::Acquire);
    let now = clock::now_us();
    let mut n = 0;
    for i in 0..used {
        let e = stats.entry(i);
        if e.database != database || name.is_some_and(|n| n != e.name()) {
            continue;
        }
        e.set_totals(Totals::default());
        e.last_denial.store(0, Ordering::Relaxed);
        e.with_summary(|s| *s = Summary::default());
        e.since.store(now, Ordering::Relaxed);
        n += 1;
    }
    if name.is_none() && stats.header.untracked.load(Ordering::Relaxed) != 0 {
        stats.header.untracked.store(0, Ordering::Relaxed);
    }
    Ok(n)
}
