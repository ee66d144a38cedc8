//! The table store's saved plans: one set per relation that holds buckets, the state table or (under
//! Citus) a shard of it on this node, prepared on first use and kept for the life of the backend.

use std::cell::{Cell, RefCell};

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiError};

use super::{spi, COLUMNS, DELETE, INSERT, SET_STATE, TAKE, WHERE_BUCKET};
use crate::cluster::shards;
use rate_limit_model::target::Target;

/// The saved plans of this backend for one relation: the state table, or under Citus one of its shards on
/// this node (see [`plans_for`]).
pub(super) struct Plans {
    /// Read one row in the caller's snapshot (peek).
    pub(super) read: OwnedPreparedStatement,
    /// Read one row in a fresh snapshot.
    pub(super) read_fresh: OwnedPreparedStatement,
    /// Read and lock one row (refund).
    pub(super) lock: OwnedPreparedStatement,
    pub(super) take: OwnedPreparedStatement,
    pub(super) insert: OwnedPreparedStatement,
    /// Write a row's state unconditionally (the row is locked by this call).
    pub(super) write: OwnedPreparedStatement,
    /// Write a rebased state if the row still holds what was read.
    pub(super) rebase: OwnedPreparedStatement,
    pub(super) delete: OwnedPreparedStatement,
    /// Read and lock one row if its slot is free at `$3` (released, or its lease expired), unless another
    /// transaction holds the row (see [`leases`]).
    pub(super) lock_skip: OwnedPreparedStatement,
}

thread_local! {
    /// The plans on `rate_limit.bucket_state`, prepared on first use and kept for the life of the backend
    /// (PostgreSQL's plan cache revalidates them if the table is altered or recreated).
    static PLANS: Cell<Option<&'static Plans>> = const { Cell::new(None) };
    /// Under Citus, the plans on each shard of this node a call has addressed, by shard id: at most the
    /// shards this node has held in the life of the backend.
    static SHARD_PLANS: RefCell<Vec<(i64, &'static Plans)>> = const { RefCell::new(Vec::new()) };
}

/// The state table's name in the statements, replaced by a shard's name to address the shard.
const TABLE: &str = "rate_limit.bucket_state";

fn prepare_plans(client: &SpiClient<'_>, relation: &str) -> Result<Plans, SpiError> {
    let text = PgOid::from(pg_sys::TEXTOID);
    let int8 = PgOid::from(pg_sys::INT8OID);
    let tstz = PgOid::from(pg_sys::TIMESTAMPTZOID);
    let key = [text, text];
    let row = [text, text, int8, tstz, text, int8, int8, int8];
    let on = |statement: &str| statement.replace(TABLE, relation);
    let read = on(&format!("SELECT {COLUMNS} FROM {TABLE} {WHERE_BUCKET}"));
    let set_state = format!("{} {WHERE_BUCKET}", on(SET_STATE));
    let rebase = format!(
        "{set_state} AND level OPERATOR(pg_catalog.=) $9 AND updated_at OPERATOR(pg_catalog.=) $10"
    );
    let mut rebase_types = row.to_vec();
    rebase_types.extend([int8, tstz]);
    let lock_skip = format!(
        "{read} AND rate_limit.state_is_full(level, updated_at, algorithm, rate, per_us, burst, $3) \
         FOR UPDATE SKIP LOCKED"
    );
    Ok(Plans {
        read: client.prepare(&read, &key)?.keep(),
        read_fresh: client.prepare_mut(&read, &key)?.keep(),
        lock: client
            .prepare_mut(&format!("{read} FOR UPDATE"), &key)?
            .keep(),
        take: client
            .prepare_mut(
                &on(TAKE),
                &[text, text, text, int8, int8, int8, tstz, tstz, int8, tstz],
            )?
            .keep(),
        insert: client.prepare_mut(&on(INSERT), &row)?.keep(),
        write: client.prepare_mut(&set_state, &row)?.keep(),
        rebase: client.prepare_mut(&rebase, &rebase_types)?.keep(),
        delete: client
            .prepare_mut(&format!("{} {WHERE_BUCKET}", on(DELETE)), &key)?
            .keep(),
        lock_skip: client.prepare_mut(&lock_skip, &[text, text, tstz])?.keep(),
    })
}

/// The one key every target names, if they name one.
pub(super) fn one_key<'a>(targets: &[Target<'a>]) -> Option<&'a str> {
    let (first, rest) = targets.split_first()?;
    rest.iter().all(|t| t.key == first.key).then_some(first.key)
}

/// The plans for the rows of `key` (`None`: of several keys): under Citus, when this node holds the key's
/// shard, the plans on that shard, with the shard's metadata lock taken ([`shards::local_shard`]);
/// otherwise the plans on `rate_limit.bucket_state` (without Citus, the table itself; with it, Citus
/// routes each statement to the key's shard wherever it is).
pub(super) fn plans_for(
    function: &'static str,
    client: &SpiClient<'_>,
    key: Option<&str>,
) -> Result<&'static Plans, ErrorReport> {
    let shard = match key {
        Some(key) => shards::local_shard(function, key)?,
        None => None,
    };
    let Some(shard) = shard else {
        return table_plans(function, client);
    };
    let known = SHARD_PLANS.with(|p| {
        p.borrow()
            .iter()
            .find(|(id, _)| *id == shard.id)
            .map(|(_, plans)| *plans)
    });
    if let Some(plans) = known {
        return Ok(plans);
    }
    // Leaked on purpose: one small struct per shard this node held, alive as long as the backend.
    let plans: &'static Plans = Box::leak(Box::new(spi(
        function,
        prepare_plans(client, &shard.relation),
    )?));
    SHARD_PLANS.with(|p| p.borrow_mut().push((shard.id, plans)));
    Ok(plans)
}

/// The plans on `rate_limit.bucket_state`.
fn table_plans(
    function: &'static str,
    client: &SpiClient<'_>,
) -> Result<&'static Plans, ErrorReport> {
    if let Some(plans) = PLANS.with(Cell::get) {
        return Ok(plans);
    }
    // Leaked on purpose: one small struct per backend, alive as long as the backend.
    let plans: &'static Plans = Box::leak(Box::new(spi(function, prepare_plans(client, TABLE))?));
    PLANS.with(|cell| cell.set(Some(plans)));
    Ok(plans)
}
