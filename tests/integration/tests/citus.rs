//! rate_limit on a Citus cluster: a coordinator and two workers (`scripts/test.sh` starts them for
//! PostgreSQL 17, with Citus built from `../shared/vendor`), set up by `rate_limit.distribute()`.
//!
//! - `distribute` is idempotent, refuses on a worker, and delegates every keyed call;
//! - a key hammered from every node at once (top-level calls, calls in transaction blocks, calls from
//!   PL/pgSQL that Citus does not delegate) is exact: granted + tokens left = burst + rate × elapsed,
//!   within one token, in the table store, and in the memory store for the calls Citus delegates;
//! - a memory-store call that is not delegated to the key's node is refused with 0A000, and the bucket
//!   exists in exactly one node's memory;
//! - `take_many` over keys on both workers is all or nothing, and a ROLLBACK gives both back;
//! - a monthly calendar quota taken from every node grants exactly its rate, in both stores, and its window
//!   ends at the next first of the month in the policy's zone;
//! - leases of a concurrency policy acquired from every node are exactly the policy's, in both stores;
//! - reservations made on one node and settled from another account for every token, in both stores (a
//!   memory-store settle applied when its transaction commits on the key's node), and settle once;
//! - policies changed on the coordinator are used by the next call on every node;
//! - `limit_writes` on a table of the coordinator limits rows by keys that live on the workers, and on a
//!   distributed table colocated with the state table, written from every node;
//! - each node's background worker purges only the buckets of the shards it holds;
//! - a key hammered while its shard moves (writes blocked, or logical replication) conserves its tokens in
//!   the table store, and grants at most one burst more in the memory store; a call delegated inside a
//!   transaction block that arrives after its shard left fails with 40001 and takes nothing;
//! - `rate_limit.nodes_of` names the node Citus routes each key to, from any node, and the example clients
//!   of `examples/citus-routing/` send each call there.
//!
//! `RATE_LIMIT_TEST_CITUS_NODES` names the nodes, coordinator first, separated by `;` (each a connection
//! string with `host` and `port`, no database). `none` skips these tests: `scripts/test.sh` says so for every
//! PostgreSQL version but 17, and runs them in a step of their own for 17.

use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls};
use rate_limit_integration::{
    fresh_name, hammer_conserves_tokens_within, servers_or_skip, stores, Caller, StoppedServer,
};

const DATABASE: &str = "rl_citus";

/// How many functions of the SQL surface name one key, and so are delegated by it.
fn keyed_functions() -> usize {
    rate_limit_integration::surface::keyed_functions().count()
}

/// The nodes' connection strings (coordinator first), or `None` when this run skips Citus.
fn nodes() -> Option<Vec<String>> {
    servers_or_skip(
        "RATE_LIMIT_TEST_CITUS_NODES",
        "scripts/test.sh runs the Citus tests on 17",
    )
}

fn part<'a>(conninfo: &'a str, name: &str) -> &'a str {
    conninfo
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name}= missing from {conninfo}"))
}

fn connect(node: &str) -> Client {
    Client::connect(&format!("{node} dbname={DATABASE}"), NoTls).expect("connect to a Citus node")
}

/// The cluster, set up once per test run: a fresh database on every node with Citus, the workers added,
/// the extension created on the coordinator (Citus creates it on the workers) and distributed.
fn cluster() -> Option<&'static [String]> {
    static CLUSTER: OnceLock<Option<Vec<String>>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            let nodes = nodes()?;
            for node in &nodes {
                let mut admin =
                    Client::connect(&format!("{node} dbname=postgres"), NoTls).expect("connect");
                for statement in [
                    format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"),
                    format!("CREATE DATABASE {DATABASE}"),
                ] {
                    admin.batch_execute(&statement).expect("a fresh database");
                }
                connect(node)
                    .batch_execute("CREATE EXTENSION citus")
                    .expect("Citus in the database");
            }
            let mut coordinator = connect(&nodes[0]);
            let at = |n: &str| format!("'{}', {}", part(n, "host"), part(n, "port"));
            coordinator
                .batch_execute(&format!(
                    "SELECT citus_set_coordinator_host({})",
                    at(&nodes[0])
                ))
                .expect("the coordinator");
            for worker in &nodes[1..] {
                coordinator
                    .batch_execute(&format!("SELECT citus_add_node({})", at(worker)))
                    .expect("a worker");
            }
            coordinator
                .batch_execute("CREATE EXTENSION rate_limit")
                .expect("the extension, on every node");
            let steps = coordinator
                .query("SELECT object, action FROM rate_limit.distribute()", &[])
                .expect("distribute");
            assert_eq!(
                steps.len(),
                3 + keyed_functions(),
                "three tables and every keyed function"
            );
            Some(nodes)
        })
        .as_deref()
}

/// A key whose shard the worker `worker` (1 or 2) holds, with `prefix`.
fn key_on_worker(
    coordinator: &mut Client,
    nodes: &[String],
    worker: usize,
    prefix: &str,
) -> String {
    let port: i32 = part(&nodes[worker], "port").parse().expect("a port");
    (0..1000)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| {
            let p: i32 = coordinator
                .query_one(
                    "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) \
                     WHERE p.shardid = get_shard_id_for_distribution_column('rate_limit.bucket_state', $1::text)",
                    &[k],
                )
                .expect("placement")
                .get(0);
            p == port
        })
        .expect("a key on that worker")
}

/// How a hammering connection makes its calls.
#[derive(Clone, Copy, Debug)]
enum Way {
    /// `SELECT … FROM rate_limit.take(…)`, a statement of its own: Citus delegates it.
    TopLevel,
    /// The same inside `BEGIN … COMMIT`: delegated too (`force_delegation`).
    InTransaction,
    /// From a PL/pgSQL function: not delegated, it runs where it arrives.
    PlPgSql,
}

/// The numbers of the hammered policies: 20 tokens per second, burst 20, hammered for 3 seconds.
const RATE: u64 = 20;
const BURST: u64 = 20;
const SECONDS: u64 = 3;

/// Hammers `policy`/`key` (a new bucket, [`RATE`] and [`BURST`]) from `per_node` connections on every
/// node, each way of `ways` in turn, for [`SECONDS`], and checks that it conserves tokens.
fn hammer_is_exact(nodes: &[String], policy: &str, key: &str, ways: &[Way], per_node: usize) {
    let allowance = Allowance {
        burst: BURST,
        extra: 0,
        refusals: &[],
    };
    hammer_is_exact_within(nodes, policy, key, ways, per_node, &allowance);
}

