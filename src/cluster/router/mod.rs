//! What the PL/Proxy router (`router/plproxy.sql`) loads from this library, in a database that does not
//! have the extension: the deadline of every forwarded call ([`deadline`]) and the one C function that
//! forwards a single-partition call to its PL/Proxy function under that deadline ([`forward`]), with
//! what a failed call becomes ([`failure`]).

pub mod deadline;
pub mod failure;
pub mod forward;

pub use deadline::{on_subtransaction_end, on_transaction_end};
