//! The shift of the table store's clock: how far this server's wall clock is ahead of the clock the table
//! store's rows were written on (the arithmetic and its reasons: [`rate_limit_model::skew`]).
//!
//! - It lives in a small shared segment (one atomic), read by every call of the table store.
//! - The postmaster sets it at start from the data directory's file [`FILE`] (absent: 0). The file is
//!   written when a standby is promoted, so the shift outlives restarts and is copied with the data
//!   directory to the standbys made from it (`pg_basebackup`, `pg_rewind`).
//! - While the server is a streaming standby, the launcher ([`Sampler::tick`], every second) reads the
//!   send and receipt instants of the WAL receiver's last message and publishes the file's shift plus
//!   the measured skew; a promotion freezes it and writes it to the file. A standby's calls (reads) and the
//!   new primary's calls from its first instant thus read rows on the clock they were written on.
//!
//! Without preloading there is no segment: the shift is 0.

use std::ffi::CStr;
use std::ptr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use pgrx::pg_sys;
use rate_limit_model::skew::{self, Estimator};

/// The file, relative to the data directory: the shift in microseconds, as decimal text.
pub const FILE: &str = "rate_limit.clock_shift";

const SEGMENT_NAME: &CStr = c"rate_limit clock shift";

/// The shared segment (null until attached, and in a library that was not preloaded).
static mut SEGMENT: *const AtomicI64 = ptr::null();

/// Requests the segment's space.
///
/// # Safety
/// Only in the postmaster while shared memory may still be requested.
pub unsafe fn request_shmem() {
    // SAFETY: the caller guarantees the request phase.
    unsafe { crate::shmem::request(size_of::<AtomicI64>(), None) }
}

/// Creates or finds the segment; a segment just created (in the postmaster) is set from [`FILE`].
///
/// # Safety
/// Only from the shmem startup hook, with AddinShmemInitLock held and the space requested.
pub unsafe fn attach_or_create() {
    // SAFETY: the caller's contract is shmem::attach's; a new segment comes zeroed (a zero shift) and is
    // set here before any backend exists.
    unsafe {
        let (segment, created) = crate::shmem::attach(SEGMENT_NAME, size_of::<AtomicI64>());
        let segment = segment.cast::<AtomicI64>().cast_const();
        if created {
            (*segment).store(saved(), Ordering::Relaxed);
        }
        SEGMENT = segment;
    }
}

fn segment() -> Option<&'static AtomicI64> {
    // SAFETY: SEGMENT is written once per process, in the shmem startup hook, before any call can read
    // it; when set it points at an AtomicI64 in shared memory that lives as long as the server.
    unsafe { SEGMENT.as_ref() }
}

/// The shift now (µs): 0 without the segment.
pub fn current() -> i64 {
    segment().map_or(0, |s| s.load(Ordering::Relaxed))
}