/// What a hammering allows beyond [`hammer_is_exact`]'s defaults.
struct Allowance {
    /// The bucket's burst (the policy's), instead of [`BURST`].
    burst: u64,
    /// Tokens granted beyond conservation.
    extra: u64,
    /// Errors counted as a denial (a call racing a shard move: 40001 when it waited for the move, 0A000
    /// when a memory-store call reached the node its key just left), and retried in the final read (which
    /// can race the end of the move too: CI saw a coordinator's peek planned for worker 1 refused there
    /// with 0A000 as the move committed).
    refusals: &'static [SqlState],
}

/// [`hammer_is_exact`], with `allowance`.
fn hammer_is_exact_within(
    nodes: &[String],
    policy: &str,
    key: &str,
    ways: &[Way],
    per_node: usize,
    allowance: &Allowance,
) {
    let refusals = allowance.refusals;
    let caller = |i: usize| -> Caller {
        let node = nodes[i % nodes.len()].clone();
        let way = ways[(i / nodes.len()) % ways.len()];
        let (policy, key) = (policy.to_string(), key.to_string());
        let mut c = connect(&node);
        Box::new(move || {
            match way {
                Way::TopLevel => c
                    .query_one(
                        "SELECT allowed FROM rate_limit.take($1, $2)",
                        &[&policy, &key],
                    )
                    .map(|r| r.get(0)),
                Way::InTransaction => (|| {
                    let mut tx = c.transaction()?;
                    let r = tx.query_one(
                        "SELECT allowed FROM rate_limit.take($1, $2)",
                        &[&policy, &key],
                    )?;
                    tx.commit()?;
                    Ok(r.get(0))
                })(),
                Way::PlPgSql => c
                    .query_one("SELECT public.take_in_plpgsql($1, $2)", &[&policy, &key])
                    .map(|r| r.get(0)),
            }
            .or_else(|e| match e.code() {
                Some(code) if refusals.contains(code) => Ok(false),
                _ => Err(e),
            })
            .unwrap_or_else(|e| panic!("{way:?} on {node}: {e:?}"))
        })
    };
    hammer_conserves_tokens_within(
        &mut connect(&nodes[0]),
        (policy, key),
        (RATE, allowance.burst),
        SECONDS,
        nodes.len() * per_node,
        caller,
        (allowance.extra, allowance.refusals),
    );
}

const HELPER: &str = "CREATE OR REPLACE FUNCTION public.take_in_plpgsql(policy text, key text)
     RETURNS boolean LANGUAGE plpgsql AS $$
     BEGIN RETURN (SELECT d.allowed FROM rate_limit.take(policy, key) AS d); END $$";

#[test]
fn distribute_is_idempotent_refused_on_a_worker_and_delegates_every_keyed_call() {
    let Some(nodes) = cluster() else { return };
    let mut coordinator = connect(&nodes[0]);
    let again: Vec<String> = coordinator
        .query("SELECT action FROM rate_limit.distribute()", &[])
        .expect("distribute again")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(again.len(), 3 + keyed_functions());
    assert!(again.iter().all(|a| a.starts_with("already")), "{again:?}");
    let delegated: i64 = coordinator
        .query_one(
            "SELECT count(*) FROM pg_dist_object WHERE classid = 'pg_proc'::regclass \
             AND distribution_argument_index IS NOT NULL AND force_delegation",
            &[],
        )
        .expect("count")
        .get(0);
    assert_eq!(delegated, i64::try_from(keyed_functions()).expect("a few"));
    let mut worker = connect(&nodes[1]);
    let e = worker
        .query("SELECT * FROM rate_limit.distribute()", &[])
        .expect_err("a worker is not the coordinator");
    assert_eq!(e.code(), Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE));
    let e = coordinator
        .query("SELECT * FROM rate_limit.distribute(7)", &[])
        .expect_err("another shard count");
    assert_eq!(e.code(), Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE));
}

#[test]
fn a_key_hammered_from_every_node_is_exact_in_the_table_store() {
    let Some(nodes) = cluster() else { return };
    let mut coordinator = connect(&nodes[0]);
    coordinator
        .batch_execute(&format!(
            "SELECT rate_limit.create_policy('hot_table', 20, '1 second', burst => 20); {HELPER}"
        ))
        .expect("policy and helper");
    let ways = [Way::TopLevel, Way::InTransaction, Way::PlPgSql];
    hammer_is_exact(nodes, "hot_table", &fresh_name("t"), &ways, 3);
}

