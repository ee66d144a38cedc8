//! Reading `rate_limit.key_overrides`: one key's row (with the call's snapshot: an override committed
//! before the call's statement began, or in REPEATABLE READ and SERIALIZABLE before its transaction began,
//! is seen), many keys' rows and whether a policy has any (with the latest snapshot, as the policy cache
//! reads: what a backend keeps is never older than what a call could see).
//!
//! One key's row is what every call of a key of a policy with overrides reads, so it is read the way
//! PostgreSQL reads its catalogs (`systable_beginscan`): one probe of the table's primary-key index, with
//! no statement, plan or executor, a few microseconds ([`probe`]). The table is then read directly, as
//! PostgreSQL's own referential-integrity checks read the tables they check, whatever the caller's
//! rights: what a call decides does not depend on who calls it. Under Citus the rows live in a shard of
//! the reference table, which only a statement reaches: there, and for batches and the one-off question
//! whether a policy has any override, the reads are statements, run as the table's owner.
//!
//! Every statement and scan names the table, its index and its operators by the extension's schema:
//! no caller's `search_path` can redirect them.

use std::cell::Cell;

use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiClient, SpiError, SpiHeapTupleData};
use pgrx::{FromDatum, IntoDatum};

use super::Stored;
use crate::cluster::installed::citus_installed;
use crate::error;
use crate::kept_plans;
use crate::policies::with_latest_snapshot;

/// One key's override, by the primary key: `$1` policy, `$2` key, `$3` the policy's `created_at` (an
/// override set before its policy was created is a dropped namesake's, never read).
const OF_KEY: &str = "SELECT key, action, rate, per, burst, expires_at, set_at \
     FROM rate_limit.key_overrides \
     WHERE policy OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
       AND set_at OPERATOR(pg_catalog.>=) $3";

/// Whether a policy has any override: `$1` policy, `$2` its `created_at`.
const ANY: &str = "SELECT true FROM rate_limit.key_overrides \
     WHERE policy OPERATOR(pg_catalog.=) $1 AND set_at OPERATOR(pg_catalog.>=) $2 LIMIT 1";

/// The overrides of many keys of one policy: `$1` policy, `$2` the keys, `$3` its `created_at`.
const OF_KEYS: &str = "SELECT key, action, rate, per, burst, expires_at, set_at \
     FROM rate_limit.key_overrides \
     WHERE policy OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) ANY ($2) \
       AND set_at OPERATOR(pg_catalog.>=) $3";

/// The table's columns, as [`probe`] reads them (1-based), in [`Stored`]'s order.
const COLUMNS: usize = 8;

thread_local! {
    /// The oids of `rate_limit.key_overrides` and of its lookup index (`InvalidOid`: not looked up since
    /// the last invalidation of the table), kept until [`forget_table_if`] forgets them.
    static TABLE: Cell<(pg_sys::Oid, pg_sys::Oid)> =
        const { Cell::new((pg_sys::InvalidOid, pg_sys::InvalidOid)) };
    /// [`OF_KEY`], prepared on first use under Citus and kept for the life of the backend (PostgreSQL's
    /// plan cache replans it when the table changes or is recreated).
    static OF_KEY_PLAN: Cell<Option<&'static OwnedPreparedStatement>> = const { Cell::new(None) };
}

/// Forgets the table's oids when `relid` may be it (every relation, or the table, or any while they are
/// unknown): true if it did, so that what depends on the table is forgotten too.
pub(super) fn forget_table_if(relid: pg_sys::Oid) -> bool {
    let (table, _) = TABLE.with(Cell::get);
    let forget = relid == pg_sys::InvalidOid || table == pg_sys::InvalidOid || relid == table;
    if forget {
        TABLE.with(|t| t.set((pg_sys::InvalidOid, pg_sys::InvalidOid)));
    }
    forget
}

/// The oid of `rate_limit.key_overrides`; `InvalidOid` if there is none.
pub(super) fn table_oid() -> pg_sys::Oid {
    oid_of(c"key_overrides")
}

