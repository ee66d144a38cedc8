//! The exclusive path: a call on several buckets (all or nothing), a bucket that does not exist yet, or one
//! whose numbers changed. Every partition the call touches is locked EXCLUSIVE, lowest first; every bucket
//! is evaluated; only if all grant is room made for the new ones (within the database's and the role's
//! shares, see [`rate_limit_model::shares`]) and then every bucket written. Nothing is written unless everything can be, and the
//! error of a refused call is built after the locks are released.

use std::sync::atomic::Ordering;

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

use super::guards::Locked;
use super::segment::{role_is_superuser, Table};
use super::slots::{new_slot, stored_of, write_policy, Evict, Probe, Whose};
use crate::backend::current_database;
use crate::backend::current_role;
use crate::gucs::{self, OnFull};
use rate_limit_model::algorithm::Outcome;
use rate_limit_model::shares::{self, Caller, NoRoom, Room};
use rate_limit_model::target::{granted, Ask, Target, MAX_TARGETS};

/// Answers `asks[i]` for `targets[i]`, every target, under the exclusive locks of their partitions, all or
/// nothing: nothing
/// is written unless the call is granted ([`granted`]), and then every allowed outcome is written (a
/// bucket in shadow mode that would have denied keeps its state). `hashes` and `parts` are the targets'
/// keyed hashes and partitions.
pub(super) fn take_exclusive(
    function: &'static str,
    table: &Table,
    targets: &[Target<'_>],
    hashes: &[[u64; 2]],
    parts: &[u32],
    asks: &[Ask],
) -> Result<Vec<Outcome>, ErrorReport> {
    let caller = this_caller(table.header.limit_per_partition);
    let lossy = gucs::on_full() == OnFull::EvictOldest;
    let mut locked = Locked::lock(table, parts);
    let now = table.now();
    let outcomes: Vec<Outcome> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let g = locked.guard(parts[i]);
            let stored = match g.probe(&hashes[i]) {
                Probe::Found(idx) => stored_of(&g.slots[idx]),
                Probe::Empty(_) => None,
            };
            t.answer(stored, now, asks[i])
        })
        .collect();
    if !granted(targets, &outcomes) {
        return Ok(outcomes);
    }
    // Room for the new buckets first, so that nothing is written unless everything can be.
    for i in 0..targets.len() {
        let g = locked.guard(parts[i]);
        let missing = (0..targets.len())
            .filter(|&j| {
                parts[j] == parts[i]
                    && outcomes[j].allowed
                    && matches!(g.probe(&hashes[j]), Probe::Empty(_))
            })
            .count() as u32;
        while let Some((evict, why)) = eviction(
            Room::needed(&g.owners, g.header.count, g.limit, &caller, missing),
            &caller,
            lossy,
        ) {
            if !g.make_room(now, evict, &table.header.evictions, hashes) {
                drop(locked);
                table.header.refused_full.fetch_add(1, Ordering::Relaxed);
                return Err(full_error(function, why, &caller, table));
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
                // room was made above, within the caller's caps
                g.insert(idx, slot);
            }
        }
    }
    Ok(outcomes)
}

/// The session's database and login role, with their caps in a partition of `limit` buckets (a
/// superuser's role is not held to `rate_limit.role_share`).
fn this_caller(limit: u32) -> Caller {
    Caller {
        database: current_database(),
        role: current_role(),
        database_cap: shares::cap(limit, gucs::database_share()),
        role_cap: if role_is_superuser() {
            limit
        } else {
            shares::cap(limit, gucs::role_share())
        },
    }
}

/// What to evict to make the room `room` says is missing, and the refusal if nothing can be; `None`
/// when there is room enough. `lossy` (`on_full = evict_oldest`) also lets the caller's own oldest
/// bucket go.
fn eviction(room: Room, caller: &Caller, lossy: bool) -> Option<(Evict, NoRoom)> {
    let own = Whose {
        database: Some(caller.database),
        role: Some(caller.role),
    };
    match room {
        Room::Enough => None,
        // a full bucket of the database, else (lossy) one the caller's role made there
        Room::FromOwnDatabase => Some((
            Evict {
                full: Whose { role: None, ..own },
                oldest: lossy.then_some(own),
            },
            NoRoom::DatabaseShareFull,
        )),
        // a bucket of the role's own, in any database
        Room::FromOwnRole => {
            let role = Whose {
                database: None,
                ..own
            };
            let evict = Evict {
                full: role,
                oldest: lossy.then_some(role),
            };
            Some((evict, NoRoom::RoleShareFull))
        }
        Room::FullBucketOfAnyone => Some((Evict::FULL_OF_ANYONE, NoRoom::StoreFull)),
    }
}

/// 53200 for a call whose new bucket found no room: its database's or its role's share is full, or the
/// store is. The hint never recommends `evict_oldest`: it resets limits.
fn full_error(function: &'static str, why: NoRoom, caller: &Caller, table: &Table) -> ErrorReport {
    let h = table.header;
    let share = gucs::database_share();
    let cap = caller.database_cap;
    match why {
        NoRoom::RoleShareFull => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            "this role's share of the rate_limit memory store is full",
            function,
        )
        .set_detail(format!(
            "rate_limit.role_share = {}% lets a login role hold {} buckets in each of the store's {} \
             partitions (rate_limit.max_buckets = {}), over every database; none of this role's buckets \
             in this one is full.",
            gucs::role_share(),
            caller.role_cap,
            h.partitions,
            h.max_buckets
        ))
        .set_hint(
            "Fewer distinct keys, or limits that refill sooner, free the share (rate_limit.purge() \
             deletes full buckets). A superuser can raise the role's share (ALTER ROLE ... SET \
             rate_limit.role_share) or rate_limit.max_buckets (takes a restart).",
        ),
        NoRoom::DatabaseShareFull => ErrorReport::new(
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
            "A partition is full of buckets of other databases and roles, none of them full: the shares \
             of the roles and databases that use the store add up to more than 100% \
             (rate_limit.max_buckets = {}).",
            h.max_buckets,
        ))
        .set_hint(
            "A superuser can raise rate_limit.max_buckets (takes a restart) or lower \
             rate_limit.role_share or rate_limit.database_share so that the shares add up to 100% or less.",
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
