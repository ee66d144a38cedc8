//! The memory store across restarts: [`save`] writes every bucket to `pg_stat/rate_limit.memory` (at a
//! clean shutdown, and every `rate_limit.memory_snapshot_interval` from the background worker), [`load`]
//! puts them back into a segment just created. File format and failure handling: [`crate::persist`].
//!
//! Instants are saved on the wall clock: the store's own clock (`CLOCK_BOOTTIME` plus a base taken at
//! creation) starts again at a reboot, so `at` is converted to wall-clock microseconds when saved and back
//! to the new store clock when loaded. An instant that would lie in the future of the new clock (the wall
//! clock went back meanwhile) is brought to now: no time counts as elapsed, so no token is minted. The
//! table's hash key is saved with the buckets and restored, since a slot is found by its keyed hash (the
//! id itself is not stored). Buckets that do not fit (a smaller `rate_limit.max_buckets`) are left out:
//! they start full. A file of 0.3.0 ([`MAGIC_0_3`]: no role, 28 bytes of id) is read too: its buckets are
//! counted for role 0, which no session has, so they count against no role's share. The bitmap of the
//! policies that may hold a block by hand is saved with the buckets (a file of 0.4.0 or 0.3.0, without it,
//! notes every policy when it holds a block bucket).

use super::atomic_state::AtomicState;
use super::hand_blocks::WORDS;
use super::segment::{Table, SEGMENT};
use super::slots::{
    id_prefix, slot_policy, Probe, Slot, ID_PREFIX, KIND_AD_HOC, KIND_POLICY, KIND_REQUEST,
};
use crate::persist;
use rate_limit_model::algorithm::{Algorithm, State};

const FILE: &str = "pg_stat/rate_limit.memory";
/// The format written: each bucket with the login role that made it, and the bitmap of the policies that
/// may hold a block by hand ([`HandBlocks`](super::hand_blocks::HandBlocks)).
const MAGIC: &[u8; 8] = b"RLMEM003";
/// The format of 0.4.0 (no bitmap), still read.
const MAGIC_0_4: &[u8; 8] = b"RLMEM002";
/// The format of 0.3.0 (no role; 28 bytes of id; no bitmap), still read.
const MAGIC_0_3: &[u8; 8] = b"RLMEM001";
/// Bytes of id a 0.3.0 file keeps per bucket.
const ID_PREFIX_0_3: usize = 28;

/// Writes every bucket of every database. Logs and gives up on any error.
pub fn save() {
    let Ok(table) = Table::attach("rate_limit") else {
        return;
    };
    let mut slots: Vec<Slot> = Vec::new();
    let mut wall_offset = 0;
    for p in 0..table.header.partitions {
        // copied under the shared lock, written after it is released
        let part = table.lock_shared(p);
        slots.extend(part.slots.iter().filter(|s| s.used != 0).cloned());
        wall_offset = table.wall_offset();
    }
    let mut w = persist::Writer::new(MAGIC);
    w.u64(table.header.seed[0]);
    w.u64(table.header.seed[1]);
    // read after the buckets were copied: a policy blocked by hand meanwhile is noted, never one missed
    for word in table.header.hand_blocks.words() {
        w.u64(word);
    }
    w.u64(slots.len() as u64);
    for s in &slots {
        let state = s.state.load();
        w.u64(s.hash[0]);
        w.u64(s.hash[1]);
        w.i64(state.level);
        w.i64(state.at.saturating_add(wall_offset));
        w.i64(s.rate);
        w.i64(s.period_us);
        w.i64(s.burst);
        w.u32(s.database);
        w.u32(s.role);
        w.u32(s.policy_tag);
        w.bytes(&[s.used, s.algorithm, s.id_len, s.id_truncated]);
        w.bytes(&s.id_prefix);
    }
    persist::write_file(FILE, "the memory store", &w.finish());
}

/// Loads the saved buckets into the segment just created (in the postmaster, before any backend).
pub fn load() {
    persist::read_file(FILE, "memory-store buckets", |bytes| {
        let table = Table::attach("rate_limit").map_err(|_| "the memory store is missing")?;
        let bad = "the payload is malformed";
        let (mut r, format) = open(bytes)?;
        let with_roles = format != Format::V0_3;
        let seed = [r.u64().ok_or(bad)?, r.u64().ok_or(bad)?];
        let hand_blocks = if format == Format::Current {
            Some(read_hand_blocks(&mut r)?)
        } else {
            None
        };
        let count = r.u64().ok_or(bad)?;
        let wall_offset = table.wall_offset();
        let now = table.now();
        // Parse and check everything before touching shared memory: a damaged file changes nothing.
        let mut slots = Vec::new();
        for _ in 0..count {
            slots.push(read_slot(&mut r, with_roles, wall_offset, now)?);
        }
        if !r.at_end() {
            return Err(bad);
        }
        // SAFETY: SEGMENT points at the header just created (attach succeeded); we are in the postmaster
        // at start, before any backend exists and before any slot is hashed with the new key.
        unsafe { (*SEGMENT).seed = seed };
        match hand_blocks {
            Some(words) => table.header.hand_blocks.restore(&words),
            // a file of 0.4.0 or 0.3.0 does not say which policies were blocked by hand: if it holds a
            // block bucket, every policy's calls read blocks
            None => {
                if slots
                    .iter()
                    .any(|s| slot_policy(s).is_some_and(|p| p.algorithm() == Algorithm::Block))
                {
                    table.header.hand_blocks.note_all();
                }
            }
        }
        let mut loaded = 0;
        for slot in slots {
            let mut part = table.lock_exclusive(table.partition_of(&slot.hash));
            if let Probe::Empty(idx) = part.probe(&slot.hash) {
                if part.insert(idx, slot) {
                    loaded += 1;
                }
            }
        }
        Ok(loaded)
    });
}