/// The oid of relation `name` in schema `rate_limit`, or `InvalidOid`.
fn oid_of(name: &core::ffi::CStr) -> pg_sys::Oid {
    // SAFETY: catalog-cache lookups by name inside a transaction; both answer InvalidOid when nothing is
    // found (missing_ok), and the names are NUL-terminated.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"rate_limit".as_ptr(), true);
        if schema == pg_sys::InvalidOid {
            return pg_sys::InvalidOid;
        }
        pg_sys::get_relname_relid(name.as_ptr(), schema)
    }
}

/// The table's and its lookup index's oids, looked up once per invalidation of the table.
fn table_and_index(function: &'static str) -> Result<(pg_sys::Oid, pg_sys::Oid), ErrorReport> {
    let known = TABLE.with(Cell::get);
    if known.1 != pg_sys::InvalidOid {
        return Ok(known);
    }
    let found = (table_oid(), oid_of(c"key_overrides_lookup"));
    if found.0 == pg_sys::InvalidOid || found.1 == pg_sys::InvalidOid {
        return Err(error::bug(
            function,
            "rate_limit.key_overrides or its index key_overrides_lookup is missing",
        ));
    }
    TABLE.with(|t| t.set(found));
    Ok(found)
}

/// Whether policy `name` (created at `created_at`) has any override.
pub(super) fn any(
    function: &'static str,
    name: &str,
    created_at: i64,
) -> Result<bool, ErrorReport> {
    let created_at = timestamptz(function, created_at)?;
    let args: [DatumWithOid<'_>; 2] = [name.into(), created_at.into()];
    with_latest_snapshot(|| {
        as_table_owner(function, || {
            Spi::connect(|client| Ok(!client.select(ANY, Some(1), &args)?.is_empty()))
                .map_err(|e: SpiError| error::internal(function, e))
        })
    })
}

/// The override of `key` under policy `name` (created at `created_at`), as stored.
pub(super) fn of_key(
    function: &'static str,
    name: &str,
    created_at: i64,
    key: &str,
) -> Result<Option<Stored>, ErrorReport> {
    if citus_installed() {
        return of_key_by_statement(function, name, created_at, key);
    }
    let found = probe(function, name, key)?;
    Ok(found.filter(|s| s.set_at >= created_at))
}

/// The overrides of those of `keys` that have one, under policy `name`, as stored: one statement.
pub(super) fn of_keys(
    function: &'static str,
    name: &str,
    created_at: i64,
    keys: &[&str],
) -> Result<Vec<Stored>, ErrorReport> {
    let created_at = timestamptz(function, created_at)?;
    let keys: Vec<&str> = keys.to_vec();
    let args: [DatumWithOid<'_>; 3] = [name.into(), keys.into(), created_at.into()];
    // the call's snapshot, as one key's read
    as_table_owner(function, || {
        Spi::connect(|client| {
            client
                .select(OF_KEYS, None, &args)?
                .map(|row| stored(&row))
                .collect::<Result<Vec<Stored>, SpiError>>()
        })
        .map_err(|e: SpiError| error::internal(function, e))
    })
}

/// One key's row, read through the table's hash index of `policy || ' ' || key` with the call's snapshot,
/// as a catalog lookup reads (open the table and its index, scan with one equality key, close): no
/// statement. A hash index reads one bucket page, where the primary key's btree would descend four levels
/// of text comparisons (12 µs against about 4 µs a call, with 4 000 000 overrides).
fn probe(function: &'static str, name: &str, key: &str) -> Result<Option<Stored>, ErrorReport> {
    let (table_oid, index_oid) = table_and_index(function)?;
    // the index's one column: `policy || ' ' || key` (a policy name holds no space, so the pair is
    // unambiguous)
    let Some(lookup) = format!("{name} {key}").as_str().into_datum() else {
        return Err(error::bug(function, "a text argument made no datum"));
    };
    const ACCESS_SHARE: pg_sys::LOCKMODE = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    // SAFETY: inside a transaction. The table and its index are opened and locked as a read of them is
    // (AccessShareLock, released at transaction end as any reader's); the scan key compares the hash
    // index's one column, a text in collation "C" (which ScanKeyInit sets), with texteq, its equality; a
    // hash index's answers are rechecked (the row's own policy and key, below); the snapshot is registered
    // for the scan and unregistered after it; the slot and the scan are released before return. An error
    // on the way (a cancel) is cleaned up by the transaction's abort, which releases relations, buffers,
    // snapshots and locks.
    unsafe {
        let table = pg_sys::table_open(table_oid, ACCESS_SHARE);
        let index = pg_sys::index_open(index_oid, ACCESS_SHARE);
        // the call's own snapshot (its statement's in READ COMMITTED, its transaction's above): an override
        // committed before it is seen, and no snapshot is computed for the read
        let snapshot = pg_sys::RegisterSnapshot(if pg_sys::ActiveSnapshotSet() {
            pg_sys::GetActiveSnapshot()
        } else {
            pg_sys::GetLatestSnapshot()
        });
        let mut scan_key: pg_sys::ScanKeyData = std::mem::zeroed();
        pg_sys::ScanKeyInit(
            &mut scan_key,
            1,
            pg_sys::HTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::Oid::from(pg_sys::F_TEXTEQ),
            lookup,
        );
        let scan = begin_scan(table, index, snapshot);
        pg_sys::index_rescan(scan, &mut scan_key, 1, std::ptr::null_mut(), 0);
        let slot = pg_sys::table_slot_create(table, std::ptr::null_mut());
        let mut found = Ok(None);
        while pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
            match from_slot(function, slot, name) {
                Ok(Some(row)) if row.key != key => continue,
                Ok(None) => continue,
                other => {
                    found = other;
                    break;
                }
            }
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::index_endscan(scan);
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::index_close(index, ACCESS_SHARE);
        pg_sys::table_close(table, ACCESS_SHARE);
        found
    }
}

/// `index_beginscan` with two keys and no ordering, whose signature PostgreSQL 18 changed.
///
/// # Safety
/// As `index_beginscan`: open relations, a registered snapshot, inside a transaction.
unsafe fn begin_scan(
    table: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
) -> pg_sys::IndexScanDesc {
    #[cfg(feature = "pg18")]
    // SAFETY: as the caller guarantees; no instrumentation.
    return unsafe { pg_sys::index_beginscan(table, index, snapshot, std::ptr::null_mut(), 2, 0) };
    #[cfg(not(feature = "pg18"))]
    // SAFETY: as the caller guarantees.
    return unsafe { pg_sys::index_beginscan(table, index, snapshot, 2, 0) };
}

/// The row in `slot` (a tuple of `rate_limit.key_overrides`), as stored, if it is an override of policy
/// `name` (a hash index's answer is checked against the row).
///
/// # Safety
/// `slot` holds a tuple of the table, fetched by a scan that is still open.
unsafe fn from_slot(
    function: &'static str,
    slot: *mut pg_sys::TupleTableSlot,
    name: &str,
) -> Result<Option<Stored>, ErrorReport> {
    // SAFETY: deforms the slot's first COLUMNS attributes (the table has exactly these, in this order, as
    // bootstrap.sql creates it) and reads each value with the FromDatum of its column's type.
    unsafe {
        if ((*slot).tts_nvalid as usize) < COLUMNS {
            pg_sys::slot_getsomeattrs_int(slot, COLUMNS as i32);
        }
        let value = |i: usize| {
            let null = *(*slot).tts_isnull.add(i);
            (*(*slot).tts_values.add(i), null)
        };
        let text = |i: usize| {
            let (d, null) = value(i);
            String::from_datum(d, null)
        };
        let int8 = |i: usize| {
            let (d, null) = value(i);
            i64::from_datum(d, null)
        };
        let tstz = |i: usize| {
            let (d, null) = value(i);
            TimestampWithTimeZone::from_datum(d, null).map(TimestampWithTimeZone::into_inner)
        };
        if text(0).as_deref() != Some(name) {
            return Ok(None);
        }
        let (per, per_null) = value(4);
        Ok(Some(Stored {
            key: text(1)
                .ok_or_else(|| error::corrupt_row(function, "an override's key is NULL"))?,
            action: text(2)
                .ok_or_else(|| error::corrupt_row(function, "an override's action is NULL"))?,
            rate: int8(3),
            per: Interval::from_datum(per, per_null),
            burst: int8(5),
            expires_at: tstz(6),
            set_at: tstz(7)
                .ok_or_else(|| error::corrupt_row(function, "an override's set_at is NULL"))?,
        }))
    }
}

/// [`of_key`] by a statement (under Citus, where the rows are in a shard of the reference table).
fn of_key_by_statement(
    function: &'static str,
    name: &str,
    created_at: i64,
    key: &str,
) -> Result<Option<Stored>, ErrorReport> {
    let created_at = timestamptz(function, created_at)?;
    let args: [DatumWithOid<'_>; 3] = [name.into(), key.into(), created_at.into()];
    // the call's snapshot, as the direct read
    as_table_owner(function, || {
        kept_plans::by_key(|| {
            Spi::connect(|client| {
                let plan = of_key_plan(client)?;
                let mut rows = client.select(plan, Some(1), &args)?;
                rows.next().map(|row| stored(&row)).transpose()
            })
        })
        .map_err(|e: SpiError| error::internal(function, e))
    })
}

/// [`OF_KEY`]'s kept plan.
fn of_key_plan(client: &SpiClient<'_>) -> Result<&'static OwnedPreparedStatement, SpiError> {
    if let Some(plan) = OF_KEY_PLAN.with(Cell::get) {
        return Ok(plan);
    }
    let text = pg_sys::PgOid::from(pg_sys::TEXTOID);
    let tstz = pg_sys::PgOid::from(pg_sys::TIMESTAMPTZOID);
    // Leaked on purpose: one small plan per backend, alive as long as the backend.
    let plan: &'static OwnedPreparedStatement = Box::leak(Box::new(
        client.prepare(OF_KEY, &[text, text, tstz])?.keep(),
    ));
    OF_KEY_PLAN.with(|p| p.set(Some(plan)));
    Ok(plan)
}

/// The row `row` is on, as stored (the columns of [`OF_KEY`], in [`Stored`]'s order).
fn stored(row: &SpiHeapTupleData<'_>) -> Result<Stored, SpiError> {
    Ok(Stored {
        key: row.get(1)?.unwrap_or_default(),
        action: row.get(2)?.unwrap_or_default(),
        rate: row.get(3)?,
        per: row.get(4)?,
        burst: row.get(5)?,
        expires_at: row
            .get::<TimestampWithTimeZone>(6)?
            .map(TimestampWithTimeZone::into_inner),
        // NOT NULL in the table
        set_at: row
            .get::<TimestampWithTimeZone>(7)?
            .map_or(i64::MIN, TimestampWithTimeZone::into_inner),
    })
}

/// Microseconds as a `timestamptz` argument.
fn timestamptz(function: &'static str, us: i64) -> Result<TimestampWithTimeZone, ErrorReport> {
    TimestampWithTimeZone::try_from(us)
        .map_err(|_| error::bug(function, "a policy's created_at is out of range"))
}

/// Runs `read` as the owner of `rate_limit.key_overrides` (the extension's owner), as PostgreSQL's
/// referential-integrity triggers run their queries as the table's owner: the calls that read overrides
/// run as the owner already (SECURITY DEFINER, or `allow`'s own switch: nothing to switch, the common
/// case); any other caller reads them as the owner too, never with its own rights, so what a call decides
/// does not depend on who calls it.
pub(super) fn as_table_owner<T>(
    function: &'static str,
    read: impl FnOnce() -> Result<T, ErrorReport>,
) -> Result<T, ErrorReport> {
    let owner = table_owner();
    if owner == pg_sys::InvalidOid {
        return Err(error::bug(
            function,
            "rate_limit.key_overrides has no owner",
        ));
    }
    crate::backend::as_user(owner, read)
}

/// The owner of `rate_limit.key_overrides` (`InvalidOid` if there is no such table), from the catalog
/// cache: no statement, so a hot standby reads it too.
fn table_owner() -> pg_sys::Oid {
    let relid = table_oid();
    if relid == pg_sys::InvalidOid {
        return pg_sys::InvalidOid;
    }
    // SAFETY: a catalog-cache lookup by oid inside a transaction; the tuple is released before return and
    // its relowner field read while it is held.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            pg_sys::Datum::from(relid),
        );
        if tuple.is_null() {
            return pg_sys::InvalidOid;
        }
        let owner = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_class>(tuple)).relowner;
        pg_sys::ReleaseSysCache(tuple);
        owner
    }
}
