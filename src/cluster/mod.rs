//! rate_limit on more than one server, on engines users already run (no router of our own).
//!
//! - [`citus`]: `rate_limit.distribute()` makes the policies a Citus reference table, distributes the state
//!   table by key and registers every keyed call as a distributed function colocated with it, so that a
//!   call runs on the node that holds its key. It also guards the memory store: a memory bucket lives only
//!   on the node of its key's shard, and a call that reaches another node is refused, never answered from
//!   a second copy.
//! - [`merged`]: on the coordinator, the statistics, top limited keys and memory buckets of every node,
//!   merged into one answer.
//! - [`router`]: what the PL/Proxy router (`router/plproxy.sql`) loads into its database: the deadline of
//!   its calls, and the forwarder of those sent to one partition.

pub mod citus;
pub mod citus_catalog;
pub mod installed;
pub mod merged;
pub mod router;
pub mod shards;

/// Forgets what this module remembers for one transaction (the last key's shard): called at every end of a
/// transaction and every aborted subtransaction.
pub fn forget_transaction_memos() {
    shards::forget();
}
