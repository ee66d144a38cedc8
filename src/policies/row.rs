//! One row of `rate_limit.policies`, typed: its column list, its one reader and its one writer. The policy
//! cache, `create_policy` and `alter_policy` all go through here, so a new column is added in one place
//! (with its entry in [`super::options`], which sets it from the functions' `options`, and its `ALTER
//! TABLE` in a fragment of the next upgrade script). Every statement names its table and operators with
//! their schema.

use pgrx::datum::{DatumWithOid, Interval, Timestamp, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::pg_sys::{self};
use pgrx::spi::{Spi, SpiResult, SpiTupleTable};
use pgrx::PgSqlErrorCode;

use super::{parse_store, unknown};
use crate::error;
use crate::gucs::Store;
use rate_limit_model::algorithm::Algorithm;
use rate_limit_model::meters::Meters;

/// The columns of `rate_limit.policies`, in the order of [`Row`]'s fields and of its writer's parameters,
/// but `meters`, written and read after them: a `jsonb`, read as its text and written from text (pgrx's `JsonB` panics on
/// a value nested past `serde_json`'s limit, [`crate::api::json_arg`]).
const COLUMNS: &str =
    "name, algorithm, rate, per, burst, store, created_at, changed_at, shadow, max_debt, \
                       time_zone, anchor, block_after, block_for, blocks_by_hand, description, \
                       adaptive_min, latency_target, parent";

/// A policy as stored: each column with its type. Read from the table it is as the table's constraints
/// allow; made by a caller it is checked by [`super::checked`] before it is written.
#[derive(Clone, Debug)]
pub struct Row {
    /// Its name (the primary key).
    pub name: String,
    /// Its algorithm.
    pub algorithm: Algorithm,
    /// Tokens per period (leases at once, for a concurrency policy).
    pub rate: i64,
    /// The period.
    pub per: Interval,
    /// The most tokens at once.
    pub burst: i64,
    /// Where its buckets live; `None` follows `rate_limit.store`.
    pub store: Option<Store>,
    /// When it was created (on the table store's clock).
    pub created_at: TimestampWithTimeZone,
    /// When its numbers last changed.
    pub changed_at: TimestampWithTimeZone,
    /// Shadow mode.
    pub shadow: bool,
    /// How far below zero a charge may drive a bucket, in tokens.
    pub max_debt: i64,
    /// A calendar window's zone (canonical name).
    pub time_zone: Option<String>,
    /// A calendar window's anchor on that zone's clocks; `None`: its step's default.
    pub anchor: Option<Timestamp>,
    /// The penalty box: denials within one window that block a key.
    pub block_after: Option<i64>,
    /// The penalty box: how long a key is then blocked.
    pub block_for: Option<Interval>,
    /// Whether a key may hold a block its penalty box did not make ([`rate_limit_model::target::Blocking`]): set by
    /// the first block by hand ([`mark_blocked_by_hand`]) and by removing a penalty box, never cleared.
    pub blocks_by_hand: bool,
    /// Free text for the people who run it (option `description`, see [`super::options`]).
    pub description: Option<String>,
    /// An adaptive concurrency policy's fewest leases (option `adaptive_min`); `None`: 1.
    pub adaptive_min: Option<i64>,
    /// An adaptive concurrency policy's latency target (option `latency_target`); `None`: the policy's
    /// leases are fixed.
    pub latency_target: Option<Interval>,
    /// Its weighted meters (option `meters`): what a unit of each named quantity costs in tokens.
    pub meters: Option<Meters>,
    /// The policy whose bucket of a key a call on this one also takes from (option `parent`,
    /// [`super::family`]).
    pub parent: Option<String>,
}

/// Whether a read locks the row against concurrent changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lock {
    /// A plain read (the cache's).
    None,
    /// `FOR UPDATE`: the row is changed in this transaction (`alter_policy`).
    ForUpdate,
}

