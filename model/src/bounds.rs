//! The bounds of everything a caller can make the server hold, in one place: the table that
//! `docs/security.md` prints (a test checks that it prints exactly this), and the arithmetic of the one
//! bound a policy's numbers set — how long a bucket of it can stay short of full.
//!
//! The extension enforces these through `src/bounds.rs` (caller-chosen limits, named policies, waits); the
//! stores enforce their own counts (shares of the memory store, lease slots) and every row lock follows
//! the seam's one lock order.

use crate::algorithm::{Algorithm, Policy};

/// One resource a caller can make the server hold, as `docs/security.md` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// What is held.
    pub resource: &'static str,
    /// Who can make the server hold it.
    pub who: &'static str,
    /// Its bound, in time and in count.
    pub bound: &'static str,
    /// What enforces the bound.
    pub enforced_by: &'static str,
    /// The tests that prove it (`file.rs: function`, several as `file.rs: f, g; other.rs: h`).
    pub test: &'static str,
}

/// Every resource a caller can make the server hold. A new kind of limit that holds something new adds a
/// row here (and the docs follow: `docs_list_every_bound` fails until they do).
pub const BOUNDS: &[Bound] = &[
    Bound {
        resource: "memory-store bucket",
        who: "any role (every call that takes, charges, acquires or is denied under a penalty box)",
        bound: "its login role's share of each partition over every database (`rate_limit.role_share`, 50%) and its database's (`rate_limit.database_share`, 50%); 53200 or the role's own oldest evicted when full, a full bucket of anyone when the partition is; purged once full",
        enforced_by: "the memory store's shares (`rate_limit_model::shares`, `src/store/memory`)",
        test: "shares.rs: a_role_flooding_from_five_databases_leaves_a_victim_role_in_a_sixth_exact",
    },
    Bound {
        resource: "table-store row",
        who: "any role (the same calls)",
        bound: "deleted by the purge once full; every bucket a role can make is full within `rate_limit.max_refill_time` (limits it chooses) or `rate_limit.max_policy_refill_time` (named policies) after its last call",
        enforced_by: "`bounds::caller_limit`, `bounds::policy`",
        test: "shares.rs: limits_that_refill_slower_than_max_refill_time_are_the_owners_alone",
    },
    Bound {
        resource: "debt",
        who: "any role (`charge`)",
        bound: "the policy's `max_debt`; refilled within `rate_limit.max_policy_refill_time`",
        enforced_by: "`bounds::policy` (at `create_policy` / `alter_policy`)",
        test: "policies.rs: policies_whose_buckets_stay_short_too_long_are_refused",
    },
    Bound {
        resource: "block (penalty box)",
        who: "any role that can drain a key (by being denied)",
        bound: "`block_for`, at most `rate_limit.max_policy_refill_time`; not extended by further denials; blocks by hand are the owner's (up to 100 years)",
        enforced_by: "`bounds::policy`",
        test: "policies.rs: policies_whose_buckets_stay_short_too_long_are_refused",
    },
    Bound {
        resource: "lease, memory store",
        who: "any role (`acquire`)",
        bound: "`per` after its acquire, whatever its holder does; at most 1000 per key",
        enforced_by: "the model's lease slots",
        test: "leases.rs: expired_leases_are_reclaimed_in_the_memory_store",
    },
    Bound {
        resource: "lease, table store",
        who: "any role (`acquire`)",
        bound: "`per` after its acquire, or the end of its transaction if that is later (a ROLLBACK frees it at once); any role may lift its own `idle_in_transaction_session_timeout`, so concurrency policies that untrusted roles call belong in the memory store",
        enforced_by: "the table store's lease rows (`src/store/table/leases.rs`)",
        test: "leases.rs: a_table_store_lease_lasts_until_per_or_its_transaction_ends",
    },
    Bound {
        resource: "reservation",
        who: "any role (`reserve`, `reserve_many`)",
        bound: "`hold` after its reserve (at most 1 day, 22023 beyond), whatever its holder does: then settled at its estimate (its tokens stay taken, as a `take` of them would) and its bucket full, so purged; one bucket beside its key's (one per policy of a `reserve_many`, at most 16), counted in the role's shares in the memory store like any other; a settle gives back at most what its own reservation took, once, and needs its id (62 random bits); the memory store's settles wait in the caller's own backend until its transaction ends; `amounts` are weighed in the caller's own backend against the policy's meters (at most 16, the owner's), and a meter the policy does not have is refused, never counted as 0",
        enforced_by: "the model's reservation buckets (`rate_limit_model::algorithm::reservation`), `src/store/settles.rs`",
        test: "reservations.rs: a_plain_role_settles_its_own_reservation_once_and_no_other; meters.rs: every_misuse_of_meters_and_amounts_gets_its_sqlstate; reservations_many.rs: every_misuse_of_reservations_over_several_policies_gets_its_sqlstate",
    },
    Bound {
        resource: "a parent's bucket of a key (parent policies)",
        who: "any role calling a child policy (`take`, `take_many`, `reserve`, `charge` and the others that count the parent)",
        bound: "one more bucket per policy a call names, the parent's of the same key (at most 16 in one call, 22023 beyond), purged once full and counted in the role's shares in the memory store like any other; a child's calls never take more from the pool than it holds nor more than the child's own numbers allow; one level and at most 16 children per parent, both the owner's (`create_policy`, `alter_policy`), who alone can name or change a parent",
        enforced_by: "`src/policies/family.rs` (at `create_policy` / `alter_policy`), `src/api/family.rs`",
        test: "hierarchy.rs: every_misuse_of_a_parent_gets_its_sqlstate, a_parent_grants_exactly_its_burst_to_children_under_16_connections",
    },
    Bound {
        resource: "booking",
        who: "any role (`book`)",
        bound: "how far ahead a key's tokens can be booked is its policy's `max_debt` (the owner's; 0, the default, books only what the bucket holds) and the caller's `max_delay` (at most 1 day, 22023 beyond): a role books no more of a key than a `charge` could take from it; a booking for later is one bucket beside its key's, held until its time and then full, so purged, counted in the role's shares in the memory store like any other; a cancel needs its id (62 random bits), gives back at most its own booking's tokens, once, and only when nothing was booked after them",
        enforced_by: "the model's booking (`rate_limit_model::algorithm::booking`), its records as reservation buckets",
        test: "bookings.rs: a_plain_role_books_and_cancels_its_own_and_nothing_else",
    },
    Bound {
        resource: "lock of a new lease slot",
        who: "any role (`acquire`, table store)",
        bound: "until its transaction ends; only tried, never waited for; in a lock namespace no SQL function reaches",
        enforced_by: "`src/store/table/leases.rs`",
        test: "leases.rs: advisory_locks_cannot_squat_a_keys_leases",
    },
    Bound {
        resource: "adaptive limit of a key",
        who: "any role (`release` of a lease it holds, adaptive concurrency policies)",
        bound: "one bucket beside the key's lease slots; a report moves it once per call: up by 1/limit, or down to 9/10 at most once per round and never below the policy's `adaptive_min` (the owner's); forgotten (full, so purged) one lease TTL (`per`) after its last cut; only the holder of a lease (its id) can report on it, and a role that may acquire a key's leases can lower its limit as it can hold them all",
        enforced_by: "the model's adaptive limit (`rate_limit_model::algorithm::adaptive`)",
        test: "adaptive.rs: reports_move_the_limit_exactly_and_an_idle_limit_is_forgotten, a_login_role_reports_only_on_leases_it_holds",
    },
    Bound {
        resource: "sleep, snapshot and lock of `wait`",
        who: "any role (`wait`)",
        bound: "`rate_limit.max_wait` (30 s) per statement, however many waits it chains",
        enforced_by: "`bounds::wait_deadline`",
        test: "policies.rs: waits_chained_in_one_statement_share_max_wait",
    },
    Bound {
        resource: "row locks of a call",
        who: "any role",
        bound: "until the caller's transaction ends (table store): another caller of that key waits for it, as for any row lock, so a transaction any role leaves open holds the key until it ends (any role may lift its own `idle_in_transaction_session_timeout`: keys that untrusted roles share belong in the memory store); taken in the seam's one lock order, so two callers of a key never deadlock",
        enforced_by: "the lock order (`rate_limit_model::pipeline`, whose property tests check the locks of every generated call; the table store's in `src/store/mod.rs`)",
        test: "blocks.rs: two_callers_of_one_key_never_deadlock_under_a_penalty_box",
    },
    Bound {
        resource: "a batch (`take_batch`)",
        who: "any role",
        bound: "at most 1 000 000 keys a call (22023; its outcomes stay in the caller's own memory until the rows are returned, and its result rows in memory up to 64 MB or `work_mem` if larger, beyond which they spill to a temporary file), with a check for a cancel or `statement_timeout` between keys; the memory store holds one partition's lock at a time, shared, for at most 64 keys (a few microseconds; a take holds it for one), and counts new buckets in the caller's shares; the table store locks every row the batch names (granted or denied) until the caller's transaction ends, in the seam's key order, so batches and single calls never deadlock (row locks: see above); all or nothing: at most 16 keys",
        enforced_by: "`bounds::batch_size`, `bounds::batch_result_kb` (`src/bounds.rs`), `store::take_each` (`src/store/batch.rs`)",
        test: "batch.rs: sixteen_concurrent_batches_grant_each_key_exactly_its_burst_in_the_table_store",
    },
    Bound {
        resource: "Citus shard metadata lock (`ShareLock`)",
        who: "any role calling the table store under Citus, on the key's node",
        bound: "until the caller's transaction ends, as Citus's own writes hold it; it conflicts only with a shard move's or split's `ExclusiveLock`, which waits for it, and that shard's calls then queue behind the waiting move: a transaction any role leaves open delays a move and, while the move waits, that shard's calls (as an open transaction that wrote through Citus would; the operator bounds the move with `lock_timeout`); taken first in the lock order",
        enforced_by: "`src/cluster/shards.rs`, the lock order (`src/store/mod.rs`)",
        test: "citus.rs: a_shard_moved_under_load_conserves_table_buckets_with_writes_blocked",
    },
    Bound {
        resource: "the background worker's time",
        who: "any role (the buckets it makes)",
        bound: "each database's purge waits at most 1 s for a lock, and never for a row a caller holds (`SKIP LOCKED`)",
        enforced_by: "`src/worker.rs`",
        test: "worker.rs: a_purge_that_cannot_lock_the_table_is_logged_and_retried",
    },
    Bound {
        resource: "rows the background worker locks (callers wait for them)",
        who: "the worker, in every database",
        bound: "a purge transaction reads at most 1000 rows in the primary key's order and deletes the full ones untouched for a purge interval: a caller waits at most that one short transaction, and a bucket in use is never deleted and inserted again",
        enforced_by: "`src/worker.rs`, `src/store/table/purge.rs`",
        test: "worker.rs: a_bucket_in_use_keeps_its_row_and_each_purge_transaction_reads_one_span",
    },
    Bound {
        resource: "other backends' caches (a change they must see)",
        who: "the owner only: changes of `rate_limit.policies` and `rate_limit.key_overrides`; the trigger function that tells the other backends is not executable by PUBLIC and fires on no other table",
        bound: "a policy change: each backend reads that policy again; an override change: each backend forgets only which policies have overrides (one row read per policy it calls) and rebuilds one relation's cache entry, once per changing transaction, whatever the number of overrides; nothing per key is kept in a backend",
        enforced_by: "`rate_limit.policies_changed` (`src/api/policies.rs`), `src/policies/overrides`",
        test: "misuse.rs: no_other_role_can_make_backends_forget_their_policies",
    },
    Bound {
        resource: "the filter of overridden keys",
        who: "the owner only (every override written sets its key's bits)",
        bound: "`rate_limit.override_filter_mb` of shared memory (4 MB), fixed at server start; bits are never cleared until a restart, so false positives only cost a read",
        enforced_by: "`src/policies/overrides/filter.rs`",
        test: "overrides.rs: a_call_reads_its_own_keys_override_and_a_change_costs_others_no_reread",
    },
    Bound {
        resource: "router deadline (a timer)",
        who: "any role (every forwarded call arms one; `rate_limit_router.arm_deadline` is PUBLIC)",
        bound: "ends with the forwarding function's block, or the savepoint or transaction that armed it, whichever way it ends: never past COMMIT, ROLLBACK or DISCARD ALL",
        enforced_by: "`src/cluster/router.rs` (transaction callbacks)",
        test: "plproxy.rs: the_deadline_never_outlives_the_call_or_transaction_that_armed_it",
    },
    Bound {
        resource: "a forwarded call on its partition (its locks, its wait)",
        who: "any role calling through the PL/Proxy router",
        bound: "the router's `timeout` on the router; on the partition, half of it waiting for a row lock and three quarters in all (`lock_timeout`, `statement_timeout` in the connection's options, which no role's own settings outrank); a call waiting for a locked key ends with 55P03, never an allowed answer",
        enforced_by: "`router/plproxy.sql` (`partition_connection`, `forwarding_failed`)",
        test: "plproxy.rs: a_key_held_on_its_partition_is_never_allowed_and_is_given_up_there_too",
    },
    Bound {
        resource: "connection from the router to a partition",
        who: "any role calling through the PL/Proxy router",
        bound: "one per router backend and partition (PL/Proxy's), as the calling role, so within the partition's `max_connections` and the role's connection limit; closed after `connection_lifetime` (30 min) or when it breaks",
        enforced_by: "PL/Proxy, `create_router`'s cluster options",
        test: "plproxy.rs: a_login_only_role_takes_through_the_router_and_is_refused_the_owners_calls",
    },
    Bound {
        resource: "`rate_limit_router.allowed_while_down` (a counter)",
        who: "any role (each caller of a fail_open router counts its own allowed calls: `nextval`)",
        bound: "a count for the operator, not a control: a role can make it larger, not reset it (UPDATE is the owner's)",
        enforced_by: "`router/plproxy.sql` (the sequence's grants)",
        test: "plproxy.rs: router_functions_ignore_every_look_alike_on_the_search_path",
    },
];

