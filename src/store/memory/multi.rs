//! The exclusive path: a call on several buckets (all or nothing), a bucket that does not exist yet, or one
//! whose numbers changed. Every partition the call touches is locked EXCLUSIVE, lowest first; every bucket
//! is evaluated; only if all grant is room made for the new ones (within the database's share, see
//! [`super::shares`]) and then every bucket written. Nothing is written unless everything can be, and the
//! error of a refused call is built after the locks are released.

use std::sync::atomic::Ordering;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

use super::guards::Locked;
use super::segment::{current_database, Table};
use super::slots::{new_slot, stored_of, write_policy, Evict, Probe};
use crate::algorithm::Outcome;
use crate::gucs::{self, OnFull};
use crate::store::target::{granted, Ask, Target, MAX_TARGETS};
use rate_limit_model::shares::{self, NoRoom, Room};

/// Answers `ask` for every target under the exclusive locks of their partitions, all or nothing: nothing
/// is written unless the call is granted ([`granted`]), and then every allowed outcome is written (a
/// bucket in shadow mode that would have denied keeps its state). `hashes` and `parts` are the targets'
/// keyed hashes and partitions.
pub(super) fn take_exclusive(
    function: &'static str,
    table: &Table,
    targets: &[Target<'_>],
    hashes: &[[u64; 2]],
    parts: &[u32],
    ask: Ask,
) -> Result<Vec<Outcome>, ErrorReport> {
    let n = targets.len();
    let on_full = gucs::on_full();
    let share = gucs::database_share();
    let database = current_database();
    let cap = shares::cap(table.header.limit_per_partition, share);
    let mut outcomes = Vec::with_capacity(n);
    let mut locked = Locked::lock(table, parts);
    let now = table.now();
    for (i, t) in targets.iter().enumerate() {
        let g = locked.guard(parts[i]);
        let stored = match g.probe(&hashes[i]) {
            Probe::Found(idx) => stored_of(&g.slots[idx]),
            Probe::Empty(_) => None,
        };
        outcomes.push(t.answer(stored, now, ask));
    }
    if !granted(targets, &outcomes) {
        return Ok(outcomes);
    }
    // Room for the new buckets first, so that nothing is written unless everything can be.
    for i in 0..n {
        let g = locked.guard(parts[i]);
        let missing = (0..n)
            .filter(|&j| {
                parts[j] == parts[i]
                    && outcomes[j].allowed
                    && matches!(g.probe(&hashes[j]), Probe::Empty(_))
            })
            .count() as u32;
        loop {
            let evict = match Room::needed(
                &g.header.owners,
                g.header.count,
                g.limit,
                database,
                cap,
                missing,
            ) {
                Room::Enough => break,
                Room::FromOwnShare => Evict::Own {
                    database,
                    lossy: on_full == OnFull::EvictOldest,
                },
                Room::FullBucketOfAnyone => Evict::FullOfAnyone,
            };
            if !g.make_room(now, evict, table.header, hashes) {
                drop(locked);
                table.header.refused_full.fetch_add(1, Ordering::Relaxed);
                let why = match evict {
                    Evict::Own { .. } => NoRoom::ShareFull,
                    Evict::FullOfAnyone => NoRoom::StoreFull,
                };
                return Err(full_error(function, why, share, cap, table));
            }
        }
    }
    for (i, t) in targets
        .iter()
        .enumerate()
        .filter(|(i, _)| outcomes[*i].allowed)
    {
        let g = locked.guard(parts[i]);
        match g.probe(&hashes[i]) {
            Probe::Found(idx) => {
                let slot = &mut g.slots[idx];
                slot.state.store(outcomes[i].state);
                write_policy(slot, &t.policy);
            }
            Probe::Empty(idx) => {
                let slot = new_slot(hashes[i], &t.namespace, t.key, &t.policy, outcomes[i].state);
                // room was made above, for this database too
                g.insert(idx, slot);
            }
        }
    }
    Ok(outcomes)
}

/// 53200 for a call whose new bucket found no room: its database's share is full, or the store is.
/// The hint never recommends `evict_oldest`: it resets limits.
fn full_error(
    function: &'static str,
    why: NoRoom,
    share: u32,
    cap: u32,
    table: &Table,
) -> ErrorReport {
    let h = table.header;
    match why {
        NoRoom::ShareFull => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            "this database's share of the rate_limit memory store is full",
            function,
        )
        .set_detail(format!(
            "rate_limit.database_share = {share}% lets a database hold {cap} buckets in each of the \
             store's {} partitions (rate_limit.max_buckets = {}); none of this database's buckets in this \
             one is full.",
            h.partitions, h.max_buckets
        ))
        .set_hint(
            "Fewer distinct keys, or limits that refill sooner, free the share (rate_limit.purge() \
             deletes full buckets). A superuser can raise the share (ALTER DATABASE ... SET \
             rate_limit.database_share) or rate_limit.max_buckets (takes a restart).",
        ),
        NoRoom::StoreFull => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            "the rate_limit memory store is full",
            function,
        )
        .set_detail(format!(
            "A partition is full of buckets of other databases, none of them full: the shares of the \
             databases that use the store add up to more than 100% (rate_limit.max_buckets = {}, up to \
             {} databases per partition).",
            h.max_buckets,
            shares::OWNERS
        ))
        .set_hint(
            "A superuser can raise rate_limit.max_buckets (takes a restart) or lower \
             rate_limit.database_share so that the shares add up to 100% or less.",
        ),
    }
}

/// The most targets one call may name, as an error.
pub(super) fn too_many_targets(function: &'static str, n: usize) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("a call may name at most {MAX_TARGETS} buckets, got {n}"),
        function,
    )
    .set_hint("Split the limits over several calls.")
}