#[test]
fn the_memory_store_keeps_one_bucket_on_the_keys_node() {
    let Some(nodes) = cluster() else { return };
    let mut coordinator = connect(&nodes[0]);
    coordinator
        .batch_execute(&format!(
            "SELECT rate_limit.create_policy('hot_memory', 20, '1 second', burst => 20, store => 'memory'); \
             {HELPER}"
        ))
        .expect("policy and helper");
    let key = key_on_worker(&mut coordinator, nodes, 2, &fresh_name("m"));
    // delegated calls from every node are exact
    let ways = [Way::TopLevel, Way::InTransaction];
    hammer_is_exact(nodes, "hot_memory", &key, &ways, 3);
    // a call Citus does not delegate is refused on the other nodes, answered on the key's node
    for (i, node) in nodes.iter().enumerate() {
        let result =
            connect(node).query_one("SELECT public.take_in_plpgsql('hot_memory', $1)", &[&key]);
        if i == 2 {
            result.expect("the key's own node serves it");
        } else {
            let e = result.expect_err("another node refuses");
            assert_eq!(e.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{e:?}");
            let message = e
                .as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_default();
            assert!(message.contains("lives on node"), "{message}");
        }
    }
    // the bucket exists in exactly one node's memory
    let holders: Vec<usize> = nodes
        .iter()
        .enumerate()
        .filter(|(_, node)| {
            connect(node)
                .query_one(
                    "SELECT count(*) FROM rate_limit.node_memory_buckets() WHERE key = $1",
                    &[&key],
                )
                .expect("buckets")
                .get::<_, i64>(0)
                == 1
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(holders, vec![2]);
}

#[test]
fn the_coordinators_views_merge_every_nodes_statistics_metrics_and_memory_buckets() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    let policy = fresh_name("merged");
    c.query(
        "SELECT rate_limit.create_policy($1, 1, '80 days', burst => 2, store => 'memory')",
        &[&policy],
    )
    .expect("policy");
    let a = key_on_worker(&mut c, nodes, 1, &fresh_name("a"));
    let b = key_on_worker(&mut c, nodes, 2, &fresh_name("b"));
    // delegated: counted on the keys' nodes; a: 2 granted, 3 denied; b: 2 granted, 2 denied
    for (key, calls) in [(&a, 5), (&b, 4)] {
        for _ in 0..calls {
            c.query("SELECT * FROM rate_limit.take($1, $2)", &[&policy, key])
                .expect("take");
        }
    }
    let stats =
        "SELECT calls, granted, denied, tokens_granted FROM rate_limit.stats WHERE policy = $1";
    let node_stats =
        "SELECT calls, granted, denied, tokens_granted FROM rate_limit.node_stats_rows() \
                      WHERE policy = $1";
    let figures = |c: &mut Client, q: &str| -> Option<(i64, i64, i64, i64)> {
        c.query_opt(q, &[&policy])
            .expect("statistics")
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    };
    // each node's own figures, and the coordinator's view: their sum
    let mine: Vec<_> = nodes
        .iter()
        .map(|n| figures(&mut connect(n), node_stats))
        .collect();
    assert_eq!(mine, vec![None, Some((5, 2, 3, 2)), Some((4, 2, 2, 2))]);
    assert_eq!(figures(&mut c, stats), Some((9, 4, 5, 4)));
    // a worker's view is its own
    assert_eq!(figures(&mut connect(&nodes[1]), stats), Some((5, 2, 3, 2)));
    // the monitoring view (what Prometheus reads on the coordinator) sums them the same way
    let metrics = "SELECT calls, granted, denied, tokens_granted FROM rate_limit.metrics \
                   WHERE policy = $1 AND shadow_denied = 0 AND blocked = 0";
    assert_eq!(figures(&mut c, metrics), Some((9, 4, 5, 4)));
    assert_eq!(
        figures(&mut connect(&nodes[2]), metrics),
        Some((4, 2, 2, 2))
    );

    // the workers' backends that ran the delegated calls hand their last denials to the summary when
    // they exit (or at a later transaction): end the session, whose worker connections they serve
    drop(c);
    let mut c = connect(&nodes[0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while c
        .query_one(
            "SELECT count(*) FROM rate_limit.top_limited WHERE policy = $1",
            &[&policy],
        )
        .expect("top limited")
        .get::<_, i64>(0)
        < 2
        && Instant::now() < deadline
    {
        thread::sleep(Duration::from_millis(50));
    }
    let top: Vec<(i32, String, i64, i64)> = c
        .query(
            "SELECT rank, key, denials, denials_min FROM rate_limit.top_limited WHERE policy = $1 \
             ORDER BY rank",
            &[&policy],
        )
        .expect("top limited")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(top, vec![(1, a.clone(), 3, 3), (2, b.clone(), 2, 2)]);

    // every node's memory buckets, each once (a key's bucket lives on its node)
    let buckets: Vec<String> = c
        .query(
            "SELECT key FROM rate_limit.buckets WHERE store = 'memory' AND policy = $1 ORDER BY key",
            &[&policy],
        )
        .expect("buckets")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut want = vec![a, b];
    want.sort();
    assert_eq!(buckets, want);
}

#[test]
fn a_worker_down_fails_its_keys_with_class_08_and_spares_the_others() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    let policy = fresh_name("down");
    c.query(
        "SELECT rate_limit.create_policy($1, 1, '80 days', burst => 5)",
        &[&policy],
    )
    .expect("policy");
    let up = key_on_worker(&mut c, nodes, 1, &fresh_name("up"));
    let down = key_on_worker(&mut c, nodes, 2, &fresh_name("down"));
    let take = |c: &mut Client, key: &str| {
        c.query_one(
            "SELECT allowed FROM rate_limit.take($1, $2)",
            &[&policy, &key],
        )
        .map(|r| r.get::<_, bool>(0))
    };
    assert!(take(&mut c, &down).expect("worker 2 up"));
    {
        let _down = StoppedServer::stop(
            "RATE_LIMIT_TEST_CITUS_WORKER2_STOP",
            "RATE_LIMIT_TEST_CITUS_WORKER2_START",
        );
        let mut c = connect(&nodes[0]);
        // the key on the stopped worker: Citus's connection error, class 08; never an "allowed"
        let e = take(&mut c, &down).expect_err("its node is down");
        let code = e.code().map(|s| s.code().to_string()).unwrap_or_default();
        assert!(code.starts_with("08"), "{e:?}");
        // keys on the other worker are served as before
        for _ in 0..3 {
            assert!(take(&mut c, &up).expect("worker 1 serves its keys"));
        }
        // the merged views refuse rather than under-count; the node's own figures still answer
        let e = c
            .query("SELECT * FROM rate_limit.stats", &[])
            .expect_err("a node is missing");
        assert_eq!(e.code(), Some(&SqlState::CONNECTION_FAILURE), "{e:?}");
        c.query("SELECT * FROM rate_limit.node_stats_rows()", &[])
            .expect("this node's own");
    }
    // back: the key's bucket kept its state (one token taken before the stop)
    let mut c = connect(&nodes[0]);
    let remaining: i64 = c
        .query_one(
            "SELECT remaining FROM rate_limit.peek($1, $2)",
            &[&policy, &down],
        )
        .expect("worker 2 back")
        .get(0);
    assert_eq!(remaining, 4);
}

/// A calendar quota taken from every node: exactly its rate is granted, in both stores, and its window ends
/// at the next first of the month in the policy's zone, as the worker that holds the key computes it.
#[test]
fn a_monthly_quota_taken_from_every_node_grants_its_rate_once() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    for store in stores() {
        let policy = fresh_name(&format!("month_{store}"));
        c.execute(
            "SELECT rate_limit.create_policy($1, 5, '1 month', algorithm => 'calendar_window', \
               time_zone => 'America/Sao_Paulo', store => $2)",
            &[&policy, &store],
        )
        .expect("policy");
        let key = key_on_worker(&mut c, nodes, 1, &fresh_name("tenant"));
        let granted = (0..9)
            .filter(|i| {
                connect(&nodes[i % nodes.len()])
                    .query_one(
                        "SELECT allowed FROM rate_limit.take($1, $2)",
                        &[&policy, &key],
                    )
                    .expect("take")
                    .get::<_, bool>(0)
            })
            .count();
        assert_eq!(
            granted, 5,
            "{store}: a quota of 5, asked 9 times from three nodes"
        );
        let ends_at_the_first: bool = connect(&nodes[2])
            .query_one(
                "SELECT abs(extract(epoch FROM clock_timestamp() + d.retry_after - \
                   (date_trunc('month', clock_timestamp() AT TIME ZONE 'America/Sao_Paulo') + interval '1 month') \
                   AT TIME ZONE 'America/Sao_Paulo')) < 1 \
                 FROM rate_limit.take($1, $2) AS d",
                &[&policy, &key],
            )
            .expect("take")
            .get(0);
        assert!(
            ends_at_the_first,
            "{store}: denied until the first of next month in São Paulo"
        );
    }
}

/// Leases of a concurrency policy acquired from every node: exactly its 3 leases are granted, in both
/// stores, and a release from another node frees one.
#[test]
fn leases_acquired_from_every_node_are_exactly_the_policys() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    for store in stores() {
        let policy = fresh_name(&format!("jobs_{store}"));
        c.execute(
            "SELECT rate_limit.create_policy($1, 3, '1 hour', algorithm => 'concurrency', store => $2)",
            &[&policy, &store],
        )
        .expect("policy");
        let key = key_on_worker(&mut c, nodes, 2, &fresh_name("tenant"));
        let leases: Vec<i64> = (0..7)
            .filter_map(|i| {
                connect(&nodes[i % nodes.len()])
                    .query_one(
                        "SELECT lease FROM rate_limit.acquire($1, $2)",
                        &[&policy, &key],
                    )
                    .expect("acquire")
                    .get::<_, Option<i64>>(0)
            })
            .collect();
        assert_eq!(
            leases.len(),
            3,
            "{store}: 3 leases, asked 7 times from three nodes"
        );
        let released: bool = connect(&nodes[1])
            .query_one(
                "SELECT rate_limit.release($1, $2, $3)",
                &[&policy, &key, &leases[0]],
            )
            .expect("release")
            .get(0);
        assert!(released, "{store}");
        let again: bool = connect(&nodes[0])
            .query_one(
                "SELECT allowed FROM rate_limit.acquire($1, $2)",
                &[&policy, &key],
            )
            .expect("acquire")
            .get(0);
        assert!(again, "{store}: the released lease is free again");
    }
}

/// A reservation made on one node and settled from another (each call delegated to the key's node, where
/// a memory-store settle waits for its transaction's commit there), in both stores: every token accounted
/// for, a settle repeated from a third node settles nothing, and one inside a transaction block is applied
/// when it commits.
#[test]
fn reservations_made_and_settled_from_every_node_account_for_every_token() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    for store in stores() {
        let policy = fresh_name(&format!("llm_{store}"));
        c.execute(
            "SELECT rate_limit.create_policy($1, 1000, '1 day', store => $2)",
            &[&policy, &store],
        )
        .expect("policy");
        let key = key_on_worker(&mut c, nodes, 2, &fresh_name("tenant"));
        let n = nodes.len();
        for i in 0..n {
            let id: i64 = connect(&nodes[i])
                .query_one(
                    "SELECT lease FROM rate_limit.reserve($1, $2, 30)",
                    &[&policy, &key],
                )
                .expect("reserve")
                .get::<_, Option<i64>>(0)
                .expect("granted");
            let mut settler = connect(&nodes[(i + 1) % n]);
            if i == 0 {
                settler.batch_execute("BEGIN").expect("begin");
            }
            let settled: bool = settler
                .query_one(
                    "SELECT allowed FROM rate_limit.settle($1, $2, $3, 10)",
                    &[&policy, &key, &id],
                )
                .expect("settle")
                .get(0);
            if i == 0 {
                settler.batch_execute("COMMIT").expect("commit");
            }
            assert!(settled, "{store}: settled from node {}", (i + 1) % n);
            let again: bool = connect(&nodes[(i + 2) % n])
                .query_one(
                    "SELECT allowed FROM rate_limit.settle($1, $2, $3, 0)",
                    &[&policy, &key, &id],
                )
                .expect("settle")
                .get(0);
            assert!(!again, "{store}: once");
        }
        let left: i64 = c
            .query_one(
                "SELECT remaining FROM rate_limit.peek($1, $2)",
                &[&policy, &key],
            )
            .expect("peek")
            .get(0);
        // 10 used of each 30 reserved, from every node (1 000 a day refills under 0.1 token in a test)
        assert_eq!(left, 1000 - 10 * n as i64, "{store}");
    }
}

