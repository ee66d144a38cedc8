//! Citus: `rate_limit.distribute()` and the memory store's guard.
//!
//! What `distribute` does, in this order, each step only if it is not done yet (so it is idempotent):
//! 1. `create_reference_table('rate_limit.policies')` and `('rate_limit.key_overrides')`, with
//!    `citus.enable_unsafe_triggers` on for the call: every node gets a copy of the policies and their
//!    per-key overrides, and the statement triggers that keep each backend's policy cache coherent (and
//!    record dropped policies) fire on every node's copy when a change is applied there.
//! 2. `create_distributed_table('rate_limit.bucket_state', 'key', shard_count => …)`: a key's buckets, under
//!    every policy, live in one shard.
//! 3. `create_distributed_function(f, key argument, colocate_with => 'rate_limit.bucket_state',
//!    force_delegation => true)` for every function that names one key (the keyed functions of
//!    [`crate::surface`]): a call is run on the node that holds the key's shard, inside transaction
//!    blocks too (Citus then makes the transaction a distributed one).
//!
//! The memory store under Citus ([`ensure_memory_bucket_here`]): a bucket must exist in exactly one node's
//! shared memory, the node that holds its key's shard. Delegated calls run there. A call Citus does not
//! delegate (an expression in PL/pgSQL, a trigger, a call inside a larger query) runs where it arrives, and
//! is refused with 0A000 unless that is the key's node: it cannot reach the other node's memory, and
//! answering from a second copy would grant a second burst.

use std::cell::Cell;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self};
use pgrx::prelude::*;
use pgrx::spi::{Spi, SpiClient};
use pgrx::PgSqlErrorCode;

use super::shards;
use crate::error;
use crate::surface;

pub use super::installed::citus_installed;
use super::installed::{citus_extension_exists, citus_loaded};

fn spi<T>(function: &'static str, r: Result<T, pgrx::spi::SpiError>) -> Result<T, ErrorReport> {
    r.map_err(|e| error::internal(function, e))
}

/// Runs `statement` (a Citus function that changes the cluster, or a setting for the transaction).
fn execute(
    function: &'static str,
    client: &mut SpiClient<'_>,
    statement: &str,
    args: &[DatumWithOid<'_>],
) -> Result<(), ErrorReport> {
    spi(function, client.update(statement, None, args)).map(|_| ())
}

/// The `count(*)` that `query` returns for `args`.
fn count(
    function: &'static str,
    client: &SpiClient<'_>,
    query: &str,
    args: &[DatumWithOid<'_>],
) -> Result<i64, ErrorReport> {
    let n: Option<i64> = spi(
        function,
        client
            .select(query, Some(1), args)
            .and_then(|t| t.first().get(1)),
    )?;
    Ok(n.unwrap_or(0))
}

fn is_distributed(
    function: &'static str,
    client: &SpiClient<'_>,
    table: &str,
) -> Result<bool, ErrorReport> {
    const Q: &str = "SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_partition \
                     WHERE logicalrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1)";
    Ok(count(function, client, Q, &[table.into()])? > 0)
}

fn is_distributed_function(
    function: &'static str,
    client: &SpiClient<'_>,
    signature: &str,
) -> Result<bool, ErrorReport> {
    const Q: &str = "SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_object \
                     WHERE classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass \
                       AND objid OPERATOR(pg_catalog.=) $1::pg_catalog.regprocedure::pg_catalog.oid \
                       AND colocationid IS NOT NULL AND force_delegation";
    Ok(count(function, client, Q, &[signature.into()])? > 0)
}

fn shard_count(function: &'static str, client: &SpiClient<'_>) -> Result<i64, ErrorReport> {
    const Q: &str = "SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_shard \
                     WHERE logicalrelid OPERATOR(pg_catalog.=) 'rate_limit.bucket_state'::pg_catalog.regclass";
    count(function, client, Q, &[])
}

fn without_citus(function: &'static str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        "rate_limit.distribute needs Citus in this database",
        function,
    )
    .set_hint(
        "Preload both libraries (shared_preload_libraries = 'citus,rate_limit'), CREATE EXTENSION citus, \
         add the worker nodes, then call rate_limit.distribute() on the coordinator. Without Citus, \
         rate_limit runs on one server and needs no distribution.",
    )
}

/// What `rate_limit.distribute` did: each object with its action.
type Steps = Vec<(String, String)>;

/// Runs the steps of `rate_limit.distribute`; returns each step with what it did.
fn distribute(
    function: &'static str,
    shard_count_wanted: Option<i32>,
) -> Result<Steps, ErrorReport> {
    // read now, not remembered: Citus may have been created earlier in this transaction
    if !(citus_loaded() && citus_extension_exists()) {
        return Err(without_citus(function));
    }
    if let Some(n) = shard_count_wanted.filter(|n| *n < 1) {
        return Err(error::out_of_range(
            function,
            "shard_count",
            i64::from(n),
            1,
            i64::from(i32::MAX),
        ));
    }
    Spi::connect_mut(|client| {
        refuse_off_the_coordinator(function, client)?;
        let mut done = Vec::new();
        make_policies_a_reference_table(function, client, &mut done)?;
        distribute_the_state_by_key(function, client, shard_count_wanted, &mut done)?;
        delegate_keyed_functions(function, client, &mut done)?;
        Ok(done)
    })
}

/// 55000 unless this node is the coordinator (group 0).
fn refuse_off_the_coordinator(
    function: &'static str,
    client: &SpiClient<'_>,
) -> Result<(), ErrorReport> {
    let group: Option<i32> = spi(
        function,
        client
            .select(
                "SELECT groupid FROM pg_catalog.pg_dist_local_group",
                Some(1),
                &[],
            )
            .and_then(|t| t.first().get(1)),
    )?;
    if group == Some(0) {
        return Ok(());
    }
    Err(ErrorReport::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "rate_limit.distribute must run on the Citus coordinator",
        function,
    )
    .set_hint("Connect to the coordinator (group 0) and call it there."))
}

