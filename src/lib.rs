//! rate_limit: exact token-bucket rate limiting inside PostgreSQL.
//!
//! One model: the `rate_limit_model` crate (re-exported here as `algorithm`, `http` and `target`) holds the
//! exact arithmetic of every limit (pure Rust, no PostgreSQL types); `decision` and `http` shape what a call
//! reports. One store seam: `store` takes, peeks, refunds, resets, purges and lists the buckets of a call, in
//! the table store or the memory store. `api` is the thin SQL surface, `policies` the coherent cache of
//! named policies, `error` the SQLSTATE errors, `gucs` the settings, `time` the clocks, a standby's skew and
//! calendar periods, `bounds` the bounds that numbers set, `cluster` Citus, `surface` the registry of every
//! SQL function. For operators: `stats` counts
//! calls per policy in shared memory, `worker` purges full buckets in the background, `hooks` wires the
//! shared memory of both into PostgreSQL's hooks (`shmem` is the leaf of facts and helpers they share, and
//! imports nothing of the crate) and `persist` keeps it across clean restarts. `backend` and `name_map` are leaves
//! too: facts about this backend, and the map its caches of policies keep by name. The hand-written SQL
//! (schema, table, views, grants, upgrade scripts) is in `sql/`.

use pgrx::prelude::*;

pub mod api;
pub mod backend;
pub mod bounds;
pub mod cluster;
pub mod decision;
pub mod error;
pub mod gucs;
pub mod hooks;
pub mod kept_plans;
pub mod name_map;
pub mod persist;
pub mod policies;
pub mod shmem;
pub mod stats;
pub mod store;
pub mod surface;
pub mod time;
pub mod worker;

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/bootstrap.sql", bootstrap);
extension_sql_file!("../sql/finalize.sql", finalize);

/// Registers the settings; when the library is preloaded, also requests the memory store's shared memory.
/// Without preloading it stays quiet: the table store needs nothing, and the memory store's functions
/// raise 55000 with a hint.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: a plain global of the postmaster/backend, read on its only thread.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    error::never_capture_backtraces();
    gucs::init(preloading);
    if preloading {
        hooks::init_when_preloading();
        worker::register();
    }
    // SAFETY: registering callbacks is allowed at any time in a backend; the functions live as long as the
    // library, which is never unloaded.
    unsafe {
        pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact_event), std::ptr::null_mut());
    }
    policies::register_invalidation();
    backend::register_owner_invalidation();
}

/// A rolled-back transaction may refund tokens: forget the buckets remembered as short. Apply the memory
/// store's settles at commit, drop them at an abort. Forget what the cluster module remembers for one
/// transaction, and clear the router's deadline. At every end of a transaction, add this backend's pending denials to the statistics once they are old enough.
#[pg_guard]
unsafe extern "C-unwind" fn on_xact_event(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    cluster::forget_transaction_memos();
    if event == pg_sys::XactEvent::XACT_EVENT_COMMIT
        || event == pg_sys::XactEvent::XACT_EVENT_ABORT
        || event == pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT
        || event == pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
        || event == pg_sys::XactEvent::XACT_EVENT_PREPARE
    {
        cluster::router::on_transaction_end();
        policies::overrides::on_transaction_end();
    }
    if event == pg_sys::XactEvent::XACT_EVENT_COMMIT {
        store::settles::on_commit();
    }
    if event == pg_sys::XactEvent::XACT_EVENT_PRE_PREPARE {
        store::settles::on_prepare();
    }
    if event == pg_sys::XactEvent::XACT_EVENT_ABORT
        || event == pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
    {
        store::settles::on_abort();
        store::short::forget_all();
        policies::overrides::filter::on_abort();
    }
    if event == pg_sys::XactEvent::XACT_EVENT_COMMIT || event == pg_sys::XactEvent::XACT_EVENT_ABORT
    {
        stats::flush_if_due();
    }
}

/// Likewise for ROLLBACK TO SAVEPOINT; and the router's deadline ends with the subtransaction that armed it.
#[pg_guard]
unsafe extern "C-unwind" fn on_subxact_event(
    event: pg_sys::SubXactEvent::Type,
    my: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB {
        store::settles::on_subtransaction_commit(my, parent);
    }
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB
        || event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB
    {
        cluster::router::on_subtransaction_end(my);
    }
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        store::settles::on_subtransaction_abort(my);
        policies::overrides::on_transaction_end();
        cluster::forget_transaction_memos();
        store::short::forget_all();
    }
}

/// Required by `cargo pgrx test`: one-off set-up and the `postgresql.conf` of the test cluster.
#[cfg(test)]
pub mod pg_test {
    /// Nothing to prepare before the test cluster starts.
    pub fn setup(_options: Vec<&str>) {}

    /// Preload the library so that the memory store is tested too.
    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![
            "shared_preload_libraries = 'rate_limit'",
            "rate_limit.max_buckets = 4096",
            // no background purge under the tests: some count what rate_limit.purge() deleted
            "rate_limit.purge_interval = 0",
        ]
    }
}