/// Bookings of one key made from every node queue at its node (each call delegated there): their times are
/// one slot of the rate apart in the order made, and the last, cancelled from another node, gives its slot
/// back once; in both stores.
#[test]
fn bookings_from_every_node_queue_at_the_keys_node() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    for store in stores() {
        let policy = fresh_name(&format!("slots_{store}"));
        c.execute(
            "SELECT rate_limit.create_policy($1, 1, '1 hour', burst => 1, max_debt => 10, store => $2)",
            &[&policy, &store],
        )
        .expect("policy");
        let key = key_on_worker(&mut c, nodes, 2, &fresh_name("tenant"));
        let n = nodes.len();
        let mut made: Vec<(f64, Option<i64>)> = Vec::new();
        for i in 0..=n {
            let row = connect(&nodes[i % n])
                .query_one(
                    "SELECT allowed, extract(epoch FROM retry_after)::float8 / 60, lease \
                     FROM rate_limit.book($1, $2)",
                    &[&policy, &key],
                )
                .expect("book");
            assert!(row.get::<_, bool>(0), "{store}: booked from node {}", i % n);
            made.push((row.get(1), row.get(2)));
        }
        // the burst now, then an hour apart (in minutes: the clock moves a little between calls)
        let minutes: Vec<i64> = made.iter().map(|m| m.0.round() as i64).collect();
        let expected: Vec<i64> = (0..=n as i64).map(|i| 60 * i).collect();
        assert_eq!(minutes, expected, "{store}");
        let last = made[n].1.expect("an id");
        let cancel = |node: &str| -> bool {
            connect(node)
                .query_one(
                    "SELECT allowed FROM rate_limit.cancel_booking($1, $2, $3)",
                    &[&policy, &key, &last],
                )
                .expect("cancel")
                .get(0)
        };
        assert!(
            cancel(&nodes[1 % n]),
            "{store}: cancelled from another node"
        );
        assert!(!cancel(&nodes[0]), "{store}: once");
        let next: f64 = c
            .query_one(
                "SELECT extract(epoch FROM retry_after)::float8 / 60 FROM rate_limit.book($1, $2)",
                &[&policy, &key],
            )
            .expect("book")
            .get(0);
        assert_eq!(
            next.round() as i64,
            60 * n as i64,
            "{store}: the slot given back"
        );
    }
}

#[test]
fn take_many_over_both_workers_is_all_or_nothing() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    c.batch_execute("SELECT rate_limit.create_policy('pair', 1, '80 days', burst => 2)")
        .expect("policy");
    let a = key_on_worker(&mut c, nodes, 1, &fresh_name("a"));
    let b = key_on_worker(&mut c, nodes, 2, &fresh_name("b"));
    let take_both = |c: &mut Client| -> bool {
        c.query_one(
            "SELECT bool_and(allowed) FROM rate_limit.take_many(ARRAY['pair', 'pair'], ARRAY[$1, $2])",
            &[&a, &b],
        )
        .expect("take_many")
        .get(0)
    };
    let left = |c: &mut Client, k: &str| -> i64 {
        c.query_one("SELECT remaining FROM rate_limit.peek('pair', $1)", &[&k])
            .expect("peek")
            .get(0)
    };
    // rolled back: both buckets are full again
    c.batch_execute("BEGIN").expect("begin");
    assert!(take_both(&mut c));
    c.batch_execute("ROLLBACK").expect("rollback");
    assert_eq!((left(&mut c, &a), left(&mut c, &b)), (2, 2));
    // b drained by hand: the pair is denied and a keeps its tokens
    assert!(take_both(&mut c));
    c.query("SELECT * FROM rate_limit.take('pair', $1)", &[&b])
        .expect("drain b");
    assert_eq!((left(&mut c, &a), left(&mut c, &b)), (1, 0));
    assert!(!take_both(&mut c));
    assert_eq!((left(&mut c, &a), left(&mut c, &b)), (1, 0));
}