/// The shift saved in [`FILE`]; 0 when there is none (a warning when it cannot be read).
fn saved() -> i64 {
    match std::fs::read_to_string(FILE) {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| {
            pgrx::warning!("rate_limit: ignored \"{FILE}\": not a number of microseconds");
            0
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => {
            pgrx::warning!("rate_limit: could not read \"{FILE}\": {e}; the table store's clock is not shifted");
            0
        }
    }
}

fn save(shift: i64) {
    crate::persist::write_file(
        FILE,
        "the table store's clock shift",
        format!("{shift}\n").as_bytes(),
    );
}

/// The WAL receiver's last message: when the primary sent it and when this server received it (µs on
/// each one's clock), if it is the same pair when read twice a millisecond apart (the receiver writes the
/// two one after the other; a pair read between the two writes changes within that millisecond).
fn last_message() -> Option<(i64, i64)> {
    fn read() -> Option<(i64, i64)> {
        // SAFETY: WalRcv points at the WAL receiver's shared struct, which exists from server start
        // whether a receiver runs or not; the two timestamps are aligned 8-byte fields, each read whole
        // (volatile: the receiver changes them), and a pair torn between two messages is rejected by the
        // caller's second reading.
        unsafe {
            let walrcv = wal_receiver();
            if walrcv.is_null() {
                return None;
            }
            Some((
                ptr::read_volatile(&raw const (*walrcv).lastMsgSendTime),
                ptr::read_volatile(&raw const (*walrcv).lastMsgReceiptTime),
            ))
        }
    }
    let first = read()?;
    std::thread::sleep(Duration::from_millis(1));
    (read()? == first).then_some(first)
}

/// The WAL receiver's shared struct (`WalRcv`).
#[cfg(not(feature = "pg13"))]
fn wal_receiver() -> *const pg_sys::WalRcvData {
    // SAFETY: reading a pointer-sized global of the server, set once in the postmaster at start.
    unsafe { pg_sys::WalRcv }
}

/// PostgreSQL 13's bindings lack `WalRcvData`: the start of PostgreSQL 13's struct, up to the two
/// instants read here, field for field as in its `replication/walreceiver.h` (the same in every 13.x).
#[cfg(feature = "pg13")]
#[repr(C)]
#[allow(non_snake_case)] // the server's names, so that both versions read the same fields
struct WalRcvData {
    pid: i32,
    wal_rcv_state: i32,
    start_time: i64,
    receive_start: u64,
    receive_start_tli: u32,
    flushed_upto: u64,
    received_tli: u32,
    latest_chunk_start: u64,
    lastMsgSendTime: i64,
    lastMsgReceiptTime: i64,
}

#[cfg(feature = "pg13")]
extern "C" {
    /// The server's `WalRcv` (replication/walreceiver.h), exported by the postgres executable.
    static WalRcv: *const WalRcvData;
}

#[cfg(feature = "pg13")]
fn wal_receiver() -> *const WalRcvData {
    // SAFETY: reading a pointer-sized global of the server, set once in the postmaster at start; the
    // struct above is the prefix of the server's own, so the fields read through it are the server's.
    unsafe { WalRcv }
}

/// The launcher's part: samples the skew while this server is a standby and keeps the shift on a promotion.
#[derive(Default)]
pub struct Sampler {
    estimator: Estimator,
    /// The shift this server started with (from [`FILE`]), once read.
    inherited: Option<i64>,
    /// Whether the last tick found the server in recovery.
    was_standby: bool,
}

impl Sampler {
    /// One tick: on a standby, one more sample and the shift published; on the first tick after a
    /// promotion, the shift saved. Nothing on a primary, or without the segment.
    pub fn tick(&mut self) {
        let Some(shared) = segment() else { return };
        let inherited = *self
            .inherited
            .get_or_insert_with(|| shared.load(Ordering::Relaxed));
        // SAFETY: RecoveryInProgress only reads shared state.
        if unsafe { pg_sys::RecoveryInProgress() } {
            self.was_standby = true;
            if let Some((send, receipt)) = last_message() {
                self.estimator.note(send, receipt);
            }
            shared.store(
                skew::shift(inherited, self.estimator.skew()),
                Ordering::Relaxed,
            );
        } else if std::mem::take(&mut self.was_standby) {
            let shift = shared.load(Ordering::Relaxed);
            if shift != inherited {
                pgrx::log!(
                    "rate_limit: promoted; the table store's clock is {shift} µs behind this server's wall clock \
                     (the old primary's clock, measured while streaming)"
                );
                save(shift);
            }
        }
    }

    /// Whether the launcher must wake every second to sample (this server is a standby).
    pub fn wants_ticks() -> bool {
        // SAFETY: RecoveryInProgress only reads shared state.
        segment().is_some() && unsafe { pg_sys::RecoveryInProgress() }
    }
}

/// The clock shift's SQL function, in schema `rate_limit`.
#[pgrx::pg_schema]
mod rate_limit {
    use pgrx::datum::Interval;
    use pgrx::prelude::*;

    /// How far the table store's clock is behind this server's wall clock (`clock_timestamp()`): zero
    /// unless this server was promoted from a standby whose clock was off its primary's (or was copied
    /// from such a server). The table store reads and writes its rows at `clock_timestamp()` minus this.
    #[pg_extern(volatile, parallel_safe)]
    fn clock_shift() -> Interval {
        Interval::from_micros(super::current())
    }
}
