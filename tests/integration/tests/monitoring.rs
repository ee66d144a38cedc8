//! Monitoring for real: a known workload in a database of its own, then Debian's
//! `prometheus-postgres-exporter` started with the shipped `monitoring/queries.yaml` as a role that is only
//! in `pg_monitor`, its `/metrics` checked value by value against the workload, and Prometheus scraping it:
//! one query checked, and every query of the shipped Grafana dashboard returns data. The portable
//! edition's `monitoring/queries-portable.yaml` the same way, against a database of that edition.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use rate_limit_integration::{conninfo, Edition, TestDb, PORTABLE_OWNER};

const MONITOR: &str = "rl_it_monitor";

/// A process killed when the test ends, pass or fail.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port free on 127.0.0.1 now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

fn repository_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// The body of `GET path` from `127.0.0.1:port`, if it answered 200.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}

/// Polls `f` every 200 ms for up to `seconds` until it gives a value; panics with `what` otherwise.
fn poll<T>(seconds: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what} (waited {seconds} s)");
        thread::sleep(Duration::from_millis(200));
    }
}

fn percent_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The samples of one exposition: metric name and labels (without the exporter's `server`) to value.
fn samples(exposition: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in exposition.lines().filter(|l| l.starts_with("rate_limit")) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
        let mut labels: Vec<&str> = labels
            .trim_end_matches('}')
            .split(',')
            .filter(|l| !l.is_empty() && !l.starts_with("server="))
            .collect();
        labels.sort();
        out.insert(
            format!("{name}{{{}}}", labels.join(",")),
            value.parse().unwrap_or(f64::NAN),
        );
    }
    out
}

/// The known workload, as the owner: every counter and gauge gets a value the test can name.
fn workload(c: &mut Client) {
    c.batch_execute(
        "SELECT rate_limit.create_policy('api', 3, '1 hour');
         SELECT rate_limit.create_policy('trial', 1, '1 hour', shadow => true);
         SELECT rate_limit.create_policy('boxed', 10, '1 hour');
         SELECT rate_limit.create_policy('exports', 2, '1 hour', algorithm => 'concurrency');
         SELECT rate_limit.create_policy('mem', 5, '1 hour', store => 'memory');
         SELECT rate_limit.create_policy('fast', 1000, '1 second', burst => 1, store => 'table');
         SELECT rate_limit.block('boxed', 'x', '1 hour');",
    )
    .expect("the policies");
    let calls: &[(&str, &str, usize)] = &[
        ("api", "a", 5),
        ("api", "b", 2),
        ("trial", "t", 3),
        ("boxed", "x", 2),
        ("mem", "m1", 1),
        ("mem", "m2", 1),
        ("mem", "m3", 1),
        ("mem", "m4", 1),
        ("fast", "f1", 1),
        ("fast", "f2", 1),
        ("fast", "f3", 1),
    ];
    for (policy, key, times) in calls {
        for _ in 0..*times {
            c.query_one("SELECT rate_limit.take($1, $2)", &[policy, key])
                .expect("take");
        }
    }
    c.query_one("SELECT rate_limit.acquire('exports', 'k')", &[])
        .expect("acquire");
    // a lease acquired and released is not held (and its slot is a full bucket again)
    c.query_one(
        "SELECT rate_limit.release('exports', 'k2', (SELECT lease FROM rate_limit.acquire('exports', 'k2')))",
        &[],
    )
    .expect("acquire and release");
}

/// An adaptive concurrency policy (4 leases at most) whose calls reported trouble, in `store`: key b1 cut
/// once (to 3.6 leases), b2 twice (the second lease acquired after the first cut: 3.24), b3 reported well
/// (not cut). Run after the purge the tests count, which would free the released slots.
fn adaptive_workload(c: &mut Client, policy: &str, store: &str) {
    c.execute(
        "SELECT rate_limit.create_policy($1, 4, '1 hour', algorithm => 'concurrency', store => $2, \
         options => '{\"latency_target\": \"1 second\"}')",
        &[&policy, &store],
    )
    .expect("an adaptive policy");
    for (key, outcome) in [
        ("b1", "dropped"),
        ("b2", "dropped"),
        ("b2", "timeout"),
        ("b3", "ok"),
    ] {
        let released: bool = c
            .query_one(
                "SELECT rate_limit.release($1, $2, lease, $3) FROM rate_limit.acquire($1, $2)",
                &[&policy, &key, &outcome],
            )
            .expect("acquire and report")
            .get(0);
        assert!(released, "{policy} {key}");
    }
}