impl Policy {
    /// The longest a bucket of this policy can stay short of full after a call: from the worst state any
    /// caller can leave it in — emptied and then charged down to `max_debt` tokens of debt (a lease slot:
    /// taken) — until it is full again, if nobody calls. The purge can delete a bucket only once it is full,
    /// so this is how long a role's bucket can outlive its last call.
    pub fn longest_short_us(&self, max_debt: i64) -> i64 {
        let worst = match self.algorithm() {
            Algorithm::TokenBucket
            | Algorithm::FixedWindow
            | Algorithm::SlidingWindow
            | Algorithm::CalendarWindow => self.charge(
                self.full(0),
                0,
                self.burst().saturating_add(max_debt),
                max_debt,
            ),
            // a slot holds a lease `per` after its acquire, a reservation's bucket its reservation `per`
            // after it was made, an adaptive limit is forgotten `per` after its last decrease; a block
            // bucket's own bound is its block
            Algorithm::Concurrency
            | Algorithm::Block
            | Algorithm::Reservation
            | Algorithm::AdaptiveLimit => {
                return self.period_us();
            }
        };
        worst.reset_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn the_longest_short_time_counts_the_deepest_debt() {
        // 1 token a second, burst 10: empty refills in 10 s, 5 tokens of debt add 5 s
        let p = Policy::new(Algorithm::TokenBucket, 1, S, 10).expect("policy");
        assert_eq!(p.longest_short_us(0), 10 * S);
        assert_eq!(p.longest_short_us(5), 15 * S);
        // the policy: a debt that takes 292,000 years
        let huge = 9_223_372_036_854;
        assert!(
            p.longest_short_us(huge) >= huge.saturating_mul(S),
            "{}",
            p.longest_short_us(huge)
        );
        // a fixed window restores everything at its end: one window at most
        let w = Policy::new(Algorithm::FixedWindow, 5, 60 * S, 5).expect("policy");
        assert_eq!(w.longest_short_us(0), 60 * S);
        assert_eq!(w.longest_short_us(1000), 60 * S);
        // a sliding window counts the previous window too: two at most
        let sw = Policy::new(Algorithm::SlidingWindow, 5, 60 * S, 5).expect("policy");
        assert!(sw.longest_short_us(0) <= 120 * S && sw.longest_short_us(0) > 60 * S);
        // leases: per
        let c = Policy::new(Algorithm::Concurrency, 4, 30 * S, 4).expect("policy");
        assert_eq!(c.longest_short_us(0), 30 * S);
    }

    /// Every row of the table, in order, is a row of docs/security.md's bounds table, and that table has no
    /// other row: the document and the code tell the same bounds.
    #[test]
    fn docs_list_every_bound() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/security.md"))
                .expect("docs/security.md");
        let start = doc
            .find("<!-- bounds: generated from model/src/bounds.rs -->")
            .expect("the bounds table's marker in docs/security.md");
        let rows: Vec<&str> = doc[start..]
            .lines()
            .skip(3) // the marker, the header, the separator
            .take_while(|l| l.starts_with('|'))
            .collect();
        let expected: Vec<String> = BOUNDS.iter().map(markdown_row).collect();
        assert_eq!(rows, expected, "docs/security.md's bounds table");
    }

    /// A row of the bounds table as docs/security.md prints it.
    fn markdown_row(b: &Bound) -> String {
        format!(
            "| {} | {} | {} | {} | {} |",
            b.resource, b.who, b.bound, b.enforced_by, b.test
        )
    }

    /// Every test a row names exists: a `fn` of that name in that file of the integration tests (a row
    /// names `file.rs: test, test; file.rs: test`).
    #[test]
    fn every_bound_names_a_test_that_exists() {
        for b in BOUNDS {
            for in_file in b.test.split("; ") {
                let (file, functions) = in_file.split_once(": ").expect("file.rs: function");
                let path = format!(
                    "{}/../tests/integration/tests/{file}",
                    env!("CARGO_MANIFEST_DIR")
                );
                let source = std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("{path}"));
                for function in functions.split(", ") {
                    assert!(
                        source.contains(&format!("fn {function}()")),
                        "{}: {file} has no test {function}",
                        b.resource
                    );
                }
            }
        }
    }
}