/// Step 1: `rate_limit.policies` and `rate_limit.key_overrides` become reference tables, their triggers
/// firing on every node's copy.
fn make_policies_a_reference_table(
    function: &'static str,
    client: &mut SpiClient<'_>,
    done: &mut Steps,
) -> Result<(), ErrorReport> {
    for table in ["rate_limit.policies", "rate_limit.key_overrides"] {
        make_reference_table(function, client, done, table)?;
    }
    Ok(())
}

/// `table` becomes a reference table (once), its statement triggers firing on every node's copy.
fn make_reference_table(
    function: &'static str,
    client: &mut SpiClient<'_>,
    done: &mut Steps,
    table: &'static str,
) -> Result<(), ErrorReport> {
    if is_distributed(function, client, table)? {
        done.push((table.into(), "already a reference table".into()));
        return Ok(());
    }
    execute(
        function,
        client,
        "SELECT pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true)",
        &[],
    )?;
    let args: [DatumWithOid<'_>; 1] = [table.into()];
    execute(
        function,
        client,
        "SELECT pg_catalog.create_reference_table($1::pg_catalog.regclass)",
        &args,
    )?;
    done.push((table.into(), "made a reference table".into()));
    Ok(())
}

/// Step 2: `rate_limit.bucket_state` is distributed by key (55000 if it already is, with another shard
/// count than the one asked for).
fn distribute_the_state_by_key(
    function: &'static str,
    client: &mut SpiClient<'_>,
    shard_count_wanted: Option<i32>,
    done: &mut Steps,
) -> Result<(), ErrorReport> {
    const TABLE: &str = "rate_limit.bucket_state";
    if !is_distributed(function, client, TABLE)? {
        let args: [DatumWithOid<'_>; 1] = [shard_count_wanted.into()];
        execute(
            function,
            client,
            "SELECT pg_catalog.create_distributed_table('rate_limit.bucket_state', 'key', \
                 shard_count => $1)",
            &args,
        )?;
        done.push((TABLE.into(), "distributed by key".into()));
        return Ok(());
    }
    let have = shard_count(function, client)?;
    if let Some(want) = shard_count_wanted.filter(|w| i64::from(*w) != have) {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "rate_limit.bucket_state is already distributed with {have} shards, not {want}"
            ),
            function,
        )
        .set_hint(
            "Call rate_limit.distribute() without a shard count, or change it with Citus's \
             alter_distributed_table('rate_limit.bucket_state', shard_count => …): buckets it \
             moves start full (see docs/scaling.md).",
        ));
    }
    done.push((TABLE.into(), "already distributed by key".into()));
    Ok(())
}