/// What `adaptive_workload` must show of `policy`: two keys cut, the lowest to 3.24 leases, 3.42 on average.
fn assert_adaptive_gauges(sample: &dyn Fn(&str, &str) -> f64, policy: &str) {
    let l = format!("policy=\"{policy}\"");
    assert_eq!(
        sample("rate_limit_adaptive_limited_keys", &l),
        2.0,
        "{policy}"
    );
    assert_eq!(
        sample("rate_limit_adaptive_lowest_limit", &l),
        3.24,
        "{policy}"
    );
    assert_eq!(
        sample("rate_limit_adaptive_mean_limit", &l),
        3.42,
        "{policy}"
    );
}

/// What the workload must show: (policy, calls, granted, denied, shadow_denied, blocked, tokens).
const EXPECTED: [(&str, i64, i64, i64, i64, i64, i64); 8] = [
    ("api", 7, 5, 2, 0, 0, 5),
    ("backend", 4, 4, 0, 0, 0, 4),
    ("backend_mem", 4, 4, 0, 0, 0, 4),
    ("boxed", 2, 0, 2, 0, 2, 0),
    ("exports", 2, 2, 0, 0, 0, 2),
    ("fast", 3, 3, 0, 0, 0, 3),
    ("mem", 4, 4, 0, 0, 0, 4),
    ("trial", 3, 1, 0, 2, 0, 1),
];

/// Runs the background worker's purge every second until it has purged this database, then stops it:
/// the last purge of the table store freed `fast`'s 3 full buckets and the released lease's slot.
fn purge_once(db: &TestDb) {
    let mut admin = db.connect();
    let set = |admin: &mut Client, value: &str| {
        admin
            .batch_execute(&format!(
                "ALTER SYSTEM SET rate_limit.purge_interval = {value}"
            ))
            .expect("set the purge interval");
        admin
            .batch_execute("SELECT pg_reload_conf()")
            .expect("reload");
    };
    // fast's buckets are full again after 1 ms, and the worker deletes a bucket once it has been untouched
    // for a whole purge interval (1 s here)
    thread::sleep(Duration::from_millis(1100));
    set(&mut admin, "'1s'");
    let freed: i64 = poll(30, "a purge of this database", || {
        admin
            .query_opt(
                "SELECT freed FROM rate_limit.metrics_purge WHERE store = 'table'",
                &[],
            )
            .expect("metrics_purge")
            .map(|r| r.get(0))
    });
    set(&mut admin, "0");
    assert_eq!(
        freed, 4,
        "the first purge frees fast's three full buckets and a free lease slot"
    );
    thread::sleep(Duration::from_secs(2)); // a round under way ends
}

