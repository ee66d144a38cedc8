//! Where bucket state lives: one interface over the buckets of a call (take, peek, refund, reset, purge,
//! list) with two implementations, [`table`] and [`memory`], both private: this module is the only way
//! into a store, for the SQL functions, the background worker (purges) and the shared-memory hooks (the
//! memory store's request, creation and snapshots). A store loads, locks and saves state; the arithmetic
//! is the model's, evaluated through [`rate_limit_model::target::Target`]. The take paths differ on
//! purpose: the table store takes with one conditional UPDATE per bucket so that a denial writes nothing,
//! the memory store under its partitions' locks (see each store's contract).
//!
//! How a take combines what can decide it (the backend's memory of short buckets, overrides, blocks and
//! the penalty box, shadow mode, all or nothing) is the model's pipeline,
//! [`rate_limit_model::pipeline::take`], and so are a charge, a refund and a lease acquired or released
//! ([`rate_limit_model::pipeline::single`]), over this seam's view of a store ([`Seam`]); the seam applies
//! their effects (the memory of short buckets, [`short`]; the statistics). Each store implements one
//! primitive, [`buckets::Buckets`], and every flow here is written once over it; `with_store!` is the
//! one `match` on the store. Under Citus, a memory bucket lives only on the node of its key's shard: the
//! memory store's primitive checks that itself. Blocks by hand are [`blocks`]'.
//!
//! # The lock order (table store; the memory store holds no lock across calls)
//! Row locks taken in a caller's transaction, which holds them until it ends, are taken in one order:
//! 0. under Citus, on the node of the key's shard, Citus's metadata lock of that shard in `ShareLock`
//!    ([`crate::cluster::shards::local_shard`]), before any row lock of the key, as Citus's own writes take
//!    it; it conflicts only with a shard move's or split's `ExclusiveLock`;
//! 1. a key's buckets of several policies (`take_many`): in (namespace, key) order, each before step 2;
//! 2. a key's block bucket after that key's policy bucket: counting a denial in a penalty box first locks
//!    the policy bucket's row ([`rate_limit_model::pipeline::blocks::count_denials`]), as a grant would,
//!    so a transaction that holds the bucket and counts its own denial never meets one that holds the
//!    count and waits for the bucket (before: 40P01); the denials of one call are counted in (namespace,
//!    key) order, as in step 1; a block or unblock by hand locks the block bucket alone;
//! 3. a concurrency policy's slots are locked with `SKIP LOCKED` and never waited for; a slot without a row
//!    is created under a lock of its own that is only tried, never waited for ([`table`]'s leases).
//!
//! `tests/integration/tests/blocks.rs` runs the interleavings of two callers of one key.

mod batch;
mod blocks;
mod buckets;
mod dropped;
mod held;
mod interrupts;
mod memory;
pub mod settles;
pub mod short;
mod table;

pub use batch::take_each;
#[cfg(any(test, feature = "pg_test"))]
pub use blocks::block_reads;
pub use held::{book, cancel, reserve, reserve_many, settle, settle_many};
#[cfg(any(test, feature = "pg_test"))]
pub use memory::hand_blocks_now_and_saved;
pub use memory::{
    attach_or_create as attach_memory, available as memory_available, load_saved as load_memory,
    request_shmem as request_memory, save as save_memory, Usage as MemoryUsage,
};
#[cfg(any(test, feature = "pg_test"))]
pub use table::evaluations as table_evaluations;
pub use table::{Position as PurgePosition, Span as PurgeSpan};

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgSqlErrorCode;

use buckets::{with_store, Buckets};

use crate::gucs::Store;
use crate::stats;
use rate_limit_model::algorithm::{Outcome, State};
use rate_limit_model::pipeline::batch::Visit;
use rate_limit_model::pipeline::single::{CallReport, KeyLimit};
use rate_limit_model::pipeline::{self, Answer, Memo, PerTarget};
use rate_limit_model::target::{Ask, Kind, Namespace, Stored, Target};

