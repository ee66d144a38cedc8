//! `rate_limit.nodes_of(keys)`: under Citus, the node that holds each key, so that an application or a
//! pooler can send a key's calls straight to it (docs/scaling.md, "Straight to the key's node").
//!
//! The key's shard is found as the table store finds it on a call's path ([`shards::shard_of`]:
//! Citus's hash and the shards' ranges), and the node from the shard's placement. An answer is as fresh as
//! the catalogs of the node asked; a call sent with a stale answer still runs exactly (Citus delegates it
//! from the node it reached to the key's node, one hop more).

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::spi::Spi;
use pgrx::PgSqlErrorCode;

use super::key_arg;
use crate::cluster::shards;
use crate::error;

/// One key's node: the key, the node's host and port as Citus lists it (`pg_dist_node`), and the shard.
type KeyNode = (String, Option<String>, Option<i32>, i64);

/// The primary node of each shard, as `pg_dist_node` names it.
const NODES_OF_SHARDS: &str = "SELECT p.shardid, n.nodename, n.nodeport \
     FROM pg_catalog.pg_dist_placement AS p \
     JOIN pg_catalog.pg_dist_node AS n ON n.groupid OPERATOR(pg_catalog.=) p.groupid \
     WHERE p.shardid OPERATOR(pg_catalog.=) ANY ($1) AND n.noderole OPERATOR(pg_catalog.=) 'primary'";

/// 0A000: the state table is not distributed (no Citus, or `rate_limit.distribute()` not run).
fn not_distributed(function: &'static str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        "rate_limit.nodes_of needs rate_limit.bucket_state distributed by Citus",
        function,
    )
    .set_hint(
        "Without Citus every call runs on the server it reaches: send it there. Under Citus, call \
         rate_limit.distribute() on the coordinator first.",
    )
}

/// Each key of `keys` with its node, in the order given.
fn nodes_of(function: &'static str, keys: &[Option<String>]) -> Result<Vec<KeyNode>, ErrorReport> {
    // first, so that no keys (an empty array) are answered as any keys are, and Citus's catalogs are read
    // only where they exist
    if !shards::distributed() {
        return Err(not_distributed(function));
    }
    let mut shards_of_keys = Vec::with_capacity(keys.len());
    for key in keys {
        let key = key_arg(function, "keys", key.as_deref())?;
        let shard = shards::shard_of(key).ok_or_else(|| not_distributed(function))?;
        shards_of_keys.push((key.to_string(), shard.id));
    }
    let mut ids: Vec<i64> = shards_of_keys.iter().map(|(_, id)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    let nodes = Spi::connect(|client| {
        let args: [DatumWithOid<'_>; 1] = [ids.into()];
        let mut nodes = Vec::new();
        for row in client.select(NODES_OF_SHARDS, None, &args)? {
            let id: Option<i64> = row.get(1)?;
            nodes.push((id, row.get::<String>(2)?, row.get::<i32>(3)?));
        }
        Ok::<_, pgrx::spi::SpiError>(nodes)
    })
    .map_err(|e| error::internal(function, e))?;
    Ok(shards_of_keys
        .into_iter()
        .map(|(key, id)| {
            let node = nodes.iter().find(|(shard, _, _)| *shard == Some(id));
            let (host, port) = node.map_or((None, None), |(_, h, p)| (h.clone(), *p));
            (key, host, port, id)
        })
        .collect())
}

/// The function, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Under Citus, the node that holds each key of `keys` (host and port as `pg_dist_node` lists them, and
    /// the key's shard), in the order given: where to send the key's calls to skip Citus's hop. 0A000
    /// while the state table is not distributed; 22004 for a NULL key, 22023 for one over 2048 bytes.
    /// SECURITY DEFINER like the calls it serves: it reads Citus's catalogs whatever the caller may read.
    #[pg_extern(stable, parallel_safe, security_definer)]
    #[allow(clippy::type_complexity)] // the row type is the SQL signature, spelled out for pgrx
    fn nodes_of(
        keys: Option<Vec<Option<String>>>,
    ) -> Result<
        TableIterator<
            'static,
            (
                name!(key, String),
                name!(host, Option<String>),
                name!(port, Option<i32>),
                name!(shard, i64),
            ),
        >,
        ErrorReport,
    > {
        const F: &str = "rate_limit.nodes_of";
        let keys = keys.ok_or_else(|| {
            error::null_argument(F, "keys", "Pass an array of the keys to locate.")
        })?;
        super::nodes_of(F, &keys).map(TableIterator::new)
    }
}
