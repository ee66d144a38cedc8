//! Citus's catalog tables read directly, with the catalog snapshot: the newest committed state, whatever the
//! isolation level of the transaction (a query over them would read the transaction's snapshot, which in
//! REPEATABLE READ may predate a shard move), and remembered until an invalidation arrives. Citus sends an
//! invalidation of the distributed table with every change of its shards, its placements or its
//! colocation (that is how its own metadata cache stays coherent), and a committed change's invalidations
//! are sent before its locks are released: after taking a lock and processing invalidations, what is
//! remembered is what the catalogs say.

use std::cell::RefCell;

use pgrx::pg_sys;

/// The layout of the state table's shards, as last read.
struct Layout {
    colocation: i32,
    /// The shards, ordered by hash range as Citus orders them.
    shards: Vec<ShardRange>,
}

/// One shard of the state table.
struct ShardRange {
    id: i64,
    /// Its range of hashes, both ends included.
    min: i32,
    max: i32,
    /// Whether its placement is on this node.
    here: bool,
}

thread_local! {
    /// The layout as read when `SharedInvalidMessageCounter` had the value kept with it (`None`: the table
    /// is not hash-distributed); it holds while the counter has not moved.
    static LAYOUT: RefCell<Option<(u64, Option<Layout>)>> = const { RefCell::new(None) };
}

/// Under Citus, the shard of `rate_limit.bucket_state` that holds `key`: its id and the name of its
/// metadata lock (Citus's `SetLocktagForShardDistributionMetadata` for a hash-distributed table: the
/// table's colocation group, and the shard's index among its shards ordered by hash range). `None` while
/// the table is not hash-distributed. The key is hashed as Citus hashes it (`hashtext` under the key
/// column's collation, "C"), and found among the shards' ranges. Call it after processing invalidations
/// (at the start of a statement, or after a lock).
pub fn shard_of_key(key: &str) -> Option<(i64, (i32, i32))> {
    let hash = hash_like_citus(key)?;
    with_layout(|layout| {
        let index = layout
            .shards
            .iter()
            .position(|s| s.min <= hash && hash <= s.max)?;
        let id = layout.shards[index].id;
        Some((id, (layout.colocation, i32::try_from(index).ok()?)))
    })
    .flatten()
}

/// Whether the shard `id` of the state table has its placement on this node's group, as the catalogs say
/// (see [`shard_of_key`] for when they are read).
pub fn is_placed_here(id: i64) -> bool {
    with_layout(|l| l.shards.iter().any(|s| s.id == id && s.here)).unwrap_or(false)
}

/// `f` of the state table's layout, read again if the catalogs may have changed since it was read;
/// `None` while the table is not hash-distributed.
/// Whether the state table is hash-distributed (see [`shard_of_key`] for when the catalogs are read).
pub fn is_distributed() -> bool {
    with_layout(|_| ()).is_some()
}

fn with_layout<R>(f: impl FnOnce(&Layout) -> R) -> Option<R> {
    // SAFETY: a plain global of this backend, read on its only thread.
    let seen = unsafe { pg_sys::SharedInvalidMessageCounter };
    LAYOUT.with(|cell| {
        let mut cell = cell.borrow_mut();
        if !matches!(&*cell, Some((at, _)) if *at == seen) {
            *cell = Some((seen, read_layout()));
        }
        cell.as_ref()?.1.as_ref().map(f)
    })
}

/// `hashtext(key)` under the collation "C", as Citus hashes a text distribution column declared
/// `COLLATE "C"` (the state table's key).
fn hash_like_citus(key: &str) -> Option<i32> {
    let len = i32::try_from(key.len()).ok()?;
    // SAFETY: cstring_to_text_with_len copies `len` bytes of the key into a palloc'd text (it reads no
    // terminator); hashtext reads that text under the C collation (given, as its fmgr interface needs);
    // the text is freed after.
    unsafe {
        let text = pg_sys::cstring_to_text_with_len(key.as_ptr().cast(), len);
        let hash = pg_sys::OidFunctionCall1Coll(
            pg_sys::Oid::from(pg_sys::F_HASHTEXT),
            pg_sys::C_COLLATION_OID,
            pg_sys::Datum::from(text),
        );
        pg_sys::pfree(text.cast());
        Some(hash.value() as u32 as i32)
    }
}

/// The state table's layout, `None` when it is not hash-distributed (or unreadable).
fn read_layout() -> Option<Layout> {
    // SAFETY: syscache lookups by valid C strings, inside the caller's transaction.
    let table = unsafe {
        let schema = pg_sys::get_namespace_oid(c"rate_limit".as_ptr(), true);
        if schema == pg_sys::InvalidOid {
            return None;
        }
        pg_sys::get_relname_relid(c"bucket_state".as_ptr(), schema)
    };
    if table == pg_sys::InvalidOid {
        return None;
    }
    let key = i64::from(table.to_u32());
    let (mut colocation, mut hashed) = (None, false);
    let partition = (
        c"pg_dist_partition",
        c"pg_dist_partition_logical_relid_index",
    );
    scan_by_oid(partition, c"logicalrelid", key, |row| {
        colocation = row.int4(c"colocationid");
        hashed = row.char(c"partmethod") == Some(b'h');
    });
    if !hashed {
        return None;
    }
    let placed_here = shards_placed_here();
    let mut shards = Vec::new();
    let mut unreadable = false;
    let shard = (c"pg_dist_shard", c"pg_dist_shard_logical_relid_index");
    scan_by_oid(shard, c"logicalrelid", key, |row| {
        let bound = |column| row.text(column).and_then(|v| v.parse::<i32>().ok());
        let (id, min, max) = (
            row.int8(c"shardid"),
            bound(c"shardminvalue"),
            bound(c"shardmaxvalue"),
        );
        match (id, min, max) {
            (Some(id), Some(min), Some(max)) => shards.push(ShardRange {
                id,
                min,
                max,
                here: placed_here.contains(&id),
            }),
            _ => unreadable = true,
        }
    });
    if unreadable {
        return None;
    }
    shards.sort_by_key(|s| s.min);
    Some(Layout {
        colocation: colocation?,
        shards,
    })
}