/// Asks every target for `cost` tokens, all or nothing (cost 0 only reports); returns one outcome per
/// target. When a call is denied ([`rate_limit_model::target::granted`] is false), at least one outcome of a bucket not in
/// shadow mode is denied and nothing was taken; outcomes of buckets the call did not need to look at are
/// reported as allowed. When it is granted, every allowed outcome's tokens were taken, and a denied one
/// (of a bucket in shadow mode) took nothing.
///
/// In order: a bucket this backend knows to be short denies the call from its memory ([`short`]); else a
/// key blocked under a policy ([`blocks`]) denies it before any bucket is touched (under shadow mode its
/// block is reported as a would-be denial and its bucket is left alone); else the store decides. The
/// denials of a call are then counted in the penalty boxes of their policies.
pub fn take(
    function: &'static str,
    store: Store,
    targets: &[Target<'_>],
    cost: i64,
) -> Result<PerTarget<Outcome>, ErrorReport> {
    with_store!(store, s => take_in(s, function, targets, cost))
}

/// [`take`] in the store `s`: the model's pipeline ([`pipeline::take`]) over `s`, with this backend's memory
/// of short buckets ([`short`]); then its effects on that memory, and the statistics.
fn take_in<S: Buckets>(
    s: &S,
    function: &'static str,
    targets: &[Target<'_>],
    cost: i64,
) -> Result<PerTarget<Outcome>, ErrorReport> {
    // before this backend's memory answers for a bucket that may not be this node's
    s.ensure_here(function, targets)?;
    let remembered = short::remembered(S::STORE);
    let answers = pipeline::take(&Seam { s, function }, remembered, targets, cost)?;
    Ok(apply(S::STORE, targets, &answers, &costs_of(targets, cost)))
}

/// One cost per target: `cost` tokens of each.
fn costs_of(targets: &[Target<'_>], cost: i64) -> PerTarget<i64> {
    targets.iter().map(|_| cost).collect()
}

/// Applies the effects of a call's `answers` (`answers[i]` is `targets[i]`'s, asked for `costs[i]`
/// tokens) on this backend's memory of short buckets and counts them in the statistics; returns their
/// outcomes.
fn apply(
    store: Store,
    targets: &[Target<'_>],
    answers: &[Answer],
    costs: &[i64],
) -> PerTarget<Outcome> {
    remember(store, targets, answers);
    let outcomes = pipeline::outcomes(answers);
    count(targets, &outcomes, answers, costs);
    outcomes
}

/// Does what `answers` say this backend should remember of their targets' buckets ([`short`]).
fn remember(store: Store, targets: &[Target<'_>], answers: &[Answer]) {
    for (t, a) in targets.iter().zip(answers) {
        match a.memo {
            Memo::Keep => {}
            Memo::Forget => short::forget_taken(&t.namespace, t.key),
            Memo::Remember(state) => short::remember(store, t, state),
        }
    }
}

/// Counts a call of `costs[i]` tokens of each target that answered `answers` (their `outcomes`) in the statistics (nothing
/// for a call that only reports).
fn count(targets: &[Target<'_>], outcomes: &[Outcome], answers: &[Answer], costs: &[i64]) {
    if costs.iter().any(|c| *c > 0) {
        stats::record(targets, outcomes, costs);
        stats::record_blocks(targets, answers);
    }
}

/// The model's pipeline's view of a store ([`pipeline::Store`]), for one call of SQL function `function`.
struct Seam<'s, S> {
    s: &'s S,
    function: &'static str,
}

impl<S: Buckets> pipeline::Store for Seam<'_, S> {
    type Error = ErrorReport;

    fn now(&self) -> Result<i64, ErrorReport> {
        self.s.now(self.function)
    }

    fn read(&self, buckets: &[Target<'_>]) -> Result<Vec<Outcome>, ErrorReport> {
        // (the pipeline reads only block buckets)
        blocks::count_block_read();
        self.s.peek_fresh(self.function, buckets)
    }

    fn take(
        &self,
        targets: &[Target<'_>],
        costs: &[i64],
    ) -> Result<PerTarget<Outcome>, ErrorReport> {
        self.s.take(self.function, targets, costs)
    }

    fn take_each(
        &self,
        template: &Target<'_>,
        keys: &[&str],
        costs: &[i64],
        bulk: bool,
        each: &mut impl Visit<ErrorReport>,
    ) -> Result<(), ErrorReport> {
        self.s
            .take_each(self.function, template, keys, costs, bulk, each)
    }

    fn write(&self, target: &Target<'_>, ask: Ask) -> Result<Outcome, ErrorReport> {
        self.s.write(self.function, target, ask)
    }

    fn record(&self, held: &[Target<'_>], amounts: &[i64]) -> Result<bool, ErrorReport> {
        match self.s.record_in_one_pass(self.function, held, amounts)? {
            Some(all) => Ok(all),
            None => pipeline::record_each(self, held, amounts),
        }
    }

    fn update<R>(
        &self,
        target: &Target<'_>,
        step: impl FnOnce(Option<Stored>, i64) -> (Option<State>, R),
    ) -> Result<R, ErrorReport> {
        self.s.update(self.function, target, step)
    }

    fn acquire(
        &self,
        slots: &[Target<'_>],
        random: u64,
    ) -> Result<(Vec<State>, Option<State>, i64), ErrorReport> {
        self.s.acquire(self.function, slots, random)
    }

    fn count_denial(
        &self,
        owner: &Target<'_>,
        bucket: &Target<'_>,
        block_for: i64,
    ) -> Result<Option<Outcome>, ErrorReport> {
        // the lock order (see the module comment): the key's bucket before its block bucket
        if !self.s.prepare_count(self.function, owner)? {
            return Ok(None);
        }
        let ask = Ask::CountDenial { block_for };
        self.s.write(self.function, bucket, ask).map(Some)
    }

    fn reads_block_anyway(&self, target: &Target<'_>) -> Result<bool, ErrorReport> {
        self.s.reads_block_anyway(self.function, target)
    }
}

/// Charges `cost` tokens to the bucket of `target`, whatever it holds, down to `max_debt` tokens below
/// zero ([`pipeline::single::charge`]); creates the bucket if it is missing. Always allowed; returns the
/// bucket afterwards. The table store locks, reads and writes or inserts the row; the memory store answers
/// the charge on its take paths (lock-free for an existing bucket).
pub fn charge(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
    cost: i64,
    max_debt: i64,
) -> Result<Outcome, ErrorReport> {
    let answer = with_store!(store, s => pipeline::single::charge(&Seam { s, function }, target, cost, max_debt))?;
    apply(store, std::slice::from_ref(target), &[answer], &[cost]);
    Ok(answer.outcome)
}

/// Acquires a lease of the key of `target` (a concurrency policy's bucket, see
/// [`rate_limit_model::algorithm::lease`] and [`pipeline::single::acquire`]): the first free slot takes
/// lease id `lease_id(random, slot)`. Returns the decision's outcome over every slot and the lease when
/// granted. The table store writes the slot in the caller's transaction (a ROLLBACK releases it) and never
/// waits for another transaction's slot; the memory store swaps one slot at a time. Counted in the
/// statistics like a take of one token. Under an adaptive policy (`limit`) only the slots below the key's
/// limit are tried.
pub fn acquire(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
    random: u64,
    limit: Option<&KeyLimit<'_>>,
) -> Result<(Outcome, Option<i64>), ErrorReport> {
    let (answer, lease) = with_store!(store, s => pipeline::single::acquire(&Seam { s, function }, target, random, limit))?;
    // counted like a take of one token, a block's refusal in `blocked` too
    apply(store, std::slice::from_ref(target), &[answer], &[1]);
    Ok((answer.outcome, lease))
}

/// Releases lease `lease` of the key of `target` (a concurrency policy's bucket,
/// [`pipeline::single::release`]): true if it was held and is now free; false if it had expired, was
/// released already, or is not this key's. The table store writes in the caller's transaction; the slot is
/// locked, read, and written only when released. Under an adaptive policy (`report`) the release adapts
/// the key's limit, locked after the slot.
pub fn release(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
    lease: i64,
    report: Option<&CallReport<'_>>,
) -> Result<bool, ErrorReport> {
    with_store!(store, s => pipeline::single::release(&Seam { s, function }, target, lease, report))
}

/// Blocks the key of `target` (a named policy's bucket) for `duration` µs from now, replacing any block it
/// had (see [`blocks`]); returns its block bucket afterwards. The table store writes in the caller's
/// transaction (25006 in a read-only one).
pub fn block(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
    duration: i64,
) -> Result<Outcome, ErrorReport> {
    with_store!(store, s => {
        s.ensure_here(function, std::slice::from_ref(target))?;
        // this backend's memory of the key's bucket would answer before the block is read
        short::forget(&target.namespace, target.key);
        blocks::block(s, function, target, duration)
    })
}

/// Lifts the block of the key of `target` and forgets its penalty box's count; true if it was blocked.
pub fn unblock(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
) -> Result<bool, ErrorReport> {
    with_store!(store, s => blocks::unblock(s, function, target))
}

/// Puts up to `tokens` back into the bucket of `target` (never above its capacity,
/// [`pipeline::single::refund`]); returns the bucket. Both stores lock, read and write it around the
/// model's refund arithmetic.
pub fn refund(
    function: &'static str,
    store: Store,
    target: &Target<'_>,
    tokens: i64,
) -> Result<Outcome, ErrorReport> {
    let answer =
        with_store!(store, s => pipeline::single::refund(&Seam { s, function }, target, tokens))?;
    remember(
        store,
        std::slice::from_ref(target),
        std::slice::from_ref(&answer),
    );
    Ok(answer.outcome)
}

/// Deletes the bucket (it is full again); true if it existed.
pub fn reset(
    function: &'static str,
    store: Store,
    namespace: &Namespace<'_>,
    key: &str,
) -> Result<bool, ErrorReport> {
    short::forget(namespace, key);
    with_store!(store, s => s.reset(function, namespace, key))
}

/// Deletes every bucket of the current database that is full now from both stores (the memory store when
/// it is available), losslessly, and frees the memory buckets of policies whose drop has committed;
/// returns how many buckets were deleted.
pub fn purge(function: &'static str) -> Result<i64, ErrorReport> {
    let mut purged = table::purge(function)?;
    purged += purge_memory_of_database(function, true)?;
    Ok(purged)
}

/// The tables of the table store the background worker purges in this database (see
/// [`table::purge_targets`]).
pub fn purge_table_targets(function: &'static str) -> Result<Vec<String>, ErrorReport> {
    table::purge_targets(function)
}

/// One span of the background worker's purge of `table`: at most `rows` rows read after `after`, the full
/// ones untouched for `idle_us` microseconds deleted (see [`table::purge_span`]).
pub fn purge_table_span(
    function: &'static str,
    table: &str,
    after: Option<&PurgePosition>,
    rows: i64,
    idle_us: i64,
) -> Result<PurgeSpan, ErrorReport> {
    table::purge_span(function, table, after, rows, idle_us)
}

/// Rows one transaction of the table store's purge reads (the background worker's, and
/// `rate_limit.purge_idle()`'s): the most a caller can wait for the purge is the time one such transaction
/// takes, a few milliseconds.
pub const PURGE_SPAN_ROWS: i64 = 1000;

/// One transaction of `rate_limit.purge_idle()`: a span of the state table ([`PURGE_SPAN_ROWS`] rows after
/// `after`, the full ones untouched for `idle_us` deleted) and, on the first span (`after` is `None`), the
/// memory store's full buckets of this database. 0A000 under Citus, where the state table's shards are
/// each node's background worker's to purge.
pub fn purge_idle_span(
    function: &'static str,
    after: Option<&PurgePosition>,
    idle_us: i64,
) -> Result<PurgeSpan, ErrorReport> {
    if table::purge_targets(function)? != [table::STATE_TABLE] {
        return Err(ErrorReport::new(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "rate_limit.purge_idle() does not run on a distributed state table",
            function,
        )
        .set_hint(
            "Under Citus each node's background worker purges the shards it holds \
             (rate_limit.purge_interval); rate_limit.purge() deletes every full bucket at once.",
        ));
    }
    let memory = if after.is_none() {
        purge_memory_of_database(function, true)?
    } else {
        0
    };
    let mut span = table::purge_span(
        function,
        table::STATE_TABLE,
        after,
        PURGE_SPAN_ROWS,
        idle_us,
    )?;
    span.deleted = span.deleted.saturating_add(memory);
    Ok(span)
}

/// Frees the memory buckets of the current database's dropped policies (see [`dropped`]) and, when
/// `full_ones` or when a policy was dropped (the store is scanned then anyway), deletes its full ones;
/// returns how many. Nothing when the memory store is not available.
fn purge_memory_of_database(function: &'static str, full_ones: bool) -> Result<i64, ErrorReport> {
    if !memory::available() {
        return Ok(0);
    }
    let tags = dropped::take_dropped_policy_tags(function)?;
    if tags.is_empty() && !full_ones {
        return Ok(0);
    }
    memory::purge(
        function,
        memory::PurgeScope::CurrentDatabase {
            dropped_policies: &tags,
        },
    )
}

/// The background worker's round in one database for the memory store: frees the buckets of policies
/// whose drop has committed since the last round (the launcher's round deletes full buckets); returns how
/// many. The store is scanned only when a policy was dropped.
pub fn free_memory_of_dropped_policies(function: &'static str) -> Result<i64, ErrorReport> {
    purge_memory_of_database(function, false)
}

/// The background worker's round over the whole memory store: deletes the full buckets of every database
/// and every bucket of the `dropped` databases (OIDs); returns how many.
pub fn purge_memory_of_server(function: &'static str, dropped: &[u32]) -> Result<i64, ErrorReport> {
    memory::purge(function, memory::PurgeScope::Server { dropped })
}

/// Size and use of the memory store; 55000 when it is not available.
pub fn memory_usage(function: &'static str) -> Result<MemoryUsage, ErrorReport> {
    memory::usage(function)
}

/// The buckets each database holds in the memory store: (database OID, buckets), in OID order.
pub fn memory_shares(function: &'static str) -> Result<Vec<(u32, i64)>, ErrorReport> {
    memory::shares(function)
}

/// One bucket of the memory store, for `rate_limit.buckets`.
pub struct MemoryBucket {
    /// What kind of bucket.
    pub kind: Kind,
    /// The policy's name, for a policy bucket.
    pub policy: Option<String>,
    /// The key, or its first bytes followed by `…`.
    pub key: String,
    /// Tokens now, in millionths (rounded down).
    pub millionths: i64,
    /// The numbers the bucket was last written under.
    pub numbers: rate_limit_model::algorithm::Policy,
    /// Last update, in microseconds on the wall clock.
    pub updated_at: i64,
}

/// The memory store's buckets in this database (none when it is not available). A policy bucket is
/// named by its policy; buckets of policies that no longer exist are not listed (they wait to be freed).
pub fn memory_buckets(function: &'static str) -> Result<Vec<MemoryBucket>, ErrorReport> {
    let listed = memory::list();
    let names = if listed.iter().any(|l| l.kind == Kind::Policy) {
        dropped::live_policy_tags(function)?
    } else {
        Default::default()
    };
    Ok(listed
        .into_iter()
        .filter_map(|l| {
            let policy = match l.kind {
                Kind::Policy => Some(names.get(&l.policy_tag)?.clone()),
                Kind::AdHoc | Kind::Request => None,
            };
            Some(MemoryBucket {
                kind: l.kind,
                policy,
                key: l.key,
                millionths: l.millionths,
                numbers: l.numbers,
                updated_at: l.updated_at,
            })
        })
        .collect())
}
