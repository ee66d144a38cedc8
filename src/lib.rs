//! rate_limit: exact token-bucket rate limiting inside PostgreSQL.
//!
//! `bucket` holds the arithmetic (pure Rust), `store` loads and saves bucket state, `api` is the SQL surface,
//! `error` the SQLSTATE errors. The hand-written SQL (schema, table, view, grants) is in `sql/`.

use pgrx::prelude::*;

pub mod api;
pub mod bucket;
pub mod clock;
pub mod error;
pub mod store;

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/bootstrap.sql", bootstrap);
extension_sql_file!("../sql/finalize.sql", finalize);

/// Required by `cargo pgrx test`: one-off set-up and the `postgresql.conf` of the test cluster.
#[cfg(test)]
pub mod pg_test {
    /// Nothing to prepare before the test cluster starts.
    pub fn setup(_options: Vec<&str>) {}

    /// No extra settings: the table store needs none.
    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
