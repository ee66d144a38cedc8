//! The table store's concurrency leases: each slot of a key is a row of `rate_limit.bucket_state` (its
//! namespace names the policy and the slot, its key is the caller's, so a key's slots share its Citus
//! shard), written in the caller's transaction: a lease acquired in a transaction that rolls back is
//! released with it.
//!
//! An acquire never waits for another transaction, and never makes a release wait. It locks only a free
//! slot's row (released, or its lease expired), with `FOR UPDATE SKIP LOCKED`, so a row another
//! transaction is changing (acquiring, releasing) is passed over and counted as held; a
//! slot without a row is created under a transaction-scoped lock of the slot, only tried (never waited
//! for), so that two transactions never insert the same slot (a plain `INSERT … ON CONFLICT` would wait
//! for the other's uncommitted row). One such lock is held per slot this transaction created, until it
//! ends.
//!
//! That lock is in a namespace no role can reach: its tag is of type `LOCKTAG_USERLOCK` (reserved by
//! PostgreSQL for the long-gone contrib/userlock; no SQL function takes one), not an advisory lock, which
//! any role could take with `pg_advisory_lock` to squat a key's slots forever (before: the slot locks were
//! `pg_try_advisory_xact_lock` on `hashtextextended(namespace || chr(31) || key, 7)`, which anyone can
//! compute). The tag holds the database and 80 bits of a SipHash of (namespace, key), so a chosen key
//! shares a slot's lock with another one time in 2^80, and then only makes a free slot look busy
//! while the other creates its row: a denial, never a lease too many. In a read-only transaction an
//! acquire reads only: it is denied when every slot is held, and raises 25006 when one is free (a grant
//! would write).

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher;

use super::{
    connect, one_key, plans_for, read, read_only, read_with, row_args, spi, timestamptz, write,
};
use crate::error;
use crate::time::clock;
use rate_limit_model::algorithm::{lease_id, State};
use rate_limit_model::target::{Ask, Target};

/// Whether this transaction got the lock of the slot `target` (see the module comment): tried, never
/// waited for, held until the transaction ends.
fn try_lock(target: &Target<'_>) -> bool {
    let tag = slot_lock_tag(target.namespace.stored_name(), target.key);
    // SAFETY: `tag` is a fully initialised LOCKTAG of a user lock method; LockAcquire copies it. A
    // transaction-level lock (sessionLock false) taken with dontWait never sleeps, and is released by
    // PostgreSQL at the end of the transaction (or of the subtransaction that took it, if it aborts), as
    // `pg_try_advisory_xact_lock` does with the same call.
    let result = unsafe {
        pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, true)
    };
    result != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// The lock tag of a slot: a user lock (not an advisory one) of this database, keyed by 80 bits of a
/// SipHash of (namespace, key).
fn slot_lock_tag(namespace: &str, key: &str) -> pg_sys::LOCKTAG {
    let mut h = SipHasher13::new_with_keys(0x7261_7465_5f6c_696d, 0x6974_2d6c_6561_7365);
    h.write(namespace.as_bytes());
    h.write_u8(0x1f);
    h.write(key.as_bytes());
    let hash = h.finish128();
    pg_sys::LOCKTAG {
        locktag_field1: crate::backend::current_database(),
        locktag_field2: (hash.h1 >> 32) as u32,
        locktag_field3: hash.h1 as u32,
        locktag_field4: hash.h2 as u16,
        locktag_type: pg_sys::LockTagType::LOCKTAG_USERLOCK as u8,
        locktag_lockmethodid: USER_LOCKMETHOD,
    }
}

/// PostgreSQL's lock method of user locks (`USER_LOCKMETHOD` in `lock.h`), whose transaction-level locks
/// are released at the end of the transaction.
const USER_LOCKMETHOD: u8 = 2;

/// Acquires a lease in the first slot of `slots` (one key's, in order) that is free, with the id
/// `lease_id(random, slot)`; returns every slot's state as this call saw it (a slot another transaction
/// is changing counts as held until a lease would expire), the granted slot's state, and the instant.
pub fn acquire(
    function: &'static str,
    slots: &[Target<'_>],
    random: u64,
) -> Result<(Vec<State>, Option<State>, i64), ErrorReport> {
    connect(|client| {
        let plans = plans_for(function, client, one_key(slots))?;
        let now = clock::table_now_us();
        let ro = read_only();
        let mut states = Vec::with_capacity(slots.len());
        let mut granted = None;
        for (slot, t) in (0_i64..).zip(slots) {
            let in_flight = State {
                level: 1,
                at: now.saturating_add(t.policy.period_us()),
            };
            if granted.is_some() || ro {
                // report only
                let o = t.answer(
                    read(client, &plans.read_fresh, function, t)?,
                    now,
                    Ask::Take(0),
                );
                if ro && o.allowed {
                    return Err(error::read_only(function));
                }
                states.push(o.state);
                continue;
            }
            let ask = Ask::Acquire {
                lease: lease_id(random, slot),
            };
            let args: [DatumWithOid<'_>; 3] = [
                t.namespace.stored_name().into(),
                t.key.into(),
                timestamptz(function, now)?.into(),
            ];
            if let Some(stored) = read_with(client, &plans.lock_skip, function, &args)? {
                let o = t.answer(Some(stored), now, ask);
                if o.allowed {
                    write(client, plans, function, t, o.state)?;
                    granted = Some(o.state);
                }
                states.push(o.state);
                continue;
            }
            // no free row this call could lock: the slot is held, another transaction is changing it,
            // or it has no row yet
            if let Some(stored) = read(client, &plans.read_fresh, function, t)? {
                let o = t.answer(Some(stored), now, Ask::Take(0));
                // free, yet not lockable: another transaction is taking or releasing it
                states.push(if o.allowed { in_flight } else { o.state });
                continue;
            }
            if !try_lock(t) {
                states.push(in_flight);
                continue;
            }
            let o = t.answer(None, now, ask);
            let args = row_args(function, t, o.state)?;
            if spi(function, client.select(&plans.insert, None, &args))?.len() == 1 {
                granted = Some(o.state);
                states.push(o.state);
            } else {
                // committed by another transaction since this call looked
                states.push(in_flight);
            }
        }
        Ok((states, granted, now))
    })
}