impl Row {
    /// The row of policy `name` and the table's oid, or `None` if there is none.
    pub fn read(
        function: &'static str,
        name: &str,
        lock: Lock,
    ) -> Result<Option<(Row, pg_sys::Oid)>, ErrorReport> {
        let query = format!(
            "SELECT {COLUMNS}, meters::pg_catalog.text, tableoid FROM rate_limit.policies \
             WHERE name OPERATOR(pg_catalog.=) $1{}",
            if lock == Lock::ForUpdate {
                " FOR UPDATE"
            } else {
                ""
            }
        );
        let args: [DatumWithOid<'_>; 1] = [name.into()];
        let first = |table: SpiTupleTable<'_>| {
            if table.is_empty() {
                return Ok(None);
            }
            let row = table.first();
            Ok::<_, pgrx::spi::SpiError>(Some((columns(&row)?, row.get::<pg_sys::Oid>(21)?)))
        };
        // a plain read runs read-only, on the active snapshot (the cache pushes the latest one); a locking
        // read is a write to SPI
        let read = match lock {
            Lock::None => Spi::connect(|client| first(client.select(&query, Some(1), &args)?)),
            Lock::ForUpdate => {
                Spi::connect_mut(|client| first(client.update(&query, Some(1), &args)?))
            }
        }
        .map_err(|e| error::internal(function, e))?;
        let Some((columns, table)) = read else {
            return Ok(None);
        };
        Ok(Some((
            Row::from_columns(function, columns)?,
            table.unwrap_or(pg_sys::InvalidOid),
        )))
    }

    /// Inserts this row; false if a policy of its name exists (nothing is written then).
    pub fn insert(&self, function: &'static str) -> Result<bool, ErrorReport> {
        let query = format!(
            "INSERT INTO rate_limit.policies ({COLUMNS}, meters) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
                     $19, $20::pg_catalog.jsonb) \
             ON CONFLICT (name) DO NOTHING RETURNING 1"
        );
        Ok(self.write(function, &query)? > 0)
    }

    /// Writes every column but `name` and `created_at` over the row of its name (42704 if there is none).
    pub fn update(&self, function: &'static str) -> Result<(), ErrorReport> {
        let query =
            "UPDATE rate_limit.policies SET algorithm = $2, rate = $3, per = $4, burst = $5, \
                     store = $6, changed_at = $8, shadow = $9, max_debt = $10, time_zone = $11, \
                     anchor = $12, block_after = $13, block_for = $14, blocks_by_hand = $15, \
                     description = $16, adaptive_min = $17, latency_target = $18, \
                     parent = $19, meters = $20::pg_catalog.jsonb \
                     WHERE name OPERATOR(pg_catalog.=) $1 RETURNING 1";
        match self.write(function, query)? {
            0 => Err(unknown(function, &self.name)),
            _ => Ok(()),
        }
    }

    /// Runs `query` with the row's columns as `$1` … `$19`, in [`COLUMNS`]' order, and its meters as `$20`
    /// (their JSON text); the rows it returned.
    fn write(&self, function: &'static str, query: &str) -> Result<usize, ErrorReport> {
        let store = self.store.map(|s| s.name());
        let meters = self.meters.as_ref().map(|m| m.to_json().to_string());
        let args: [DatumWithOid<'_>; 20] = [
            self.name.as_str().into(),
            self.algorithm.name().into(),
            self.rate.into(),
            self.per.into(),
            self.burst.into(),
            store.into(),
            self.created_at.into(),
            self.changed_at.into(),
            self.shadow.into(),
            self.max_debt.into(),
            self.time_zone.as_deref().into(),
            self.anchor.into(),
            self.block_after.into(),
            self.block_for.into(),
            self.blocks_by_hand.into(),
            self.description.as_deref().into(),
            self.adaptive_min.into(),
            self.latency_target.into(),
            self.parent.as_deref().into(),
            meters.as_deref().into(),
        ];
        Spi::connect_mut(|client| client.update(query, None, &args).map(|t| t.len()))
            .map_err(|e| error::internal(function, e))
    }

    /// A row from its columns as read; XX001 for a NULL where the table allows none, or a value no
    /// constraint lets in.
    fn from_columns(function: &'static str, c: Columns) -> Result<Row, ErrorReport> {
        let corrupt = |what: &str| error::corrupt_row(function, what);
        let required = |what: &'static str| move || corrupt(what);
        let algorithm = c
            .algorithm
            .as_deref()
            .and_then(Algorithm::parse)
            .ok_or_else(|| corrupt("policy algorithm is unknown"))?;
        let store = match c.store.as_deref() {
            None => None,
            Some(s) => Some(parse_store(function, s)?),
        };
        let meters = match c.meters.as_deref() {
            None => None,
            Some(text) => Some(
                serde_json::from_str(text)
                    .ok()
                    .and_then(|v| Meters::from_json(&v).ok())
                    .ok_or_else(|| corrupt("policy meters are not meters"))?,
            ),
        };
        Ok(Row {
            name: c.name.ok_or_else(required("policy name is NULL"))?,
            algorithm,
            rate: c.rate.ok_or_else(required("policy rate is NULL"))?,
            per: c.per.ok_or_else(required("policy per is NULL"))?,
            burst: c.burst.ok_or_else(required("policy burst is NULL"))?,
            store,
            created_at: c
                .created_at
                .ok_or_else(required("policy created_at is NULL"))?,
            changed_at: c
                .changed_at
                .ok_or_else(required("policy changed_at is NULL"))?,
            shadow: c.shadow.ok_or_else(required("policy shadow is NULL"))?,
            max_debt: c.max_debt.ok_or_else(required("policy max_debt is NULL"))?,
            time_zone: c.time_zone,
            anchor: c.anchor,
            block_after: c.block_after,
            block_for: c.block_for,
            blocks_by_hand: c
                .blocks_by_hand
                .ok_or_else(required("policy blocks_by_hand is NULL"))?,
            description: c.description,
            adaptive_min: c.adaptive_min,
            latency_target: c.latency_target,
            meters,
            parent: c.parent,
        })
    }
}