/// A parent and two children made on the coordinator, in each store: connections on every node calling
/// the children of one key (on a worker) are granted exactly the parent's burst between them, none of
/// the children more than its own.
#[test]
fn children_called_from_every_node_share_exactly_their_parents_burst() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    for store in ["table", "memory"] {
        let (pool, kids) = (
            format!("pool_{store}"),
            [format!("kid_a_{store}"), format!("kid_b_{store}")],
        );
        c.execute(
            "SELECT rate_limit.create_policy($1, 10, '80 days', store => $2)",
            &[&pool, &store],
        )
        .expect("the parent");
        for kid in &kids {
            c.execute(
                "SELECT rate_limit.create_policy($1, 7, '80 days', store => $2, \
                 options => jsonb_build_object('parent', $3::text))",
                &[kid, &store, &pool],
            )
            .expect("a child");
        }
        let key = key_on_worker(&mut c, nodes, 1, &fresh_name("fam"));
        let handles: Vec<_> = (0..nodes.len() * 2)
            .map(|i| {
                let mut c = connect(&nodes[i % nodes.len()]);
                let (kid, key) = (kids[i % 2].clone(), key.clone());
                std::thread::spawn(move || {
                    let mut granted = 0i64;
                    for _ in 0..10 {
                        let allowed: bool = c
                            .query_one("SELECT allowed FROM rate_limit.take($1, $2)", &[&kid, &key])
                            .expect("take")
                            .get(0);
                        granted += i64::from(allowed);
                    }
                    (i % 2, granted)
                })
            })
            .collect();
        let mut by_kid = [0i64; 2];
        for h in handles {
            let (kid, granted) = h.join().expect("a connection");
            by_kid[kid] += granted;
        }
        assert_eq!(by_kid[0] + by_kid[1], 10, "{store}: {by_kid:?}");
        assert!(by_kid.iter().all(|&g| g <= 7), "{store}: {by_kid:?}");
    }
}

/// An override set on the coordinator (a reference table's row) is used at once by every node, for delegated
/// calls on the key's node and for calls that run where they arrive; cleared, the key follows its policy.
#[test]
fn an_override_set_on_the_coordinator_is_used_by_every_node_at_once() {
    let Some(nodes) = cluster() else { return };
    let mut coordinator = connect(&nodes[0]);
    let policy = fresh_name("overridden");
    coordinator
        .query(
            "SELECT rate_limit.create_policy($1, 1, '1 day')",
            &[&policy],
        )
        .expect("policy");
    let keys: Vec<String> = (1..=2)
        .map(|w| key_on_worker(&mut coordinator, nodes, w, &fresh_name("gold")))
        .collect();
    let mut sessions: Vec<Client> = nodes.iter().map(|n| connect(n)).collect();
    let limit = |c: &mut Client, k: &str| -> i64 {
        c.query_one(
            "SELECT \"limit\" FROM rate_limit.peek($1, $2)",
            &[&policy, &k],
        )
        .expect("peek")
        .get(0)
    };
    for s in sessions.iter_mut() {
        for k in &keys {
            assert_eq!(limit(s, k), 1); // read and cached by every node
        }
    }
    for k in &keys {
        coordinator
            .query(
                "SELECT rate_limit.set_override($1, $2, burst => 7)",
                &[&policy, k],
            )
            .expect("override");
    }
    for (i, s) in sessions.iter_mut().enumerate() {
        for k in &keys {
            assert_eq!(limit(s, k), 7, "node {i}");
        }
    }
    // 7 takes of each key from the coordinator, delegated to the key's node: exactly 7 granted
    for k in &keys {
        let granted: i64 = (0..9)
            .map(|_| {
                coordinator
                    .query_one("SELECT allowed FROM rate_limit.take($1, $2)", &[&policy, k])
                    .expect("take")
                    .get::<_, bool>(0) as i64
            })
            .sum();
        assert_eq!(granted, 7);
    }
    for k in &keys {
        let cleared: bool = coordinator
            .query_one("SELECT rate_limit.clear_override($1, $2)", &[&policy, k])
            .expect("clear")
            .get(0);
        assert!(cleared);
    }
    for (i, s) in sessions.iter_mut().enumerate() {
        for k in &keys {
            assert_eq!(limit(s, k), 1, "node {i}");
        }
    }
}

#[test]
fn policies_changed_on_the_coordinator_are_used_by_every_node_at_once() {
    let Some(nodes) = cluster() else { return };
    let mut coordinator = connect(&nodes[0]);
    coordinator
        .batch_execute(&format!(
            "SELECT rate_limit.create_policy('coherent', 5, '1 hour'); {HELPER}"
        ))
        .expect("policy");
    // every node has read (and cached) the policy
    let mut sessions: Vec<Client> = nodes.iter().map(|n| connect(n)).collect();
    let limit_seen = |c: &mut Client, k: &str| -> (i64, i64) {
        // two statements: Citus 14.0.1 crashes the backend on a delegated function in FROM with a
        // subquery in the select list, whatever the function (see docs/scaling.md)
        let limit = c
            .query_one(
                "SELECT \"limit\" FROM rate_limit.peek('coherent', $1)",
                &[&k],
            )
            .expect("peek")
            .get(0);
        let rate = c
            .query_one(
                "SELECT rate FROM rate_limit.policies WHERE name = 'coherent'",
                &[],
            )
            .expect("the node's copy of the policies")
            .get(0);
        (limit, rate)
    };
    for (i, s) in sessions.iter_mut().enumerate() {
        assert_eq!(limit_seen(s, &format!("c{i}")).0, 5);
    }
    coordinator
        .batch_execute("SELECT rate_limit.alter_policy('coherent', rate => 9, burst => 9)")
        .expect("alter");
    for (i, s) in sessions.iter_mut().enumerate() {
        assert_eq!(limit_seen(s, &format!("c{i}")), (9, 9), "node {i}");
        // not delegated: PL/pgSQL reads the node's own copy of the policies
        let allowed: bool = s
            .query_one(
                "SELECT public.take_in_plpgsql('coherent', $1)",
                &[&format!("c{i}")],
            )
            .expect("take")
            .get(0);
        assert!(allowed);
    }
    coordinator
        .batch_execute("SELECT rate_limit.drop_policy('coherent')")
        .expect("drop");
    for s in &mut sessions {
        let e = s
            .query("SELECT * FROM rate_limit.take('coherent', 'c')", &[])
            .expect_err("dropped everywhere");
        assert_eq!(e.code(), Some(&SqlState::UNDEFINED_OBJECT));
    }
}