fn start_exporter(db: &TestDb, port: u16, queries: &str) -> Running {
    let dsn = format!(
        "{} dbname={} user={MONITOR} sslmode=disable",
        conninfo(),
        db.name()
    )
    .replace("user=postgres ", "");
    let child = Command::new("prometheus-postgres-exporter")
        .env("DATA_SOURCE_NAME", dsn)
        .arg(format!(
            "--extend.query-path={}",
            repository_file(queries).display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--disable-default-metrics")
        .arg("--disable-settings-metrics")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect(
            "prometheus-postgres-exporter (Debian's package; scripts/install-deps.sh installs it)",
        );
    Running(child)
}

fn start_prometheus(exporter: u16, port: u16, dir: &std::path::Path) -> Running {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: rate_limit\n    static_configs:\n      - targets: ['127.0.0.1:{exporter}']\n",
            repository_file("monitoring/rules.yml").display()
        ),
    )
    .expect("the Prometheus configuration");
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus (Debian's package; scripts/install-deps.sh installs it)");
    Running(child)
}

/// The `name{labels}` samples of `exposition` in database `database`, by their sorted labels (`labels`
/// without the database's, comma-separated); panics naming the sample when there is none.
fn sample_of(
    got: &BTreeMap<String, f64>,
    exposition: &str,
    database: &str,
    name: &str,
    labels: &str,
) -> f64 {
    let database = format!("database=\"{database}\"");
    let mut all: Vec<&str> = labels.split(',').filter(|l| !l.is_empty()).collect();
    all.push(&database);
    all.sort();
    let key = format!("{name}{{{}}}", all.join(","));
    *got.get(&key)
        .unwrap_or_else(|| panic!("no sample {key} in:\n{exposition}"))
}

/// The result vector of an instant query, once Prometheus answers it with at least one sample.
fn query(port: u16, expr: &str) -> Option<Vec<serde_json::Value>> {
    let body = http_get(
        port,
        &format!("/api/v1/query?query={}", percent_encoded(expr)),
    )?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let result = v["data"]["result"].as_array()?.clone();
    (!result.is_empty()).then_some(result)
}

#[test]
fn the_exporter_and_prometheus_show_a_known_workload_exactly() {
    let db = TestDb::new("metrics");
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {MONITOR}; CREATE ROLE {MONITOR} LOGIN IN ROLE pg_monitor;
             ALTER ROLE {MONITOR} SET rate_limit.metrics_top_keys = 2"
        ))
        .expect("the monitoring role");
    workload(&mut owner);
    drop(owner); // its pending denials reach the top keys at its exit
    purge_once(&db);
    let mut owner = db.connect();
    adaptive_workload(&mut owner, "backend", "table");
    adaptive_workload(&mut owner, "backend_mem", "memory");
    drop(owner);

    // the views, as the monitoring role
    let mut monitor = Client::connect(
        &format!("{} dbname={} user={MONITOR}", conninfo(), db.name())
            .replace("user=postgres ", ""),
        NoTls,
    )
    .expect("connect as the monitoring role");
    let rows: Vec<(String, i64, i64, i64, i64, i64, i64)> = monitor
        .query(
            "SELECT policy, calls, granted, denied, shadow_denied, blocked, tokens_granted \
             FROM rate_limit.metrics WHERE kind = 'policy' ORDER BY policy",
            &[],
        )
        .expect("rate_limit.metrics as pg_monitor")
        .iter()
        .map(|r| {
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
            )
        })
        .collect();
    let expected: Vec<_> = EXPECTED
        .iter()
        .map(|e| (e.0.to_string(), e.1, e.2, e.3, e.4, e.5, e.6))
        .collect();
    assert_eq!(rows, expected);
    let purges: Vec<(String, f64, i64)> = monitor
        .query(
            "SELECT store, date_part('epoch', finished_at), freed FROM rate_limit.metrics_purge ORDER BY store",
            &[],
        )
        .expect("metrics_purge")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();

    // the exporter
    let exporter_port = free_port();
    let _exporter = start_exporter(&db, exporter_port, "monitoring/queries.yaml");
    let exposition = poll(30, "the exporter's /metrics with rate_limit's", || {
        http_get(exporter_port, "/metrics").filter(|b| b.contains("rate_limit_calls_total"))
    });
    let got = samples(&exposition);
    let database = db.name();
    let sample = |name: &str, labels: &str| sample_of(&got, &exposition, database, name, labels);
    for (policy, calls, granted, denied, shadow, blocked, tokens) in EXPECTED {
        let l = format!("kind=\"policy\",policy=\"{policy}\"");
        assert_eq!(
            sample("rate_limit_calls_total", &l),
            calls as f64,
            "{policy}"
        );
        assert_eq!(
            sample("rate_limit_granted_total", &l),
            granted as f64,
            "{policy}"
        );
        assert_eq!(
            sample("rate_limit_denied_total", &l),
            denied as f64,
            "{policy}"
        );
        assert_eq!(
            sample("rate_limit_shadow_denied_total", &l),
            shadow as f64,
            "{policy}"
        );
        assert_eq!(
            sample("rate_limit_blocked_total", &l),
            blocked as f64,
            "{policy}"
        );
        assert_eq!(
            sample("rate_limit_tokens_granted_total", &l),
            tokens as f64,
            "{policy}"
        );
    }
    assert_api_and_trial_gauges(&sample);
    assert_eq!(sample("rate_limit_leases_held", "policy=\"exports\""), 1.0);
    assert!(
        !exposition.contains("rate_limit_leases_held{database=\"rl_it_metrics\",policy=\"api\"")
    );
    assert_adaptive_gauges(&sample, "backend");
    assert_adaptive_gauges(&sample, "backend_mem");
    assert_eq!(
        got.keys()
            .filter(|k| k.starts_with("rate_limit_adaptive_limited_keys{"))
            .count(),
        2,
        "only the adaptive policies"
    );
    // mem's four buckets; backend_mem's slot of each of its three keys (free, not yet purged) and the
    // limits of the two keys cut
    assert_eq!(sample("rate_limit_memory_buckets", "").round(), 9.0);
    let share = sample("rate_limit_memory_share_buckets", "");
    assert!(share > 0.0 && share <= sample("rate_limit_memory_max_buckets", ""));
    assert_eq!(
        sample("rate_limit_memory_bytes", ""),
        9.0 * sample("rate_limit_memory_share_bytes", "") / share
    );
    for (store, finished, freed) in &purges {
        let l = format!("store=\"{store}\"");
        assert_eq!(
            sample("rate_limit_purge_last_finished_timestamp_seconds", &l),
            *finished
        );
        assert_eq!(sample("rate_limit_purge_last_freed", &l), *freed as f64);
    }
    assert_eq!(
        purges.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
        ["memory", "table"]
    );
    // the top keys, two per policy as the role's setting allows: each denied key once
    for (policy, key) in [("api", "a"), ("boxed", "x"), ("trial", "t")] {
        let l = format!("key=\"{key}\",kind=\"policy\",policy=\"{policy}\"");
        assert_eq!(sample("rate_limit_top_denials", &l), 2.0, "{policy}");
    }
    assert_eq!(
        got.keys()
            .filter(|k| k.starts_with("rate_limit_top_denials{"))
            .count(),
        3
    );

    // Prometheus, scraping the exporter every second
    let dir = std::env::temp_dir().join(rate_limit_integration::fresh_name("rl_it_prometheus"));
    std::fs::create_dir_all(&dir).expect("a directory for Prometheus");
    let prometheus_port = free_port();
    let prometheus = start_prometheus(exporter_port, prometheus_port, &dir);
    let api_calls = poll(60, "Prometheus's first scrape", || {
        query(prometheus_port, "rate_limit_calls_total{policy=\"api\"}")
    });
    assert_eq!(api_calls.len(), 1);
    assert_eq!(api_calls[0]["value"][1], "7");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repository_file("monitoring/grafana-dashboard.json"))
            .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10);
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"]
                .as_str()
                .expect("an expression")
                .replace("$database", ".*");
            poll(60, &format!("data for {expr} ({})", panel["title"]), || {
                query(prometheus_port, &expr)
            });
        }
    }
    drop(prometheus);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The portable edition's configuration (`monitoring/queries-portable.yaml`) against a database of that
