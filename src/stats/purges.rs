//! The background worker's last purges, for monitoring: when the worker last finished purging the table
//! store of each database and the memory store of the server, and how much it freed.
//!
//! Kept in the statistics segment's header: one record for the memory store (its launcher's round purges
//! every database's full buckets at once) and [`DATABASE_RECORDS`] records for the table stores of the
//! databases purged most recently (when all are taken, a new database takes the record written longest
//! ago). Written only by the worker (the launcher, then one database's purge at a time); read by
//! `rate_limit.metrics_purge`. Not saved across restarts: until the first round after a start there is no
//! record, which a monitoring system sees as no sample.
//!
//! Each record is a sequence lock: the writer makes `version` odd, writes the fields, makes it even again;
//! a reader retries until it read the fields under one even version, so it never mixes two purges (or two
//! databases, when a record is taken over).

use std::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64, Ordering};

/// Databases whose last table-store purge is kept.
pub const DATABASE_RECORDS: usize = 64;

/// One purge, as a reader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Purge {
    /// The database's OID (0 for the memory store's record).
    pub database: u32,
    /// Wall clock (µs since 2000-01-01) when the purge finished.
    pub at: i64,
    /// Rows (table store) or buckets (memory store) it deleted.
    pub freed: i64,
}

/// A record in shared memory (zeroed: empty).
#[repr(C)]
#[derive(Default)]
pub struct Record {
    version: AtomicU64,
    database: AtomicU32,
    at: AtomicI64,
    freed: AtomicI64,
}

impl Record {
    fn write(&self, p: Purge) {
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release); // the odd version is seen before any field changes
        self.database.store(p.database, Ordering::Relaxed);
        self.at.store(p.at, Ordering::Relaxed);
        self.freed.store(p.freed, Ordering::Relaxed);
        self.version.store(v.wrapping_add(2), Ordering::Release);
    }

    /// The record's purge, if it holds one.
    pub fn read(&self) -> Option<Purge> {
        loop {
            let before = self.version.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let p = Purge {
                database: self.database.load(Ordering::Relaxed),
                at: self.at.load(Ordering::Relaxed),
                freed: self.freed.load(Ordering::Relaxed),
            };
            fence(Ordering::Acquire); // the fields are read before the version is read again
            if self.version.load(Ordering::Relaxed) == before {
                return (p.at != 0).then_some(p);
            }
        }
    }
}

/// Every record: the memory store's and the databases'.
#[repr(C)]
pub struct Records {
    memory: Record,
    databases: [Record; DATABASE_RECORDS],
}

impl Default for Records {
    fn default() -> Records {
        Records {
            memory: Record::default(),
            databases: std::array::from_fn(|_| Record::default()),
        }
    }
}

impl Records {
    /// Notes a finished purge of the memory store.
    pub fn note_memory(&self, at: i64, freed: i64) {
        self.memory.write(Purge {
            database: 0,
            at,
            freed,
        });
    }

    /// Notes a finished purge of `database`'s table store, in its record, a free one, or the one written
    /// longest ago.
    pub fn note_database(&self, database: u32, at: i64, freed: i64) {
        let read: Vec<Option<Purge>> = self.databases.iter().map(Record::read).collect();
        let slot = read
            .iter()
            .position(|p| p.is_some_and(|p| p.database == database))
            .or_else(|| read.iter().position(Option::is_none))
            .unwrap_or_else(|| {
                (0..read.len())
                    .min_by_key(|&i| read[i].map_or(i64::MIN, |p| p.at))
                    .unwrap_or(0)
            });
        self.databases[slot].write(Purge {
            database,
            at,
            freed,
        });
    }

    /// The memory store's last purge, if any since the start.
    pub fn memory(&self) -> Option<Purge> {
        self.memory.read()
    }

    /// `database`'s last table-store purge, if it is kept.
    pub fn database(&self, database: u32) -> Option<Purge> {
        self.databases
            .iter()
            .filter_map(Record::read)
            .find(|p| p.database == database)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_keeps_its_record_and_the_oldest_gives_way_when_all_are_taken() {
        let r = Records::default();
        assert_eq!(r.database(7), None);
        r.note_database(7, 100, 3);
        r.note_database(7, 200, 4);
        assert_eq!(
            r.database(7),
            Some(Purge {
                database: 7,
                at: 200,
                freed: 4
            })
        );
        for d in 0..DATABASE_RECORDS as u32 - 1 {
            r.note_database(1000 + d, 300 + i64::from(d), 0);
        }
        assert_eq!(r.database(7).map(|p| p.at), Some(200));
        r.note_database(5, 10_000, 9); // all taken: database 7's (written longest ago) gives way
        assert_eq!(r.database(7), None);
        assert_eq!(r.database(5).map(|p| p.freed), Some(9));
        assert_eq!(r.database(1000).map(|p| p.at), Some(300));
    }

    #[test]
    fn the_memory_stores_record_is_apart() {
        let r = Records::default();
        assert_eq!(r.memory(), None);
        r.note_memory(50, 12);
        assert_eq!(r.memory().map(|p| (p.at, p.freed)), Some((50, 12)));
        assert_eq!(r.database(0), None);
    }
}