/// Step 3: every keyed function of the SQL surface is delegated by its key, colocated with the state.
fn delegate_keyed_functions(
    function: &'static str,
    client: &mut SpiClient<'_>,
    done: &mut Steps,
) -> Result<(), ErrorReport> {
    let schema: Option<String> = spi(
        function,
        client
            .select(
                "SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e \
                 JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace \
                 WHERE e.extname OPERATOR(pg_catalog.=) 'rate_limit'",
                Some(1),
                &[],
            )
            .and_then(|t| t.first().get(1)),
    )?;
    let schema = schema.unwrap_or_else(|| "public".to_string());
    for (signature, argument) in surface::keyed_functions() {
        let signature = signature.replace("@extschema@", &schema);
        if is_distributed_function(function, client, &signature)? {
            done.push((signature, "already delegated by key".into()));
            continue;
        }
        let args: [DatumWithOid<'_>; 2] = [signature.as_str().into(), argument.into()];
        execute(
            function,
            client,
            "SELECT pg_catalog.create_distributed_function($1::pg_catalog.regprocedure, $2, \
                 colocate_with => 'rate_limit.bucket_state', force_delegation => true)",
            &args,
        )?;
        done.push((signature, "delegated by key".into()));
    }
    Ok(())
}

/// A node of the cluster holding a bucket: its host and port, and whether it is this node.
type BucketNode = (Option<String>, Option<i32>, Option<bool>);

/// Where the bucket of `key` lives under Citus; `None` while `rate_limit.bucket_state` is not distributed.
fn bucket_node(function: &'static str, key: &str) -> Result<Option<BucketNode>, ErrorReport> {
    const Q: &str = "SELECT n.nodename, n.nodeport, p.groupid OPERATOR(pg_catalog.=) l.groupid \
         FROM pg_catalog.pg_dist_partition d \
         CROSS JOIN pg_catalog.pg_dist_local_group l \
         JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) \
              pg_catalog.get_shard_id_for_distribution_column(d.logicalrelid, $1) \
         JOIN pg_catalog.pg_dist_node n ON n.groupid OPERATOR(pg_catalog.=) p.groupid \
         WHERE d.logicalrelid OPERATOR(pg_catalog.=) 'rate_limit.bucket_state'::pg_catalog.regclass";
    spi(
        function,
        Spi::connect(|client| {
            let args: [DatumWithOid<'_>; 1] = [key.into()];
            let t = client.select(Q, Some(1), &args)?;
            if t.is_empty() {
                return Ok(None);
            }
            let r = t.first();
            Ok(Some((r.get(1)?, r.get(2)?, r.get(3)?)))
        }),
    )
}

/// 0A000 (`what` of key … lives on node …, not on `here`, with `detail` and `hint`) when the bucket of
/// `key` lives on another node than this one; Ok while the state table is not distributed.
fn ensure_bucket_on_this_node(
    function: &'static str,
    key: &str,
    what: &str,
    here: &str,
    detail: &str,
    hint: &str,
) -> Result<(), ErrorReport> {
    // the common answer from the catalogs, no query; the node's name only for the error
    let placed_here = match shards::shard_of(key) {
        None => true,
        Some(shard) => super::citus_catalog::is_placed_here(shard.id),
    };
    if placed_here {
        return Ok(());
    }
    match bucket_node(function, key)? {
        None | Some((_, _, Some(true))) => Ok(()),
        Some((host, port, _)) => Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "the {what} of key {} lives on node {}:{}, not on {here}",
                crate::error::quoted(key),
                host.unwrap_or_default(),
                port.unwrap_or_default()
            ),
            function,
        )
        .set_detail(detail)
        .set_hint(hint)),
    }
}

