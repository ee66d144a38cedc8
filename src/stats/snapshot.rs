//! The statistics across restarts: [`save`] writes every entry with counts to `pg_stat/rate_limit.stats`
//! at a clean shutdown, [`load_saved`] puts them back into a segment just created. File format and failure
//! handling: [`crate::persist`].

use std::sync::atomic::Ordering;

use super::segment::{Stats, Totals, NAME_BYTES, SEGMENT};
use crate::persist;
use rate_limit_model::summary::{Summary, KEY_PREFIX};

const FILE: &str = "pg_stat/rate_limit.stats";
const MAGIC: &[u8; 8] = b"RLSTAT02";
/// The format of 0.4.0 (no counts of shadow-mode and block denials), still read: those start at 0.
const MAGIC_0_4: &[u8; 8] = b"RLSTAT01";

/// Saves every entry with counts (clean shutdown, in the postmaster).
pub fn save() {
    let Some(stats) = Stats::attach() else {
        return;
    };
    let used = stats.header.used.load(Ordering::Acquire);
    let mut w = persist::Writer::new(MAGIC);
    w.u64(stats.header.seed[0]);
    w.u64(stats.header.seed[1]);
    let kept: Vec<u32> = (0..used)
        .filter(|&i| stats.entry(i).totals().calls != 0)
        .collect();
    w.u32(kept.len() as u32);
    for i in kept {
        let e = stats.entry(i);
        let t = e.totals();
        w.u32(e.database);
        w.u32(e.name_len);
        w.bytes(&e.name[..e.name_len as usize]);
        w.i64(e.since.load(Ordering::Relaxed));
        w.i64(e.last_denial.load(Ordering::Relaxed));
        for v in [
            t.calls,
            t.granted,
            t.denied,
            t.tokens,
            t.shadow_denied,
            t.blocked,
        ] {
            w.u64(v);
        }
        let summary = e.with_summary(|s| *s);
        for c in &summary.counters {
            w.u64(c.hash);
            w.u64(c.count);
            w.u64(c.error);
            w.u32(u32::from(c.key_len));
            w.bytes(&c.key_prefix);
        }
    }
    persist::write_file(FILE, "statistics", &w.finish());
}

/// Loads what a clean shutdown saved into the segment just created (in the postmaster, at start).
pub fn load_saved() {
    persist::read_file(FILE, "statistics entries", |bytes| {
        let stats = Stats::attach().ok_or("the statistics segment is missing")?;
        let older = bytes.get(..MAGIC_0_4.len()) == Some(&MAGIC_0_4[..]);
        let mut r = persist::open(bytes, if older { MAGIC_0_4 } else { MAGIC })?;
        let bad = "the payload is malformed";
        let seed = [r.u64().ok_or(bad)?, r.u64().ok_or(bad)?];
        let count = r.u32().ok_or(bad)?;
        // Parse everything before touching shared memory: a damaged file changes nothing.
        let mut loaded = Vec::new();
        for _ in 0..count {
            let database = r.u32().ok_or(bad)?;
            let name_len = r.u32().ok_or(bad)? as usize;
            if name_len > NAME_BYTES {
                return Err(bad);
            }
            let name = std::str::from_utf8(r.bytes(name_len).ok_or(bad)?).map_err(|_| bad)?;
            let since = r.i64().ok_or(bad)?;
            let last = r.i64().ok_or(bad)?;
            let mut t = Totals {
                calls: r.u64().ok_or(bad)?,
                granted: r.u64().ok_or(bad)?,
                denied: r.u64().ok_or(bad)?,
                tokens: r.u64().ok_or(bad)?,
                ..Totals::default()
            };
            if !older {
                t.shadow_denied = r.u64().ok_or(bad)?;
                t.blocked = r.u64().ok_or(bad)?;
            }
            let mut summary = Summary::default();
            for c in summary.counters.iter_mut() {
                c.hash = r.u64().ok_or(bad)?;
                c.count = r.u64().ok_or(bad)?;
                c.error = r.u64().ok_or(bad)?;
                c.key_len = u16::try_from(r.u32().ok_or(bad)?).map_err(|_| bad)?;
                c.key_prefix = r
                    .bytes(KEY_PREFIX)
                    .ok_or(bad)?
                    .try_into()
                    .map_err(|_| bad)?;
            }
            loaded.push((database, name.to_string(), since, last, t, summary));
        }
        if !r.at_end() {
            return Err(bad);
        }
        // The summaries identify keys by their hashes under the saved key: keep using it.
        // SAFETY: SEGMENT points at the header just created (Stats::attach succeeded); we are in the
        // postmaster at start, before any backend exists and before any entry is hashed.
        unsafe { (*SEGMENT).seed = seed };
        let mut n = 0;
        for (database, name, since, last, t, summary) in loaded {
            let Some(i) = stats.find_or_create(database, &name) else {
                break; // fewer entries than before (rate_limit.stats_max was lowered)
            };
            let e = stats.entry(i);
            e.set_totals(t);
            e.since.store(since, Ordering::Relaxed);
            e.last_denial.store(last, Ordering::Relaxed);
            e.with_summary(|s| *s = summary);
            n += 1;
        }
        Ok(n)
    });
}
