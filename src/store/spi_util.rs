//! Small helpers shared by the two table stores (`table.rs`, `policy_table.rs`).

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::SpiError;

use crate::error;

/// A type oid as SPI's argument type.
pub fn oid(o: pg_sys::Oid) -> PgOid {
    PgOid::from(o)
}

/// An SPI failure as XX000 (only a bug or a damaged installation can cause one).
pub fn spi<T>(function: &'static str, r: Result<T, SpiError>) -> Result<T, ErrorReport> {
    r.map_err(|e| error::internal(function, e))
}

/// Microseconds on the server clock as a `timestamptz` argument.
pub fn timestamptz(us: i64, function: &'static str) -> Result<TimestampWithTimeZone, ErrorReport> {
    TimestampWithTimeZone::try_from(us)
        .map_err(|_| error::corrupt_row(function, "updated_at is out of range"))
}

/// Whether the current transaction is read-only (a table store can then only read).
pub fn read_only() -> bool {
    // SAFETY: XactReadOnly is a plain global of the backend, read on the backend's only thread.
    unsafe { pg_sys::XactReadOnly }
}