/// Runs `statements` one at a time (Citus runs what it propagates to the shards as prepared statements,
/// one command each).
fn execute_each(c: &mut Client, statements: &[&str]) {
    for statement in statements {
        c.batch_execute(statement)
            .unwrap_or_else(|e| panic!("{statement}: {e:?}"));
    }
}

/// Inserts 10 rows per author from 4 connections to `node` into `table` (limited by `rows_per_author`,
/// 3 rows each), checking every refusal is 53400; returns the rows per author and the refusals.
fn insert_limited_rows(node: &str, table: &str, authors: &[String]) -> (Vec<i64>, usize) {
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let (node, table, authors) = (node.to_string(), table.to_string(), authors.to_vec());
            let refused = Arc::new(Mutex::new(0));
            let r = refused.clone();
            let h = thread::spawn(move || {
                let mut c = connect(&node);
                for i in 0..10 {
                    let author = &authors[i % authors.len()];
                    let insert = format!("INSERT INTO {table} (author) VALUES ($1)");
                    if let Err(e) = c.execute(&insert, &[author]) {
                        assert_eq!(
                            e.code(),
                            Some(&SqlState::CONFIGURATION_LIMIT_EXCEEDED),
                            "{e:?}"
                        );
                        *r.lock().expect("lock") += 1;
                    }
                }
            });
            (h, refused)
        })
        .collect();
    let mut refused = 0;
    for (h, r) in writers {
        h.join().expect("writer");
        refused += *r.lock().expect("lock");
    }
    let mut c = connect(node);
    let rows = authors
        .iter()
        .map(|author| {
            c.query_one(
                &format!("SELECT count(*) FROM {table} WHERE author = $1"),
                &[author],
            )
            .expect("count")
            .get(0)
        })
        .collect();
    (rows, refused)
}

#[test]
fn limit_writes_on_the_coordinator_limits_rows_by_keys_on_the_workers() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    c.batch_execute(
        "SELECT rate_limit.create_policy('rows_per_author', 3, '400 days');
         CREATE TABLE comments (id bigserial PRIMARY KEY, author text NOT NULL);
         CREATE TRIGGER comments_rate_limit BEFORE INSERT ON comments FOR EACH ROW
             EXECUTE FUNCTION rate_limit.limit_writes('rows_per_author', 'author');",
    )
    .expect("a local table with the trigger");
    let authors = [
        key_on_worker(&mut c, nodes, 1, &fresh_name("w1")),
        key_on_worker(&mut c, nodes, 2, &fresh_name("w2")),
    ];
    let (rows, refused) = insert_limited_rows(&nodes[0], "comments", &authors);
    assert_eq!(rows, [3, 3]);
    assert_eq!(refused, 40 - 6);
}

/// A distributed table colocated with the state table by its key column: the trigger runs on the node of
/// the row's shard, which holds the author's bucket too. Rows written from the coordinator and from both
/// workers at once (4 connections each) are limited exactly.
#[test]
fn limit_writes_on_a_distributed_table_colocated_by_key_is_exact_from_every_node() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    execute_each(
        &mut c,
        &[
            "SELECT rate_limit.create_policy('posts_per_author', 3, '400 days')",
            // the state table's key is COLLATE \"C\": a colocated column must be too
            "CREATE TABLE posts (author text COLLATE \"C\" NOT NULL, body text)",
            "SELECT create_distributed_table('posts', 'author', colocate_with => 'rate_limit.bucket_state')",
            "SET citus.enable_unsafe_triggers = on",
            "CREATE TRIGGER posts_rate_limit BEFORE INSERT ON posts FOR EACH ROW \
                 EXECUTE FUNCTION rate_limit.limit_writes('posts_per_author', 'author')",
        ],
    );
    let authors = [
        key_on_worker(&mut c, nodes, 1, &fresh_name("d1")),
        key_on_worker(&mut c, nodes, 2, &fresh_name("d2")),
    ];
    let writers: Vec<_> = nodes
        .iter()
        .map(|node| {
            let (node, authors) = (node.clone(), authors.to_vec());
            thread::spawn(move || insert_limited_rows(&node, "posts", &authors))
        })
        .collect();
    let mut refused = 0;
    for w in writers {
        refused += w.join().expect("a node's writers").1;
    }
    for author in &authors {
        let rows: i64 = c
            .query_one("SELECT count(*) FROM posts WHERE author = $1", &[author])
            .expect("count")
            .get(0);
        assert_eq!(rows, 3, "{author}");
    }
    assert_eq!(refused, 3 * 40 - 6);
}

/// A distributed table that is not colocated with the state table: a row whose bucket lives on another
/// node than the row's shard is refused with 0A000 and a hint (Citus itself would raise XX000); a row whose
/// bucket is on its shard's node is limited as usual.
#[test]
fn limit_writes_on_a_table_not_colocated_refuses_rows_whose_bucket_is_elsewhere() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    execute_each(
        &mut c,
        &[
            "SELECT rate_limit.create_policy('notes_per_author', 3, '400 days')",
            "CREATE TABLE notes (author text NOT NULL)",
            "SELECT create_distributed_table('notes', 'author', colocate_with => 'none', shard_count => 7)",
            "SET citus.enable_unsafe_triggers = on",
            "CREATE TRIGGER notes_rate_limit BEFORE INSERT ON notes FOR EACH ROW \
                 EXECUTE FUNCTION rate_limit.limit_writes('notes_per_author', 'author')",
        ],
    );
    let (mut refused_elsewhere, mut limited_here) = (0, 0);
    for i in 0..20 {
        let author = format!("{}{i}", fresh_name("n"));
        let mut inserted = 0;
        for _ in 0..4 {
            match c.execute("INSERT INTO notes VALUES ($1)", &[&author]) {
                Ok(_) => inserted += 1,
                Err(e) if e.code() == Some(&SqlState::FEATURE_NOT_SUPPORTED) => {
                    let db = e.as_db_error().expect("a server error");
                    assert!(
                        db.hint().is_some_and(|h| h.contains("colocate_with")),
                        "{db:?}"
                    );
                    refused_elsewhere += 1;
                }
                Err(e) => {
                    assert_eq!(
                        e.code(),
                        Some(&SqlState::CONFIGURATION_LIMIT_EXCEEDED),
                        "{e:?}"
                    );
                    limited_here += 1;
                }
            }
        }
        assert!(inserted == 0 || inserted == 3, "{author}: {inserted} rows");
    }
    assert!(
        refused_elsewhere > 0 && limited_here > 0,
        "{refused_elsewhere} {limited_here}"
    );
}

