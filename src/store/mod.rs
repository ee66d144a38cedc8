//! Where bucket state lives. A store loads, locks and saves [`crate::bucket::Bucket`]s; it does no
//! arithmetic of its own.

pub mod memory;
pub mod policy_table;
pub mod short;
pub mod spi_util;
pub mod table;
pub mod target;