/// The formats [`load`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// [`MAGIC`].
    Current,
    /// [`MAGIC_0_4`].
    V0_4,
    /// [`MAGIC_0_3`].
    V0_3,
}

/// A reader of the saved store's payload, and its format.
fn open(bytes: &[u8]) -> Result<(persist::Reader<'_>, Format), &'static str> {
    let formats = [
        (MAGIC, Format::Current),
        (MAGIC_0_4, Format::V0_4),
        (MAGIC_0_3, Format::V0_3),
    ];
    // the format its magic names (so that a damaged file of an older format says what is wrong with it)
    let format = formats
        .into_iter()
        .find(|(magic, _)| bytes.get(..magic.len()) == Some(&magic[..]));
    match format {
        Some((magic, format)) => persist::open(bytes, magic).map(|r| (r, format)),
        None => persist::open(bytes, MAGIC).map(|r| (r, Format::Current)),
    }
}

/// The saved bitmap of the policies that may hold a block by hand.
fn read_hand_blocks(r: &mut persist::Reader<'_>) -> Result<[u64; WORDS], &'static str> {
    let mut words = [0u64; WORDS];
    for word in &mut words {
        *word = r.u64().ok_or("the payload is malformed")?;
    }
    Ok(words)
}

/// The bitmap of the policies that may hold a block by hand, as the saved store in the data directory says
/// (read without loading or deleting the file); `None` without a file of the current format.
#[cfg(any(test, feature = "pg_test"))]
pub fn saved_hand_blocks() -> Option<[u64; WORDS]> {
    let bytes = std::fs::read(FILE).ok()?;
    let (mut r, format) = open(&bytes).ok()?;
    if format != Format::Current {
        return None;
    }
    r.u64()?;
    r.u64()?;
    read_hand_blocks(&mut r).ok()
}

/// One saved slot, checked: its instant moved from the wall clock to the store's clock (never after
/// `now`), and a longer id of 0.3.0 cut to what a slot keeps now, at a character boundary. `with_roles`:
/// the file is of the current format (0.3.0's has no role, and a longer id prefix).
fn read_slot(
    r: &mut persist::Reader<'_>,
    with_roles: bool,
    wall_offset: i64,
    now: i64,
) -> Result<Slot, &'static str> {
    let bad = "the payload is malformed";
    let hash = [r.u64().ok_or(bad)?, r.u64().ok_or(bad)?];
    let level = r.i64().ok_or(bad)?;
    let at_wall = r.i64().ok_or(bad)?;
    let (rate, period_us, burst) = (
        r.i64().ok_or(bad)?,
        r.i64().ok_or(bad)?,
        r.i64().ok_or(bad)?,
    );
    let database = r.u32().ok_or(bad)?;
    let role = if with_roles { r.u32().ok_or(bad)? } else { 0 };
    let policy_tag = r.u32().ok_or(bad)?;
    let flags = r.bytes(4).ok_or(bad)?;
    let saved = r
        .bytes(if with_roles { ID_PREFIX } else { ID_PREFIX_0_3 })
        .ok_or(bad)?;
    let (id_len, id_truncated) = (usize::from(flags[2]), flags[3]);
    if id_len > saved.len() {
        return Err(bad);
    }
    let shown = String::from_utf8_lossy(&saved[..id_len]);
    let (id_prefix, kept) = id_prefix(&shown);
    let id_truncated = id_truncated | u8::from(usize::from(kept) < id_len);
    let slot = Slot {
        hash,
        state: AtomicState::new(State {
            level,
            at: at_wall.saturating_sub(wall_offset).min(now),
        }),
        rate,
        period_us,
        burst,
        database,
        role,
        policy_tag,
        used: flags[0],
        algorithm: flags[1],
        id_len: kept,
        id_truncated,
        id_prefix,
    };
    let kind_ok = [KIND_REQUEST, KIND_AD_HOC, KIND_POLICY].contains(&slot.used);
    if !kind_ok || slot_policy(&slot).is_none() {
        return Err(bad);
    }
    Ok(slot)
}
