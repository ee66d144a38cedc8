//! `#[pg_test]`s: SQL behaviour inside a real PostgreSQL. Shared state outlives a test, so every test uses
//! keys of its own. Errors are checked by SQLSTATE through a PL/pgSQL helper that catches them in a
//! subtransaction.
//! One file per subject; each holds a `#[pg_schema] mod tests`, as pgrx expects of `#[pg_test]`s.

mod arguments;
mod batch;
mod block_reads;
mod bookings;
mod catalog;
mod counters;
mod helpers;
mod kinds;
mod limiter;
mod memory_store;
mod metrics;
mod options;
mod overrides;
mod requests;
mod reservations;