/// edition, as a role only in `pg_monitor`: each policy's numbers, the leases held, an adaptive policy's
/// cut limits, and the last `rate_limit.purge()` the owner ran (as pg_cron would), value by value; a role
/// with only LOGIN reads none of the views (42501).
#[test]
fn the_exporter_shows_the_portable_editions_policies_leases_and_purge() {
    let db = TestDb::with_edition(&conninfo(), "metrics_portable", Edition::Portable);
    let mut owner = db.connect_as(PORTABLE_OWNER);
    db.connect()
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {MONITOR}; CREATE ROLE {MONITOR} LOGIN IN ROLE pg_monitor;
             DROP ROLE IF EXISTS rl_it_nobody; CREATE ROLE rl_it_nobody LOGIN"
        ))
        .expect("the roles");
    owner
        .batch_execute(
            "SELECT rate_limit.create_policy('api', 3, '1 hour');
             SELECT rate_limit.create_policy('trial', 1, '1 hour', shadow => true);
             SELECT rate_limit.create_policy('exports', 2, '1 hour', algorithm => 'concurrency');
             SELECT rate_limit.create_policy('fast', 1000, '1 second', burst => 1);
             SELECT rate_limit.take('api', 'a') FROM generate_series(1, 5);
             SELECT rate_limit.take('fast', k) FROM unnest(ARRAY['f1', 'f2', 'f3']) AS k;
             SELECT rate_limit.acquire('exports', 'k');
             SELECT rate_limit.release('exports', 'k2', (SELECT lease FROM rate_limit.acquire('exports', 'k2')));",
        )
        .expect("the workload");
    // fast's buckets are full again after 1 ms, and the worker deletes a bucket once it has been untouched
    // for a whole purge interval (1 s here)
    thread::sleep(Duration::from_millis(1100));
    let freed: i64 = owner
        .query_one("SELECT rate_limit.purge()", &[])
        .expect("purge")
        .get(0);
    assert_eq!(
        freed, 4,
        "fast's three full buckets and the free lease slot"
    );
    adaptive_workload(&mut owner, "backend", "table");
    let mut nobody = db.connect_as("rl_it_nobody");
    for view in ["rate_limit.metrics_policies", "rate_limit.metrics_purge"] {
        let e = nobody
            .query(&format!("SELECT * FROM {view}"), &[])
            .expect_err(view);
        assert_eq!(
            e.code(),
            Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{view}"
        );
    }
    let finished: f64 = db
        .connect_as(MONITOR)
        .query_one(
            "SELECT date_part('epoch', finished_at) FROM rate_limit.metrics_purge WHERE store = 'table'",
            &[],
        )
        .expect("metrics_purge as pg_monitor")
        .get(0);

    let exporter_port = free_port();
    let _exporter = start_exporter(&db, exporter_port, "monitoring/queries-portable.yaml");
    let exposition = poll(30, "the exporter's /metrics with rate_limit's", || {
        http_get(exporter_port, "/metrics").filter(|b| b.contains("rate_limit_purge_last_freed"))
    });
    let got = samples(&exposition);
    let sample = |name: &str, labels: &str| sample_of(&got, &exposition, db.name(), name, labels);
    assert_api_and_trial_gauges(&sample);
    let exports = "algorithm=\"concurrency\",policy=\"exports\"";
    assert_eq!(sample("rate_limit_policy_rate", exports), 2.0);
    assert_eq!(sample("rate_limit_leases_held", "policy=\"exports\""), 1.0);
    assert_eq!(
        got.keys()
            .filter(|k| k.starts_with("rate_limit_leases_held{"))
            .count(),
        2,
        "only the concurrency policies hold leases"
    );
    assert_eq!(sample("rate_limit_leases_held", "policy=\"backend\""), 0.0);
    assert_adaptive_gauges(&sample, "backend");
    assert_eq!(
        got.keys()
            .filter(|k| k.starts_with("rate_limit_adaptive_limited_keys{"))
            .count(),
        1,
        "only the adaptive policy"
    );
    let table = "store=\"table\"";
    assert_eq!(sample("rate_limit_purge_last_freed", table), 4.0);
    assert_eq!(
        sample("rate_limit_purge_last_finished_timestamp_seconds", table),
        finished
    );
    assert!(
        !exposition.contains("rate_limit_calls_total"),
        "the portable edition counts no calls"
    );
    drop(nobody);
    let _ = db.connect().batch_execute("DROP ROLE rl_it_nobody");
}

/// The gauges of the policies both monitoring tests create: `api` (3 per hour, burst 3) and `trial` (in
/// shadow mode), as `sample(name, labels)` reads them from the exporter.
fn assert_api_and_trial_gauges(sample: &dyn Fn(&str, &str) -> f64) {
    let api = "algorithm=\"token_bucket\",policy=\"api\"";
    assert_eq!(sample("rate_limit_policy_rate", api), 3.0);
    assert_eq!(sample("rate_limit_policy_burst", api), 3.0);
    assert_eq!(sample("rate_limit_policy_period_seconds", api), 3600.0);
    assert_eq!(sample("rate_limit_policy_shadow", api), 0.0);
    let trial = "algorithm=\"token_bucket\",policy=\"trial\"";
    assert_eq!(sample("rate_limit_policy_shadow", trial), 1.0);
}