#[test]
fn each_nodes_worker_purges_only_the_shards_it_holds() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    // refills within a millisecond: full (and purgeable) at once
    c.batch_execute("SELECT rate_limit.create_policy('refills', 1000, '1 second', burst => 1)")
        .expect("policy");
    let on1 = key_on_worker(&mut c, nodes, 1, &fresh_name("p1"));
    let on2 = key_on_worker(&mut c, nodes, 2, &fresh_name("p2"));
    for k in [&on1, &on2] {
        c.query("SELECT * FROM rate_limit.take('refills', $1)", &[k])
            .expect("take");
    }
    let rows = |c: &mut Client, k: &str| -> i64 {
        c.query_one(
            "SELECT count(*) FROM rate_limit.bucket_state WHERE namespace = 'refills' AND key = $1",
            &[&k],
        )
        .expect("count")
        .get(0)
    };
    assert_eq!((rows(&mut c, &on1), rows(&mut c, &on2)), (1, 1));
    // only worker 1 purges, every second
    let mut w1 =
        Client::connect(&format!("{} dbname=postgres", nodes[1]), NoTls).expect("worker 1");
    for statement in [
        "ALTER SYSTEM SET rate_limit.purge_interval = 1",
        "SELECT pg_reload_conf()",
    ] {
        w1.batch_execute(statement).expect("turn the purge on");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while rows(&mut c, &on1) == 1 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    for statement in [
        "ALTER SYSTEM RESET rate_limit.purge_interval",
        "SELECT pg_reload_conf()",
    ] {
        w1.batch_execute(statement).expect("turn the purge off");
    }
    assert_eq!(rows(&mut c, &on1), 0, "worker 1 purged its own shard");
    assert_eq!(rows(&mut c, &on2), 1, "and left worker 2's alone");
    // the purge for pg_cron is each node's worker's here: refused on a distributed state table
    let e = c
        .batch_execute("CALL rate_limit.purge_idle('1 second')")
        .expect_err("purge_idle under Citus");
    assert_eq!(e.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{e:?}");
    assert_eq!(rows(&mut c, &on2), 1, "nothing deleted");
}

/// Moves the shard that holds `key` (and the shards colocated with it) to the worker at `to`, a connection
/// string, copying its rows while writes wait (`block_writes`: no logical replication needed).
fn move_shard_of(coordinator: &mut Client, key: &str, to: &str) {
    move_shard_by(coordinator, key, to, "block_writes");
}

/// [`move_shard_of`] in the transfer mode `mode`: `block_writes`, or `force_logical` (the rows copied while
/// writes go on, logical replication catching up, writes blocked only at the cutover).
fn move_shard_by(coordinator: &mut Client, key: &str, to: &str, mode: &str) {
    try_move_shard_by(coordinator, key, to, mode).expect("move the key's shard");
}

/// [`move_shard_by`], its error returned.
fn try_move_shard_by(
    coordinator: &mut Client,
    key: &str,
    to: &str,
    mode: &str,
) -> Result<(), postgres::Error> {
    coordinator
        .query(
            "SELECT citus_move_shard_placement(s.shardid, n.nodename, n.nodeport, $2, $3::int, \
                 shard_transfer_mode => $4::text::citus.shard_transfer_mode) \
             FROM (SELECT get_shard_id_for_distribution_column('rate_limit.bucket_state', $1::text) AS shardid) s \
             JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid)",
            &[&key, &part(to, "host"), &part(to, "port").parse::<i32>().expect("port"), &mode],
        )
        .map(drop)
}

/// The burst of a key hammered while its shard moves: 5 seconds of [`RATE`], longer than a move blocks its
/// writes here, so that the bucket never refills to its cap (where refill is rightly lost, and
/// conservation would not hold) while every caller waits for the cutover.
const MOVING_BURST: u64 = 5 * RATE;

/// Hammers a new key of worker 1 in `store` from every node (calls Citus delegates) while its shard moves
/// to worker 2 in `mode`, a second after the hammering starts; then moves it back. The table store
/// conserves tokens exactly across the move (its row moves with the shard, and its direct writes to the
/// shard wait for the cutover like Citus's own); the memory store within one more burst (a bucket starts
/// full on its new node), as docs/scaling.md says. A call that waited for the move's cutover on the old
/// node is refused with 40001 (retry), counted as denied.
fn hammer_while_the_shard_moves(nodes: &[String], store: &str, mode: &str) {
    let mut c = connect(&nodes[0]);
    c.batch_execute(HELPER).expect("helper");
    let policy = fresh_name(&format!("moving_{store}"));
    c.query(
        "SELECT rate_limit.create_policy($1, $2::int, '1 second', burst => $3::int, store => $4)",
        &[&policy, &(RATE as i32), &(MOVING_BURST as i32), &store],
    )
    .expect("policy");
    let key = key_on_worker(&mut c, nodes, 1, &fresh_name("mv"));
    let mover = {
        let (coordinator, key, to, mode) = (
            nodes[0].clone(),
            key.clone(),
            nodes[2].clone(),
            mode.to_string(),
        );
        thread::spawn(move || {
            thread::sleep(Duration::from_secs(1));
            let started = Instant::now();
            // the error, if any, is reported by the test's own thread (its message first in the output)
            try_move_shard_by(&mut connect(&coordinator), &key, &to, &mode)
                .map(|()| started.elapsed())
                .map_err(|e| format!("{e:?}"))
        })
    };
    let allowance = Allowance {
        burst: MOVING_BURST,
        extra: if store == "memory" { MOVING_BURST } else { 0 },
        refusals: if store == "memory" {
            &[
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::FEATURE_NOT_SUPPORTED,
            ]
        } else {
            &[SqlState::T_R_SERIALIZATION_FAILURE]
        },
    };
    let ways = [Way::TopLevel, Way::InTransaction];
    hammer_is_exact_within(nodes, &policy, &key, &ways, 3, &allowance);
    let took = mover
        .join()
        .expect("the mover thread")
        .unwrap_or_else(|e| panic!("the move under load failed ({mode}, {store} store): {e}"));
    assert!(
        took < Duration::from_secs(SECONDS),
        "the move ended under load: {took:?}"
    );
    move_shard_of(&mut c, &key, &nodes[1]);
}

#[test]
fn a_shard_moved_under_load_conserves_table_buckets_with_writes_blocked() {
    let Some(nodes) = cluster() else { return };
    hammer_while_the_shard_moves(nodes, "table", "block_writes");
}

#[test]
fn a_shard_moved_under_load_conserves_table_buckets_with_logical_replication() {
    let Some(nodes) = cluster() else { return };
    hammer_while_the_shard_moves(nodes, "table", "force_logical");
}

#[test]
fn a_shard_moved_under_load_grants_memory_buckets_one_burst_more_at_most() {
    let Some(nodes) = cluster() else { return };
    hammer_while_the_shard_moves(nodes, "memory", "force_logical");
}

/// A call Citus delegated to the node that held its key's shard, arriving there inside a transaction block
/// after a move took the shard away (as the coordinator sees it at planning time, a move can commit before
/// the call runs): Citus refuses the distributed table from such a call (XX000, "a distributed query from a
/// query on a shard"), so the call fails with 40001 (retry, nothing taken) and the retry goes to the new
/// node. Simulated on worker 1 with a key of worker 2, in a backend that Citus counts as its own (the
/// `citus_internal gpid=` application name its connections use).
#[test]
fn a_delegated_call_in_a_transaction_whose_shard_left_fails_with_40001_and_takes_nothing() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    let policy = fresh_name("left");
    c.query(
        "SELECT rate_limit.create_policy($1, 1, '1 hour', burst => 3)",
        &[&policy],
    )
    .expect("policy");
    let key = key_on_worker(&mut c, nodes, 2, &fresh_name("gone"));
    let mut worker = Client::connect(
        &format!(
            "{} dbname={DATABASE} application_name='citus_internal gpid=10000000001'",
            nodes[1]
        ),
        NoTls,
    )
    .expect("a Citus-internal connection to worker 1");
    let mut tx = worker.transaction().expect("begin");
    let e = tx
        .query("SELECT * FROM rate_limit.take($1, $2)", &[&policy, &key])
        .expect_err("the shard is not on worker 1");
    assert_eq!(
        e.code(),
        Some(&SqlState::T_R_SERIALIZATION_FAILURE),
        "{e:?}"
    );
    drop(tx);
    // outside a transaction block Citus lets a delegated call reach the new node: it takes there
    let taken: bool = worker
        .query_one(
            "SELECT allowed FROM rate_limit.take($1, $2)",
            &[&policy, &key],
        )
        .expect("a top-level delegated call")
        .get(0);
    assert!(taken);
    let remaining: i64 = c
        .query_one(
            "SELECT remaining FROM rate_limit.peek($1, $2)",
            &[&policy, &key],
        )
        .expect("peek")
        .get(0);
    assert_eq!(remaining, 2, "only the top-level call took a token");
}