/// 0A000 unless a memory-store bucket of `key` may live on this node: always without Citus, or while
/// `rate_limit.bucket_state` is not distributed; with it, only on the node that holds the key's shard.
pub fn ensure_memory_bucket_here(function: &'static str, key: &str) -> Result<(), ErrorReport> {
    if !citus_installed() {
        return Ok(());
    }
    ensure_bucket_on_this_node(
        function,
        key,
        "memory-store bucket",
        "this one",
        "Under Citus a memory bucket lives only on the node that holds its key's shard; this call \
         was not delegated there, and a second copy here would grant a second burst.",
        "Make the call a statement of its own (SELECT … FROM rate_limit.take(…)), which Citus \
         delegates to the key's node, or give the policy the table store.",
    )
}

thread_local! {
    /// The last relation a trigger asked about and whether it is a Citus shard: a relation's OID is a
    /// shard's or not for its whole life (distributing a table creates new shard relations), so a trigger
    /// firing row after row on one table asks Citus once.
    static LAST_SHARD_CHECK: Cell<Option<(pg_sys::Oid, bool)>> = const { Cell::new(None) };
}

/// Whether `relation` is a shard of a Citus distributed table (`relation_is_a_known_shard`), remembered
/// for the last relation asked about.
fn is_a_shard(function: &'static str, relation: pg_sys::Oid) -> Result<bool, ErrorReport> {
    if let Some((oid, shard)) = LAST_SHARD_CHECK.with(Cell::get) {
        if oid == relation {
            return Ok(shard);
        }
    }
    const ON_A_SHARD: &str = "SELECT pg_catalog.relation_is_a_known_shard($1)";
    let shard: Option<bool> = spi(
        function,
        Spi::connect(|client| {
            let args: [DatumWithOid<'_>; 1] = [relation.into()];
            client.select(ON_A_SHARD, Some(1), &args)?.first().get(1)
        }),
    )?;
    let shard = shard == Some(true);
    LAST_SHARD_CHECK.with(|c| c.set(Some((relation, shard))));
    Ok(shard)
}

/// 0A000 when a trigger fires on `relation`, a shard of a Citus distributed table, for a row whose
/// bucket (`key`) lives on another node: Citus cannot run the state table's statement from inside a
/// query on a shard (it would raise XX000). Nothing to check without Citus, or on an ordinary table.
pub fn ensure_bucket_reachable_from_trigger(
    function: &'static str,
    relation: pg_sys::Oid,
    key: &str,
) -> Result<(), ErrorReport> {
    if !citus_installed() {
        return Ok(());
    }
    if !is_a_shard(function, relation)? {
        return Ok(());
    }
    ensure_bucket_on_this_node(
        function,
        key,
        "bucket",
        "the node of this row's shard",
        "A trigger on a distributed table runs on the node of the row's shard, where Citus cannot \
         reach another node's shard of rate_limit.bucket_state.",
        "Distribute the table colocated with the state table by the key column \
         (create_distributed_table(table, column, colocate_with => 'rate_limit.bucket_state'), \
         the column COLLATE \"C\"), so that each row's bucket lives on its shard's node.",
    )
}

/// The shards of `rate_limit.bucket_state` this node holds, as qualified relation names, with direct
/// changes to them allowed for the rest of the transaction (`citus.enable_manual_changes_to_shards`);
/// `None` when the table is not distributed (or Citus is absent): then the table itself is the state.
pub fn local_shards(function: &'static str) -> Result<Option<Vec<String>>, ErrorReport> {
    if !citus_installed() {
        return Ok(None);
    }
    const Q: &str = "SELECT pg_catalog.shard_name(s.logicalrelid, s.shardid) \
         FROM pg_catalog.pg_dist_shard s \
         JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) s.shardid \
         JOIN pg_catalog.pg_dist_local_group l ON l.groupid OPERATOR(pg_catalog.=) p.groupid \
         WHERE s.logicalrelid OPERATOR(pg_catalog.=) 'rate_limit.bucket_state'::pg_catalog.regclass \
         ORDER BY s.shardid";
    Spi::connect_mut(|client| {
        if !is_distributed(function, client, "rate_limit.bucket_state")? {
            return Ok(None);
        }
        let mut shards = Vec::new();
        for row in spi(function, client.select(Q, None, &[]))? {
            if let Some(name) = spi(function, row.get::<String>(1))? {
                shards.push(name);
            }
        }
        execute(
            function,
            client,
            "SELECT pg_catalog.set_config('citus.enable_manual_changes_to_shards', 'on', true)",
            &[],
        )?;
        Ok(Some(shards))
    })
}

/// What `command` (a query returning one text value) returns on every node of the cluster, coordinator
/// included, when this is the coordinator of a database whose state table is distributed; `None`
/// otherwise (no Citus, not distributed, or a worker), when this node's own answer is the answer.
/// A node that cannot answer is 08006: a cluster-wide figure without it would be silently short.
pub fn on_every_node(
    function: &'static str,
    command: &str,
) -> Result<Option<Vec<String>>, ErrorReport> {
    if !citus_installed() {
        return Ok(None);
    }
    const COORDINATOR: &str = "SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_local_group \
                               WHERE groupid OPERATOR(pg_catalog.=) 0";
    const RUN: &str =
        "SELECT nodeid, success, result FROM pg_catalog.run_command_on_all_nodes($1) \
                       ORDER BY nodeid";
    Spi::connect_mut(|client| {
        if count(function, client, COORDINATOR, &[])? == 0
            || !is_distributed(function, client, "rate_limit.bucket_state")?
        {
            return Ok(None);
        }
        let args: [DatumWithOid<'_>; 1] = [command.into()];
        let mut results = Vec::new();
        for row in spi(function, client.select(RUN, None, &args))? {
            let node: Option<i32> = spi(function, row.get(1))?;
            let success: Option<bool> = spi(function, row.get(2))?;
            let result: Option<String> = spi(function, row.get(3))?;
            if success != Some(true) {
                return Err(ErrorReport::new(
                    PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
                    format!(
                        "{function} needs every Citus node, and node {} did not answer: {}",
                        node.unwrap_or_default(),
                        result.unwrap_or_default()
                    ),
                    function,
                )
                .set_hint(
                    "Bring the node back, or read each node's own figures there (rate_limit.node_stats_rows(), \
                     rate_limit.node_top_limited_rows(), rate_limit.node_memory_buckets()).",
                ));
            }
            results.push(result.unwrap_or_default());
        }
        Ok(Some(results))
    })
}

/// The cluster functions, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// Distributes rate_limit over a Citus cluster (run on the coordinator, by the owner): the policies
    /// become a reference table, the state table is distributed by key (`shard_count` shards, default
    /// `citus.shard_count`), and every keyed call is delegated to the node of its key. Idempotent: returns
    /// each step with what it did or found done. Without Citus: 0A000.
    #[pg_extern(volatile, parallel_unsafe)]
    fn distribute(
        shard_count: default!(Option<i32>, "NULL"),
    ) -> Result<TableIterator<'static, (name!(object, String), name!(action, String))>, ErrorReport>
    {
        let done = super::distribute("rate_limit.distribute", shard_count)?;
        Ok(TableIterator::new(done))
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// Without Citus in the database, `distribute` refuses with 0A000 and a hint, and the memory store's
    /// guard lets every call through.
    #[pg_test]
    fn distribute_without_citus_is_0a000_with_a_hint() {
        Spi::run(
            "CREATE OR REPLACE FUNCTION pg_temp.failure(q text) RETURNS text LANGUAGE plpgsql AS $$
             DECLARE s text; h text;
             BEGIN EXECUTE q; RETURN NULL;
             EXCEPTION WHEN OTHERS THEN
                 GET STACKED DIAGNOSTICS s = RETURNED_SQLSTATE, h = PG_EXCEPTION_HINT;
                 RETURN s || ' ' || (h LIKE '%CREATE EXTENSION citus%')::text; END $$",
        )
        .expect("helper");
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT pg_temp.failure('SELECT * FROM rate_limit.distribute()')"
            )
            .expect("query")
            .as_deref(),
            Some("0A000 true")
        );
        assert!(super::ensure_memory_bucket_here("test", "any key").is_ok());
    }
}