/// The columns as SPI returns them, each possibly NULL.
struct Columns {
    name: Option<String>,
    algorithm: Option<String>,
    rate: Option<i64>,
    per: Option<Interval>,
    burst: Option<i64>,
    store: Option<String>,
    created_at: Option<TimestampWithTimeZone>,
    changed_at: Option<TimestampWithTimeZone>,
    shadow: Option<bool>,
    max_debt: Option<i64>,
    time_zone: Option<String>,
    anchor: Option<Timestamp>,
    block_after: Option<i64>,
    block_for: Option<Interval>,
    blocks_by_hand: Option<bool>,
    description: Option<String>,
    adaptive_min: Option<i64>,
    latency_target: Option<Interval>,
    parent: Option<String>,
    meters: Option<String>,
}

/// The first 20 columns of the row `row` is on: [`COLUMNS`], then `meters`.
fn columns(row: &SpiTupleTable<'_>) -> SpiResult<Columns> {
    Ok(Columns {
        name: row.get(1)?,
        algorithm: row.get(2)?,
        rate: row.get(3)?,
        per: row.get(4)?,
        burst: row.get(5)?,
        store: row.get(6)?,
        created_at: row.get(7)?,
        changed_at: row.get(8)?,
        shadow: row.get(9)?,
        max_debt: row.get(10)?,
        time_zone: row.get(11)?,
        anchor: row.get(12)?,
        block_after: row.get(13)?,
        block_for: row.get(14)?,
        blocks_by_hand: row.get(15)?,
        description: row.get(16)?,
        adaptive_min: row.get(17)?,
        latency_target: row.get(18)?,
        parent: row.get(19)?,
        meters: row.get(20)?,
    })
}

/// Notes in the row of policy `name` that a key of it was blocked by hand, in the caller's transaction
/// (nothing if it says so already): from then on every call on the policy reads its key's block.
pub fn mark_blocked_by_hand(function: &'static str, name: &str) -> Result<(), ErrorReport> {
    let args: [DatumWithOid<'_>; 1] = [name.into()];
    Spi::connect_mut(|client| {
        client
            .update(
                "UPDATE rate_limit.policies SET blocks_by_hand = true \
             WHERE name OPERATOR(pg_catalog.=) $1 AND NOT blocks_by_hand",
                None,
                &args,
            )
            .map(|_| ())
    })
    .map_err(|e| error::internal(function, e))
}

/// 42710 for a second policy of one name, from `create_policy`.
pub fn duplicate(function: &'static str, name: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
        format!("rate limit policy {} already exists", error::quoted(name)),
        function,
    )
    .set_hint("Change it with rate_limit.alter_policy(name, ...).")
}