/// The shards whose placement is in this node's group (`pg_dist_local_group`), among all tables'.
fn shards_placed_here() -> Vec<i64> {
    let mut group = None;
    scan_all(c"pg_dist_local_group", |row| group = row.int4(c"groupid"));
    let Some(group) = group else {
        return Vec::new();
    };
    let mut here = Vec::new();
    scan_all(c"pg_dist_placement", |row| {
        if row.int4(c"groupid") == Some(group) {
            here.extend(row.int8(c"shardid"));
        }
    });
    here
}

/// One row of a scan, read by column name.
struct Row {
    relation: pg_sys::Relation,
    tuple: pg_sys::HeapTuple,
}

impl Row {
    fn datum(&self, column: &std::ffi::CStr) -> Option<pg_sys::Datum> {
        // SAFETY: the relation is open and the tuple is the scan's current one (see `scan`); get_attnum
        // looks the column up in the system cache (InvalidAttrNumber if it has none, then nothing is read).
        unsafe {
            let attnum = pg_sys::get_attnum((*self.relation).rd_id, column.as_ptr());
            if attnum <= 0 {
                return None;
            }
            let mut null = false;
            let datum = pg_sys::heap_getattr(
                self.tuple,
                i32::from(attnum),
                (*self.relation).rd_att,
                &mut null,
            );
            (!null).then_some(datum)
        }
    }

    fn int4(&self, column: &std::ffi::CStr) -> Option<i32> {
        self.datum(column).map(|d| d.value() as i32)
    }

    fn char(&self, column: &std::ffi::CStr) -> Option<u8> {
        self.datum(column).map(|d| d.value() as u8)
    }

    fn int8(&self, column: &std::ffi::CStr) -> Option<i64> {
        self.datum(column).map(|d| d.value() as i64)
    }

    fn text(&self, column: &std::ffi::CStr) -> Option<String> {
        let datum = self.datum(column)?;
        // SAFETY: the column is of type text (the callers name text columns); text_to_cstring detoasts it
        // into a palloc'd C string, copied here.
        unsafe {
            let c = pg_sys::text_to_cstring(datum.cast_mut_ptr());
            let s = std::ffi::CStr::from_ptr(c).to_string_lossy().into_owned();
            pg_sys::pfree(c.cast());
            Some(s)
        }
    }
}

/// Calls `each` for every row of `table` whose `column` (an oid) equals `value`, through `index`
/// (`(table, index)`).
fn scan_by_oid(
    (table, index): (&std::ffi::CStr, &std::ffi::CStr),
    column: &std::ffi::CStr,
    value: i64,
    each: impl FnMut(&Row),
) {
    scan(
        table,
        Some((index, column, pg_sys::F_OIDEQ, pg_sys::Datum::from(value))),
        each,
    );
}

/// Calls `each` for every row of `table`.
fn scan_all(table: &std::ffi::CStr, each: impl FnMut(&Row)) {
    scan(table, None, each);
}

/// A scan of `table` (in pg_catalog), all of it or through an index on one column, with the catalog
/// snapshot. Nothing is read when the table or the index does not exist.
fn scan(
    table: &std::ffi::CStr,
    by: Option<(&std::ffi::CStr, &std::ffi::CStr, u32, pg_sys::Datum)>,
    mut each: impl FnMut(&Row),
) {
    // SAFETY: relations are looked up by name in pg_catalog (InvalidOid when missing: nothing is opened);
    // the table is opened with AccessShareLock and closed in this block, and the scan begun on it ended
    // in it; the scan key compares the table's column with the given equality function (systable_beginscan
    // turns the column's number into the index's); each tuple is read (by `each`, through `Row`) while the
    // scan is open, with the table's own descriptor.
    unsafe {
        let table_oid = relation_in_catalog(table);
        if table_oid == pg_sys::InvalidOid {
            return;
        }
        let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
        let (index_oid, nkeys) = match by {
            Some((index, column, function, value)) => {
                let index_oid = relation_in_catalog(index);
                let attnum = pg_sys::get_attnum(table_oid, column.as_ptr());
                if index_oid == pg_sys::InvalidOid || attnum <= 0 {
                    return;
                }
                pg_sys::ScanKeyInit(
                    &mut key,
                    attnum,
                    pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
                    pg_sys::Oid::from(function),
                    value,
                );
                (index_oid, 1)
            }
            None => (pg_sys::InvalidOid, 0),
        };
        let relation = pg_sys::table_open(table_oid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let scan = pg_sys::systable_beginscan(
            relation,
            index_oid,
            index_oid != pg_sys::InvalidOid,
            std::ptr::null_mut(),
            nkeys,
            &mut key,
        );
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            each(&Row { relation, tuple });
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(relation, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    }
}

/// The OID of the relation `name` in pg_catalog, InvalidOid if there is none.
///
/// # Safety
/// Reads the system cache: call it inside a transaction.
unsafe fn relation_in_catalog(name: &std::ffi::CStr) -> pg_sys::Oid {
    // SAFETY: a syscache lookup by a valid C string, inside the caller's transaction.
    unsafe {
        pg_sys::get_relname_relid(
            name.as_ptr(),
            pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE),
        )
    }
}
