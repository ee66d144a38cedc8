//! `#[pg_test]`s: SQL behaviour inside a real PostgreSQL. Shared state outlives a test, so every test uses
//! keys of its own. Errors are checked by SQLSTATE through a PL/pgSQL helper that catches them in a
//! subtransaction.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn int(query: &str) -> i64 {
        Spi::get_one::<i64>(query)
            .expect("query runs")
            .expect("query returns a value")
    }

    fn text(query: &str) -> Option<String> {
        Spi::get_one::<String>(query).expect("query runs")
    }

    /// Runs `query` and returns `SQLSTATE: message` of the error it raises, or None if it succeeds.
    fn error_of(query: &str) -> Option<String> {
        Spi::run(
            "CREATE OR REPLACE FUNCTION pg_temp.error_of(q text) RETURNS text LANGUAGE plpgsql AS $$
             BEGIN EXECUTE q; RETURN NULL;
             EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$",
        )
        .expect("helper created");
        let quoted = query.replace('\'', "''");
        text(&format!("SELECT pg_temp.error_of('{quoted}')"))
    }

    fn requests(id: &str, rate: i32, window: i32, n: usize) -> Vec<i64> {
        (0..n)
            .map(|_| {
                int(&format!(
                    "SELECT rate_limiting_request('{id}', {rate}, {window})::bigint"
                ))
            })
            .collect()
    }

    #[pg_test]
    fn first_call_starts_full_and_defaults_apply() {
        assert_eq!(
            int("SELECT rate_limiting_request('pt_defaults')::bigint"),
            119
        );
        assert_eq!(
            int("SELECT rate_limiting_request('pt_defaults', 2)::bigint"),
            118
        );
        assert_eq!(
            int("SELECT rate_limiting_request('pt_five', 5, 1)::bigint"),
            4
        );
    }

    #[pg_test]
    fn reference_timeline_then_refill() {
        assert_eq!(
            requests("pt_timeline", 1, 10, 12),
            vec![9, 8, 7, 6, 5, 4, 3, 2, 1, 0, -1, -1]
        );
        Spi::run("SELECT pg_sleep(1.2)").expect("sleep");
        // 1.2 tokens refilled (the denied calls took none): one is taken, 0.2 stays
        assert_eq!(requests("pt_timeline", 1, 10, 2), vec![0, -1]);
    }

    #[pg_test]
    fn peek_consumes_nothing() {
        assert_eq!(
            int("SELECT rate_limit.peek_request('pt_peek', 1, 100)"),
            100
        );
        requests("pt_peek", 1, 100, 3);
        assert_eq!(int("SELECT rate_limit.peek_request('pt_peek', 1, 100)"), 97);
        assert_eq!(int("SELECT rate_limit.peek_request('pt_peek', 1, 100)"), 97);
        assert_eq!(requests("pt_peek", 1, 100, 1), vec![96]);
    }

    #[pg_test]
    fn tokens_is_exact_and_consumes_nothing() {
        assert_eq!(
            text("SELECT rate_limit.tokens('pt_tokens', 1, 100)::text").as_deref(),
            Some("100.000000")
        );
        requests("pt_tokens", 1, 100, 3);
        assert_eq!(
            text("SELECT (rate_limit.tokens('pt_tokens', 1, 100) BETWEEN 97 AND 97.5)::text")
                .as_deref(),
            Some("true")
        );
        assert_eq!(requests("pt_tokens", 1, 100, 1), vec![96]);
    }

    #[pg_test]
    fn reset_makes_a_bucket_full() {
        requests("pt_reset", 1, 5, 5);
        assert_eq!(requests("pt_reset", 1, 5, 1), vec![-1]);
        assert_eq!(
            text("SELECT rate_limit.reset_request('pt_reset')::text").as_deref(),
            Some("true")
        );
        assert_eq!(
            text("SELECT rate_limit.reset_request('pt_reset')::text").as_deref(),
            Some("false")
        );
        assert_eq!(requests("pt_reset", 1, 5, 1), vec![4]);
    }

    /// `TAKE` names the arithmetic in its WHERE and its SET: a grant on an existing row evaluates it once
    /// (twice before the per-row memo), a denial once.
    #[pg_test]
    fn a_table_store_grant_evaluates_the_arithmetic_once() {
        use crate::store::table_evaluations as evaluations;
        requests("pt_once", 1, 100, 1); // creates the row (no TAKE arithmetic on a missing row)
        let before = evaluations();
        assert_eq!(requests("pt_once", 1, 100, 3), vec![98, 97, 96]);
        assert_eq!(evaluations() - before, 3);
        let before = evaluations();
        assert_eq!(requests("pt_once_short", 1, 1, 2), vec![0, -1]);
        assert_eq!(evaluations() - before, 1); // the denial's UPDATE updated nothing
    }

    /// The view's CASE for table rows and the model's `Kind::of_stored_name` (used for memory buckets and
    /// statistics) name every namespace alike.
    #[pg_test]
    fn the_buckets_view_names_kinds_as_the_model_does() {
        use crate::store::target::Kind;
        for (i, namespace) in ["#request", "#ad_hoc", "pt_kind_policy"].iter().enumerate() {
            let key = format!("pt_kind_{i}");
            Spi::run(&format!(
                "INSERT INTO rate_limit.bucket_state VALUES \
                 ('{namespace}', '{key}', 0, now(), 'token_bucket', 1, 1000000, 1)"
            ))
            .expect("row inserted");
            let (kind, policy) = Kind::of_stored_name(namespace);
            let shown = text(&format!(
                "SELECT kind || '/' || coalesce(policy, '-') FROM rate_limit.buckets \
                 WHERE key = '{key}' AND store = 'table'"
            ));
            assert_eq!(
                shown,
                Some(format!("{}/{}", kind.name(), policy.unwrap_or("-")))
            );
        }
    }

    #[pg_test]
    fn purge_deletes_exactly_the_full_buckets() {
        Spi::run("DELETE FROM rate_limit.bucket_state").expect("clean");
        requests("pt_purge_drained", 1, 100, 2); // 98 of 100: not full for ~2 s
        requests("pt_purge_refills", 1000, 1, 1); // 999 of 1000: full again after 1 ms
        Spi::run("SELECT pg_sleep(0.05)").expect("sleep");
        assert_eq!(int("SELECT rate_limit.purge()"), 1);
        assert_eq!(
            text("SELECT string_agg(key, ',') FROM rate_limit.bucket_state").as_deref(),
            Some("pt_purge_drained")
        );
        assert_eq!(int("SELECT rate_limit.purge()"), 0);
    }

    #[pg_test]
    fn buckets_view_shows_exact_tokens() {
        requests("pt_view", 1, 100, 3);
        assert_eq!(
            text(
                "SELECT format('%s %s %s %s %s %s', kind, \"limit\", rate, per, store, \
                        tokens BETWEEN 97 AND 97.5) FROM rate_limit.buckets WHERE key = 'pt_view'"
            )
            .as_deref(),
            Some("request 100 1 00:00:01 table t")
        );
    }

    #[pg_test]
    fn state_tokens_is_the_exact_arithmetic_and_rejects_bad_numbers_with_22023() {
        // 0.5 token at t, 2 tokens/s: 0.25 s later 1.0 token; capped at capacity; a backward clock adds nothing
        let q = |at: &str| {
            text(&format!(
                "SELECT rate_limit.state_tokens(500000, '2026-01-01 00:00:00+00', 'token_bucket', 2, \
                 1000000, 3, '{at}')::text"
            ))
        };
        assert_eq!(q("2026-01-01 00:00:00.25+00").as_deref(), Some("1.000000"));
        assert_eq!(q("2026-01-01 01:00:00+00").as_deref(), Some("3.000000"));
        assert_eq!(q("2025-12-31 23:00:00+00").as_deref(), Some("0.500000"));
        assert_eq!(
            error_of(
                "SELECT rate_limit.state_tokens(0, now(), 'token_bucket', 0, 1000000, 3, now())"
            )
            .as_deref(),
            Some("22023: invalid bucket numbers: the refill rate must be at least 1")
        );
        assert_eq!(
            error_of(
                "SELECT rate_limit.state_after_take(0, now(), 'leaky', 1, 1, 1, 'token_bucket', 1, 1, 1, \
                 now(), now(), 1, now())"
            )
            .as_deref(),
            Some("22023: invalid bucket numbers: unknown algorithm 'leaky'")
        );
    }

    #[pg_test]
    fn null_arguments_raise_22004() {
        assert_eq!(
            error_of("SELECT rate_limiting_request(NULL)").as_deref(),
            Some("22004: id must not be NULL")
        );
        assert_eq!(
            error_of("SELECT rate_limiting_request('pt_null', NULL)").as_deref(),
            Some("22004: refill_per_sec must not be NULL")
        );
        assert_eq!(
            error_of("SELECT rate_limiting_request('pt_null', 1, NULL)").as_deref(),
            Some("22004: window_seconds must not be NULL")
        );
        assert_eq!(
            error_of("SELECT rate_limit.peek_request(NULL)").as_deref(),
            Some("22004: id must not be NULL")
        );
    }

    #[pg_test]
    fn out_of_range_arguments_raise_22023_and_22003() {
        assert_eq!(
            error_of("SELECT rate_limiting_request('pt_range', 0, 60)").as_deref(),
            Some("22023: refill_per_sec must be between 1 and 2147483647, got 0")
        );
        assert_eq!(
            error_of("SELECT rate_limiting_request('pt_range', 2, -5)").as_deref(),
            Some("22023: window_seconds must be between 1 and 2147483647, got -5")
        );
        assert_eq!(
            error_of("SELECT rate_limiting_request('pt_range', 65536, 32769)").as_deref(),
            Some("22003: capacity refill_per_sec * window_seconds = 2147549184 is too large")
        );
        // the largest capacity: 2^31 tokens, so 2^31 - 1 remain after the first call
        assert_eq!(
            int("SELECT rate_limiting_request('pt_range_max', 65536, 32768)::bigint"),
            2_147_483_647
        );
        assert_eq!(
            int("SELECT rate_limit.peek_request('pt_range_max2', 65536, 32768)"),
            2_147_483_648
        );
    }

    #[pg_test]
    fn long_ids_work_up_to_the_documented_limit() {
        assert_eq!(
            int("SELECT rate_limiting_request(repeat('k', 1024), 1, 5)::bigint"),
            4
        );
        assert_eq!(
            int("SELECT rate_limiting_request(repeat('k', 2048), 1, 5)::bigint"),
            4
        );
        assert_eq!(
            int("SELECT rate_limiting_request(repeat('k', 2048), 1, 5)::bigint"),
            3
        );
        assert_eq!(
            error_of("SELECT rate_limiting_request(repeat('k', 2049), 1, 5)").as_deref(),
            Some("22023: id is 2049 bytes long; the longest id accepted is 2048 bytes")
        );
        // multibyte text counts in bytes; an empty id is a key like any other
        assert_eq!(
            int("SELECT rate_limiting_request(repeat('é', 1024), 1, 5)::bigint"),
            4
        );
        assert_eq!(int("SELECT rate_limiting_request('', 1, 5)::bigint"), 4);
    }

    #[pg_test]
    fn no_function_carries_a_set_clause_and_state_functions_are_security_definer() {
        // no per-call settings anywhere: safety from the caller's search_path comes from qualified SQL
        assert_eq!(
            int(
                "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'rate_limit'::regnamespace \
                 AND p.proconfig IS NOT NULL"
            ),
            0
        );
        assert_eq!(
            text(
                "SELECT coalesce(array_to_string(proconfig, ','), 'none') || ' ' || prosecdef FROM pg_proc \
                 WHERE proname = 'rate_limiting_request'"
            )
            .as_deref(),
            Some("none true")
        );
        // the functions that are not SECURITY DEFINER: pure arithmetic, formatting, the policy triggers
        // (they run as the role that changes rate_limit.policies, which only the owner may), and those
        // that read shared memory only (memory usage, statistics: closed to PUBLIC instead), and
        // distribute (closed to PUBLIC; Citus checks the caller's own rights on what it distributes)
        assert_eq!(
            text(
                "SELECT string_agg(DISTINCT p.proname, ' ' ORDER BY p.proname) FROM pg_proc p \
                 WHERE p.pronamespace = 'rate_limit'::regnamespace AND NOT p.prosecdef"
            )
            .as_deref(),
            Some(
                "clock_shift distribute headers memory_shares memory_usage node_stats_rows node_top_limited_rows \
                 policies_changed policies_dropped reset_stats state_after_take state_is_full state_tokens \
                 stats_rows top_limited_rows"
            )
        );
    }

    #[pg_test]
    fn no_public_name_overloads_at_the_same_arity() {
        // drivers that send parameters untyped cannot choose between same-arity overloads
        assert_eq!(
            int(
                "SELECT count(*) FROM (SELECT p.proname, n FROM pg_proc p, \
                   generate_series((p.pronargs - p.pronargdefaults)::int, p.pronargs::int) AS n \
                 WHERE p.pronamespace = 'rate_limit'::regnamespace OR p.proname = 'rate_limiting_request' \
                 GROUP BY 1, 2 HAVING count(*) > 1) AS clash"
            ),
            0
        );
    }

    // ---- the memory store (the test cluster preloads the library, rate_limit.max_buckets = 4096) ----

    #[pg_test]
    fn memory_store_follows_the_reference_timeline() {
        Spi::run("SET rate_limit.store = 'memory'").expect("memory store");
        assert_eq!(
            requests("pm_timeline", 1, 10, 12),
            vec![9, 8, 7, 6, 5, 4, 3, 2, 1, 0, -1, -1]
        );
        // nothing went to the table
        Spi::run("SET rate_limit.store = 'table'").expect("table store");
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.bucket_state WHERE key = 'pm_timeline'"),
            0
        );
    }

    /// The same calls, with the same pauses, give the same answers from both stores. 2 tokens/s into a
    /// capacity of 10, from a full bucket at t0: the 12 quick calls answer 9..0, -1, -1 if the 12th comes
    /// before t0 + 0.5 s; after a pause of 1.25 s the bucket holds 2 * (t - t0) tokens (all 10 were taken
    /// by then), so the next three calls and a peek answer 1, 0, -1, 0 if they all come before t0 + 1.5 s.
    /// A run counts only
    /// when the time measured around it proves both (the measured spans contain the true ones); a slower
    /// run is repeated with a fresh key.
    #[pg_test]
    fn both_stores_give_identical_answers() {
        use std::time::{Duration, Instant};
        let run = |store: &str, attempt: usize| -> Option<Vec<i64>> {
            Spi::run(&format!("SET rate_limit.store = '{store}'")).expect("store");
            let id = format!("pm_same_{store}_{attempt}");
            let start = Instant::now();
            let mut out = requests(&id, 2, 5, 12);
            let quick = start.elapsed();
            Spi::run("SELECT pg_sleep(1.25)").expect("sleep");
            out.extend(requests(&id, 2, 5, 3));
            out.push(int(&format!(
                "SELECT rate_limit.peek_request('{id}', 2, 5)"
            )));
            let measured =
                quick < Duration::from_millis(500) && start.elapsed() < Duration::from_millis(1500);
            measured.then_some(out)
        };
        for store in ["table", "memory"] {
            let answers = (0..5)
                .find_map(|attempt| run(store, attempt))
                .unwrap_or_else(|| {
                    panic!("no run of 5 on the {store} store was fast enough to measure")
                });
            assert_eq!(
                answers,
                vec![9, 8, 7, 6, 5, 4, 3, 2, 1, 0, -1, -1, 1, 0, -1, 0],
                "{store} store"
            );
        }
    }

    #[pg_test]
    fn memory_store_peek_reset_purge_and_view() {
        Spi::run("SET rate_limit.store = 'memory'").expect("memory store");
        requests("pm_manage", 1, 100, 3);
        requests("pm_refills", 1000, 1, 1); // full again after 1 ms
        assert_eq!(
            int("SELECT rate_limit.peek_request('pm_manage', 1, 100)"),
            97
        );
        assert_eq!(
            text(
                "SELECT format('%s %s %s %s', store, \"limit\", rate, tokens BETWEEN 97 AND 97.5) \
                 FROM rate_limit.buckets WHERE key = 'pm_manage'"
            )
            .as_deref(),
            Some("memory 100 1 t")
        );
        Spi::run("SELECT pg_sleep(0.01)").expect("sleep");
        assert!(int("SELECT rate_limit.purge()") >= 1);
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.buckets WHERE key = 'pm_refills'"),
            0
        );
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.buckets WHERE key = 'pm_manage'"),
            1
        );
        assert_eq!(
            text("SELECT rate_limit.reset_request('pm_manage')::text").as_deref(),
            Some("true")
        );
        assert_eq!(
            text("SELECT rate_limit.reset_request('pm_manage')::text").as_deref(),
            Some("false")
        );
        assert_eq!(
            int("SELECT rate_limit.peek_request('pm_manage', 1, 100)"),
            100
        );
    }

    #[pg_test]
    fn memory_store_lists_long_ids_by_prefix() {
        Spi::run("SET rate_limit.store = 'memory'").expect("memory store");
        let long = "L".repeat(1000);
        assert_eq!(
            int(&format!(
                "SELECT rate_limiting_request('{long}', 1, 5)::bigint"
            )),
            4
        );
        assert_eq!(
            int(&format!(
                "SELECT rate_limiting_request('{long}', 1, 5)::bigint"
            )),
            3
        );
        // a slot keeps the first 24 bytes of a key for display
        let shown = format!("{}…", "L".repeat(24));
        assert_eq!(
            int(&format!(
                "SELECT count(*) FROM rate_limit.buckets WHERE key = '{shown}'"
            )),
            1
        );
    }

    #[pg_test]
    fn memory_usage_reports_size_within_144_bytes_per_bucket() {
        // 96-byte slots with 25% to spare, and 16 bytes per bucket that count the shares
        assert_eq!(
            text(
                "SELECT format('%s %s %s', max_buckets, slot_bytes, bytes_per_bucket <= 144) \
                 FROM rate_limit.memory_usage()"
            )
            .as_deref(),
            Some("4096 96 t")
        );
    }

    /// Every namespace a policy owns (its buckets, its lease slots, its block buckets) is listed under the
    /// policy in `rate_limit.buckets`, in both stores: the view's split on chr(31) agrees with the model's
    /// `owning_policy`.
    #[pg_test]
    fn a_policys_slots_and_blocks_are_listed_under_it() {
        for store in ["table", "memory"] {
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('boxed_{store}', 1, '1 hour', store => '{store}');
                 SELECT rate_limit.create_policy('jobs_{store}', 2, '1 hour', algorithm => 'concurrency', \
                 store => '{store}');
                 SELECT count(*) FROM rate_limit.take('boxed_{store}', 'k');
                 SELECT count(*) FROM rate_limit.block('boxed_{store}', 'k', '1 hour');
                 SELECT count(*) FROM rate_limit.acquire('jobs_{store}', 'k');
                 SELECT count(*) FROM rate_limit.acquire('jobs_{store}', 'k');"
            ))
            .expect("a blocked key and two leases");
            // the key's bucket and its block; two lease slots
            for (policy, rows) in [(format!("boxed_{store}"), 2), (format!("jobs_{store}"), 2)] {
                assert_eq!(
                    int(&format!(
                        "SELECT count(*) FROM rate_limit.buckets WHERE policy = '{policy}' AND key = 'k'"
                    )),
                    rows,
                    "{policy}"
                );
            }
        }
    }

    /// The `rate_limit.` prefix is reserved: a misspelt setting is refused, not kept as a placeholder.
    #[cfg(not(feature = "pg13"))]
    #[pg_test]
    fn misspelt_settings_are_refused() {
        assert_eq!(
            error_of("SET rate_limit.max_wiat = 5").as_deref(),
            Some("42602: invalid configuration parameter name \"rate_limit.max_wiat\"")
        );
    }

    #[pg_test]
    fn store_setting_is_validated() {
        assert_eq!(
            error_of("SET rate_limit.store = 'redis'").as_deref(),
            Some("22023: invalid value for parameter \"rate_limit.store\": \"redis\"")
        );
    }

    // ---- the full limiter API ---------------------------------------------------------------------

    /// Peeks and denials create no row; a bucket refunded to full is purged, in both stores.
    #[pg_test]
    fn policy_peeks_write_nothing_and_full_buckets_are_purged() {
        Spi::run("SELECT rate_limit.create_policy('pt_purge', 1, '1 hour', 3)").expect("create");
        for store in ["table", "memory"] {
            Spi::run(&format!("SET rate_limit.store = '{store}'")).expect("store");
            let listed = || {
                int(
                    "SELECT count(*) FROM rate_limit.buckets WHERE policy = 'pt_purge' \
                     AND key = 'k'",
                )
            };
            assert_eq!(
                int("SELECT remaining FROM rate_limit.peek('pt_purge', 'k')"),
                3
            );
            assert_eq!(
                int("SELECT remaining FROM rate_limit.take('pt_purge', 'k', 4)"),
                3
            );
            assert_eq!(
                listed(),
                0,
                "{store}: peeks and impossible costs write nothing"
            );
            assert_eq!(
                int("SELECT remaining FROM rate_limit.take('pt_purge', 'k', 2)"),
                1
            );
            assert_eq!(listed(), 1, "{store}");
            assert_eq!(
                int("SELECT remaining FROM rate_limit.refund('pt_purge', 'k', 5)"),
                3
            );
            assert!(int("SELECT rate_limit.purge()") >= 1);
            assert_eq!(listed(), 0, "{store}: a full bucket is purged");
        }
        Spi::run("RESET rate_limit.store").expect("reset");
    }

    /// Repeated denials of every kind of call are answered from the backend's memory of short buckets,
    /// without reading the table, with exact figures computed from the remembered state.
    #[pg_test]
    fn repeated_denials_of_every_call_skip_the_table() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_short', 1, '1 hour', 1); \
             SELECT rate_limit.create_policy('pt_roomy', 1, '1 hour', 100); \
             SET rate_limit.store = 'table'",
        )
        .expect("set up");
        let reads = || {
            int("SELECT coalesce(sum(seq_scan + idx_scan), 0)::bigint FROM pg_stat_xact_user_tables \
                 WHERE relid = 'rate_limit.bucket_state'::regclass")
        };
        let denial = |sql: &str| {
            text(&format!(
                "SELECT allowed || ':' || remaining || ':' || coalesce(policy, '-') || ':' || \
                 (retry_after BETWEEN interval '59 minutes' AND interval '1 hour') FROM {sql}"
            ))
        };
        // drain (a grant has no retry_after, so its line is NULL), then one denial that reads the table
        // and is remembered
        assert_eq!(denial("rate_limit.take('pt_short', 'k')"), None);
        assert_eq!(
            denial("rate_limit.take('pt_short', 'k')").as_deref(),
            Some("false:0:pt_short:true")
        );
        assert_eq!(
            int("SELECT rate_limiting_request('pt_short_r', 1, 1)::bigint"),
            0
        );
        assert_eq!(
            int("SELECT rate_limiting_request('pt_short_r', 1, 1)::bigint"),
            -1
        );
        let before = reads();
        for _ in 0..20 {
            assert_eq!(
                denial("rate_limit.take('pt_short', 'k')").as_deref(),
                Some("false:0:pt_short:true")
            );
            assert_eq!(
                denial("rate_limit.take_many(ARRAY['pt_roomy', 'pt_short'], ARRAY['k'])")
                    .as_deref(),
                Some("false:0:pt_short:true")
            );
            assert_eq!(
                int("SELECT rate_limiting_request('pt_short_r', 1, 1)::bigint"),
                -1
            );
        }
        assert_eq!(reads(), before, "no denial read the table");
        // a peek always reads, and the roomy policy gave nothing away
        assert_eq!(
            int("SELECT remaining FROM rate_limit.peek('pt_roomy', 'k')"),
            100
        );
        Spi::run("RESET rate_limit.store").expect("reset");
    }

    /// The decision of a denied multi-limit call names the policy with the longest wait, and nothing was
    /// taken from the others.
    #[pg_test]
    fn multi_limit_denial_names_the_longest_wait_and_takes_nothing() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_fast', 1, '1 second', 2); \
             SELECT rate_limit.create_policy('pt_slow', 1, '1 hour', 2); \
             SELECT rate_limit.create_policy('pt_big', 1, '1 hour', 100)",
        )
        .expect("create");
        Spi::run("SELECT * FROM rate_limit.take_many(ARRAY['pt_fast', 'pt_slow'], ARRAY['k'], 2)")
            .expect("drain");
        assert_eq!(
            text(
                "SELECT allowed || ':' || policy || ':' || (retry_after > interval '59 minutes') \
                 FROM rate_limit.take_many(ARRAY['pt_big', 'pt_fast', 'pt_slow'], ARRAY['k'])"
            )
            .as_deref(),
            Some("false:pt_slow:true")
        );
        assert_eq!(
            int("SELECT remaining FROM rate_limit.peek('pt_big', 'k')"),
            100
        );
    }

    /// In a read-only transaction (a PostgREST GET, a standby), a table-store policy in shadow mode answers
    /// a would-be denial without writing: allowed, reported, no 25006; a grant still needs a write (25006).
    #[pg_test]
    fn a_shadow_denial_writes_nothing_in_a_read_only_transaction() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_shadow_ro', 1, '1 day', shadow => true, store => 'table')",
        )
        .expect("policy");
        Spi::run("SELECT rate_limit.take('pt_shadow_ro', 'k')").expect("first grant");
        assert_eq!(error_of("SELECT 1"), None); // creates the helper while writes are allowed
        Spi::run("SET LOCAL transaction_read_only = on").expect("read only");
        assert_eq!(
            text(
                "SELECT concat_ws(',', allowed, shadow_denied, policy) \
                 FROM rate_limit.take('pt_shadow_ro', 'k')"
            )
            .as_deref(),
            Some("t,t,pt_shadow_ro")
        );
        let e =
            text("SELECT pg_temp.error_of('SELECT rate_limit.take(''pt_shadow_ro'', ''other'')')");
        assert!(e.is_some_and(|e| e.starts_with("25006")));
    }

    /// The same charges and takes give the same figures in both stores, debt included.
    #[pg_test]
    fn both_stores_charge_alike() {
        Spi::run("SELECT rate_limit.create_policy('pt_charge_t', 1, '1 day', burst => 10, max_debt => 4, store => 'table')")
            .expect("policy");
        Spi::run("SELECT rate_limit.create_policy('pt_charge_m', 1, '1 day', burst => 10, max_debt => 4, store => 'memory')")
            .expect("policy");
        for p in ["pt_charge_t", "pt_charge_m"] {
            // one statement each: a statement does not see the rows its own earlier calls wrote
            let figures: Vec<String> = [
                format!("SELECT remaining::text FROM rate_limit.take('{p}', 'k', 6)"),
                format!("SELECT remaining::text FROM rate_limit.charge('{p}', 'k', 5)"),
                format!("SELECT floor(tokens)::text FROM rate_limit.buckets WHERE policy = '{p}'"),
                format!("SELECT allowed::text FROM rate_limit.take('{p}', 'k')"),
                format!("SELECT remaining::text FROM rate_limit.charge('{p}', 'k', 100)"),
                format!("SELECT floor(tokens)::text FROM rate_limit.buckets WHERE policy = '{p}'"),
                format!("SELECT remaining::text FROM rate_limit.refund('{p}', 'k', 7)"),
            ]
            .iter()
            .map(|q| text(q).unwrap_or_default())
            .collect();
            assert_eq!(figures, ["4", "0", "-1", "false", "0", "-4", "3"], "{p}");
        }
    }

    /// A calendar window opens at the same end in both stores: the next first of the month at 00:00 in
    /// Paris, as PostgreSQL's own date arithmetic says, and takes its rate from the window.
    #[pg_test]
    fn both_stores_open_the_same_calendar_window() {
        for store in ["table", "memory"] {
            let p = format!("pt_month_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 3, '1 month', algorithm => 'calendar_window', \
                 time_zone => 'Europe/Paris', store => '{store}')"
            ))
            .expect("policy");
            let figures: Vec<String> = [
                format!("SELECT remaining::text FROM rate_limit.take('{p}', 'k', 2)"),
                format!("SELECT remaining::text FROM rate_limit.take('{p}', 'k')"),
                format!("SELECT allowed::text FROM rate_limit.take('{p}', 'k')"),
                // the window ends at the next first of the month in Paris, to the second
                format!(
                    "SELECT (abs(extract(epoch FROM clock_timestamp() + d.reset_after - \
                       (date_trunc('month', clock_timestamp() AT TIME ZONE 'Europe/Paris') + interval '1 month') \
                       AT TIME ZONE 'Europe/Paris')) < 1)::text \
                     FROM rate_limit.peek('{p}', 'k') AS d"
                ),
                format!(
                    "SELECT (d.retry_after = d.reset_after)::text FROM rate_limit.take('{p}', 'k') AS d"
                ),
                format!("SELECT tokens::text FROM rate_limit.buckets WHERE policy = '{p}'"),
                format!("SELECT algorithm FROM rate_limit.buckets WHERE policy = '{p}'"),
            ]
            .iter()
            .map(|q| text(q).unwrap_or_default())
            .collect();
            assert_eq!(
                figures,
                [
                    "1",
                    "0",
                    "false",
                    "true",
                    "true",
                    "0.000000",
                    "calendar_window"
                ],
                "{store}"
            );
        }
    }

    /// The same acquires and releases give the same figures in both stores.
    #[pg_test]
    fn both_stores_lease_alike() {
        for store in ["table", "memory"] {
            let p = format!("pt_lease_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 2, '1 hour', algorithm => 'concurrency', store => '{store}')"
            ))
            .expect("policy");
            let first = int(&format!("SELECT lease FROM rate_limit.acquire('{p}', 'k')"));
            let figures: Vec<String> = [
                format!("SELECT concat_ws(',', allowed, remaining, lease IS NOT NULL) FROM rate_limit.acquire('{p}', 'k')"),
                format!("SELECT concat_ws(',', allowed, remaining, lease IS NULL, ceil(extract(epoch FROM retry_after))) FROM rate_limit.acquire('{p}', 'k')"),
                format!("SELECT rate_limit.release('{p}', 'k', {first})::text"),
                format!("SELECT rate_limit.release('{p}', 'k', {first})::text"),
                format!("SELECT concat_ws(',', allowed, remaining) FROM rate_limit.acquire('{p}', 'k')"),
                format!("SELECT count(*)::text FROM rate_limit.buckets WHERE policy = '{p}' AND tokens = 0"),
                format!("SELECT concat_ws(',', calls, granted, denied) FROM rate_limit.stats WHERE policy = '{p}'"),
            ]
            .iter()
            .map(|q| text(q).unwrap_or_default())
            .collect();
            assert_eq!(
                figures,
                ["t,0,t", "f,0,t,3600", "true", "false", "t,0", "2", "4,3,1"],
                "{store}"
            );
        }
    }

    /// In a read-only transaction the table store's acquire reads only: denied while every slot is held,
    /// 25006 when one is free (the grant would write).
    #[pg_test]
    fn a_read_only_acquire_is_denied_or_refused_with_25006() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_lease_ro', 1, '1 hour', algorithm => 'concurrency', store => 'table')",
        )
        .expect("policy");
        Spi::run("SELECT rate_limit.acquire('pt_lease_ro', 'held')").expect("a lease");
        assert_eq!(error_of("SELECT 1"), None); // creates the helper while writes are allowed
        Spi::run("SET LOCAL transaction_read_only = on").expect("read only");
        assert_eq!(
            text("SELECT allowed::text FROM rate_limit.acquire('pt_lease_ro', 'held')").as_deref(),
            Some("false")
        );
        let e =
            text("SELECT pg_temp.error_of('SELECT rate_limit.acquire(''pt_lease_ro'', ''free'')')");
        assert!(e.is_some_and(|e| e.starts_with("25006")));
    }

    /// The same denials and blocks give the same figures in both stores: the penalty box blocks at its
    /// limit, a blocked key is denied with the block's end without its bucket being touched (peek, take,
    /// acquire), a block by hand replaces it, and unblock lifts it once.
    #[pg_test]
    fn both_stores_block_alike() {
        for store in ["table", "memory"] {
            let p = format!("pt_block_{store}");
            let l = format!("pt_block_lease_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 2, '1 hour', block_after => 2, \
                 block_for => '1 day', store => '{store}')"
            ))
            .expect("policy");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{l}', 1, '1 hour', algorithm => 'concurrency', \
                 store => '{store}')"
            ))
            .expect("lease policy");
            // one statement each: a statement does not see the rows its own earlier calls wrote
            let figures: Vec<String> = [
                format!("SELECT remaining::text FROM rate_limit.take('{p}', 'k', 2)"),
                format!("SELECT concat_ws(',', allowed, ceil(extract(epoch FROM retry_after))) FROM rate_limit.take('{p}', 'k')"),
                format!("SELECT concat_ws(',', allowed, ceil(extract(epoch FROM retry_after))) FROM rate_limit.take('{p}', 'k')"),
                format!("SELECT concat_ws(',', allowed, remaining, ceil(extract(epoch FROM retry_after)), ceil(extract(epoch FROM reset_after)), policy) FROM rate_limit.peek('{p}', 'k')"),
                format!("SELECT string_agg(concat_ws(':', algorithm, floor(tokens)), ',' ORDER BY algorithm) FROM rate_limit.buckets WHERE policy = '{p}'"),
                format!("SELECT rate_limit.unblock('{p}', 'k')::text"),
                format!("SELECT rate_limit.unblock('{p}', 'k')::text"),
                // the bucket is as the block found it: still empty, refilling
                format!("SELECT concat_ws(',', allowed, ceil(extract(epoch FROM retry_after))) FROM rate_limit.take('{p}', 'k')"),
                format!("SELECT concat_ws(',', allowed, remaining, ceil(extract(epoch FROM retry_after))) FROM rate_limit.block('{p}', 'other', '90 seconds')"),
                format!("SELECT concat_ws(',', allowed, ceil(extract(epoch FROM retry_after))) FROM rate_limit.take('{p}', 'other')"),
                format!("SELECT count(*)::text FROM rate_limit.buckets WHERE policy = '{p}' AND key = 'other' AND algorithm <> 'block'"),
                format!("SELECT ceil(extract(epoch FROM retry_after))::text FROM rate_limit.block('{l}', 'k', '1 minute')"),
                format!("SELECT concat_ws(',', allowed, lease IS NULL, ceil(extract(epoch FROM retry_after))) FROM rate_limit.acquire('{l}', 'k')"),
                format!("SELECT count(*)::text FROM rate_limit.buckets WHERE policy = '{l}'"),
            ]
            .iter()
            .map(|q| text(q).unwrap_or_default())
            .collect();
            assert_eq!(
                figures,
                [
                    "0",
                    "f,1800",
                    "f,86400",
                    "f,0,86400,86400,{p}".replace("{p}", &p).as_str(),
                    "block:0,token_bucket:0",
                    "true",
                    "false",
                    "f,1800",
                    "f,0,90",
                    "f,90",
                    "0",
                    "60",
                    "f,t,60",
                    "1",
                ],
                "{store}"
            );
        }
    }

    /// In a read-only transaction the table store denies as usual but cannot count the denial in the
    /// penalty box (it would write): nothing is raised, and nothing is counted.
    #[pg_test]
    fn a_read_only_denial_is_not_counted() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_block_ro', 1, '1 hour', block_after => 1, \
             block_for => '1 hour', store => 'table')",
        )
        .expect("policy");
        Spi::run("SELECT rate_limit.take('pt_block_ro', 'k')").expect("first grant");
        Spi::run("SET LOCAL transaction_read_only = on").expect("read only");
        assert_eq!(
            text("SELECT concat_ws(',', allowed, ceil(extract(epoch FROM retry_after))) FROM rate_limit.take('pt_block_ro', 'k')").as_deref(),
            Some("f,3600")
        );
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.buckets WHERE policy = 'pt_block_ro'"),
            1
        );
    }

    /// Under shadow mode a blocked key's calls are allowed and reported as would-be denials with the
    /// block's end, without touching its bucket; the penalty box counts would-be denials, so a key that
    /// enforcing the policy would block shows as blocked.
    #[pg_test]
    fn shadow_mode_reports_blocks_without_enforcing_them() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_block_shadow', 1, '1 hour', block_after => 1, \
             block_for => '1 day', shadow => true, store => 'memory')",
        )
        .expect("policy");
        let figures: Vec<String> = [
            "SELECT concat_ws(',', allowed, shadow_denied) FROM rate_limit.take('pt_block_shadow', 'k')",
            // a would-be denial, counted: the key would now be blocked for a day
            "SELECT concat_ws(',', allowed, shadow_denied, ceil(extract(epoch FROM reset_after))) FROM rate_limit.take('pt_block_shadow', 'k')",
            "SELECT concat_ws(',', allowed, shadow_denied, ceil(extract(epoch FROM reset_after))) FROM rate_limit.take('pt_block_shadow', 'k')",
            // block() returns what a call on the key gets now: under shadow mode, allowed with the block
            // reported as a would-be denial
            "SELECT concat_ws(',', allowed, remaining, shadow_denied, ceil(extract(epoch FROM reset_after))) FROM rate_limit.block('pt_block_shadow', 'other', '1 minute')",
            "SELECT concat_ws(',', allowed, shadow_denied, ceil(extract(epoch FROM reset_after))) FROM rate_limit.take('pt_block_shadow', 'other')",
            "SELECT count(*)::text FROM rate_limit.buckets WHERE policy = 'pt_block_shadow' AND key = 'other'",
        ]
        .iter()
        .map(|q| text(q).unwrap_or_default())
        .collect();
        assert_eq!(
            figures,
            ["t,f", "t,t,86400", "t,t,86400", "t,0,t,60", "t,t,60", "1"]
        );
    }
}