#[test]
fn a_shard_move_keeps_table_buckets_and_starts_memory_buckets_full() {
    let Some(nodes) = cluster() else { return };
    let mut c = connect(&nodes[0]);
    c.batch_execute(HELPER).expect("helper");
    let (table, memory) = (fresh_name("moved_t"), fresh_name("moved_m"));
    for (policy, store) in [(&table, "table"), (&memory, "memory")] {
        c.query(
            "SELECT rate_limit.create_policy($1, 1, '80 days', burst => 5, store => $2)",
            &[policy, &store],
        )
        .expect("policy");
    }
    let key = key_on_worker(&mut c, nodes, 1, &fresh_name("k"));
    let remaining = |c: &mut Client, policy: &str| -> i64 {
        c.query_one(
            "SELECT remaining FROM rate_limit.peek($1, $2)",
            &[&policy, &key],
        )
        .expect("peek")
        .get(0)
    };
    for policy in [&table, &memory] {
        for _ in 0..3 {
            c.query("SELECT * FROM rate_limit.take($1, $2)", &[policy, &key])
                .expect("take");
        }
        assert_eq!(remaining(&mut c, policy), 2);
    }
    move_shard_of(&mut c, &key, &nodes[2]);
    let mut c = connect(&nodes[0]);
    // the table store's row moved with its shard; the memory bucket did not: a full one on the new node,
    // at most one burst more for the moved key
    assert_eq!(remaining(&mut c, &table), 2);
    assert_eq!(remaining(&mut c, &memory), 5);
    // the old copy is unreachable: worker 1 is no longer the key's node
    let e = connect(&nodes[1])
        .query_one("SELECT public.take_in_plpgsql($1, $2)", &[&memory, &key])
        .expect_err("not the key's node any more");
    assert_eq!(e.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{e:?}");
    // back where it was, for the other tests' layout
    move_shard_of(&mut c, &key, &nodes[1]);
}

#[test]
fn nodes_of_names_the_node_citus_routes_each_key_to_from_any_node() {
    let Some(nodes) = cluster() else { return };
    let keys: Vec<String> = (0..2000).map(|i| format!("where-{i}")).collect();
    for node in [&nodes[0], &nodes[2]] {
        let mut c = connect(node);
        // every key, in the order given, with the shard and the node Citus names for it
        let agree: i64 = c
            .query_one(
                "SELECT count(*) FROM rate_limit.nodes_of($1) WITH ORDINALITY AS o(key, host, port, shard, i) \
                 JOIN unnest($1) WITH ORDINALITY AS k(key, i) USING (i) \
                 JOIN pg_dist_placement p ON p.shardid = \
                      get_shard_id_for_distribution_column('rate_limit.bucket_state', k.key) \
                 JOIN pg_dist_node n ON n.groupid = p.groupid \
                 WHERE o.key = k.key AND o.shard = p.shardid AND o.host = n.nodename AND o.port = n.nodeport",
                &[&keys],
            )
            .expect("nodes_of")
            .get(0);
        assert_eq!(agree, 2000, "on {node}");
        let e = c
            .query("SELECT * FROM rate_limit.nodes_of(ARRAY['a', NULL])", &[])
            .expect_err("a NULL key");
        assert_eq!(e.code(), Some(&SqlState::NULL_VALUE_NOT_ALLOWED), "{e:?}");
    }
}

/// The example clients of `examples/citus-routing/` (Python with psycopg2, Node with node-postgres from the
/// client tests' modules) route calls to their keys' nodes and check it; each prints what it routed.
#[test]
fn the_example_clients_send_each_call_to_its_keys_node() {
    let Some(nodes) = cluster() else { return };
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let coordinator = &nodes[0];
    let url = format!(
        "postgresql:///{DATABASE}?host={}&port={}&user={}",
        part(coordinator, "host"),
        part(coordinator, "port"),
        part(coordinator, "user")
    );
    let runs = [
        (
            // Debian's Python, where scripts/install-deps.sh installs psycopg2 (python3-psycopg2)
            "/usr/bin/python3",
            format!("{root}/examples/citus-routing/route.py"),
            format!("{coordinator} dbname={DATABASE}"),
        ),
        (
            "node",
            format!("{root}/examples/citus-routing/route.js"),
            url,
        ),
    ];
    for (program, script, target) in runs {
        let out = std::process::Command::new(program)
            .arg(&script)
            .arg(&target)
            .env("NODE_PATH", format!("{root}/tests/clients/node_modules"))
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{script}: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            said.contains("routed 40 keys to 2 nodes"),
            "{script}: {said}"
        );
    }
}
