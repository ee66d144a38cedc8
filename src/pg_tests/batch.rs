//! `rate_limit.take_batch`: every key decided as `take` would, in order, in both stores; all or nothing
//! only when asked; its bad arguments refused with their SQLSTATEs.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{error_of, int, text};

    /// The rows of a batch as `ordinality:key:allowed:remaining:denied-with-a-wait` lines, in order.
    fn rows(call: &str) -> String {
        text(&format!(
            "SELECT string_agg(ordinality || ':' || key || ':' || allowed || ':' || remaining || ':' || \
             (retry_after IS NOT NULL), ' ' ORDER BY ordinality) FROM {call}"
        ))
        .unwrap_or_default()
    }

    /// A batch decides each key as `take` would, in the order given: a key named twice is taken twice,
    /// costs apply per key, and what it took is what `take` and `peek` see after it.
    #[pg_test]
    fn a_batch_takes_each_key_in_order_as_take_would() {
        Spi::run("SELECT rate_limit.create_policy('pt_batch', 1, '1 hour', 3)").expect("create");
        for store in ["table", "memory"] {
            Spi::run(&format!("SET rate_limit.store = '{store}'")).expect("store");
            let (a, b) = (format!("a_{store}"), format!("b_{store}"));
            assert_eq!(
                rows(&format!(
                    "rate_limit.take_batch('pt_batch', ARRAY['{a}', '{b}', '{a}', '{a}', '{a}'])"
                )),
                format!(
                    "1:{a}:true:2:false 2:{b}:true:2:false 3:{a}:true:1:false 4:{a}:true:0:false \
                     5:{a}:false:0:true"
                ),
                "{store}"
            );
            assert_eq!(
                rows(&format!(
                    "rate_limit.take_batch('pt_batch', ARRAY['{b}', '{b}', '{b}'], ARRAY[2, 0, 1])"
                )),
                format!("1:{b}:true:0:false 2:{b}:true:0:false 3:{b}:false:0:true"),
                "{store}: costs per key, 0 only reports"
            );
            assert_eq!(
                int(&format!(
                    "SELECT remaining FROM rate_limit.peek('pt_batch', '{a}')"
                )),
                0
            );
            assert_eq!(
                int("SELECT count(*) FROM rate_limit.take_batch('pt_batch', '{}')"),
                0,
                "an empty batch"
            );
        }
        Spi::run("RESET rate_limit.store").expect("reset");
    }

    /// A batch larger than one run of the memory store (which decides its keys in the order of their
    /// buckets, 65 536 at a time) still takes each key's calls in the order given: 500 keys named 140
    /// times each, costs 2, 2, then 1 from a burst of 3, give each key granted, denied, granted, then
    /// denied (taken out of order, a cost of 1 before a cost of 2 would change them). The same in the
    /// table store.
    #[pg_test]
    fn a_large_batch_takes_each_keys_calls_in_the_order_given() {
        Spi::run("SELECT rate_limit.create_policy('pt_batch_large', 1, '1 day', 3)")
            .expect("create");
        for store in ["memory", "table"] {
            Spi::run(&format!("SET rate_limit.store = '{store}'")).expect("store");
            let wrong = int(&format!(
                "WITH calls AS (
                   SELECT g, (g - 1) / 500 AS round, '{store}' || ((g - 1) % 500) AS key
                   FROM generate_series(1, 70000) AS g)
                 SELECT count(*) FROM rate_limit.take_batch('pt_batch_large',
                   (SELECT array_agg(key ORDER BY g) FROM calls),
                   (SELECT array_agg(CASE WHEN round < 2 THEN 2 ELSE 1 END ORDER BY g) FROM calls)) AS b
                 JOIN calls ON calls.g = b.ordinality
                 WHERE b.key IS DISTINCT FROM calls.key
                    OR b.allowed IS DISTINCT FROM (round IN (0, 2))
                    OR b.remaining IS DISTINCT FROM CASE WHEN round < 2 THEN 1 ELSE 0 END"
            ));
            assert_eq!(wrong, 0, "{store}: rows not as taken in order");
        }
        Spi::run("RESET rate_limit.store").expect("reset");
    }

    /// A batch counts in the statistics as its keys' takes would: a call per key, grants, denials, and
    /// the tokens granted (the memory store's lock-free grants and the table store's two-statement batch
    /// are counted at once when the batch ends).
    #[pg_test]
    fn a_batch_counts_each_key_in_the_statistics() {
        for store in ["table", "memory"] {
            let p = format!("pt_batch_stats_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 1, '1 hour', 3, store => '{store}')"
            ))
            .expect("create");
            // k1 is made first, so that the batch finds its bucket and takes the lock-free path
            Spi::run(&format!("SELECT * FROM rate_limit.take('{p}', 'k1', 0)")).expect("peek");
            Spi::run(&format!("SELECT * FROM rate_limit.take('{p}', 'k1')")).expect("take");
            Spi::run(&format!(
                "SELECT * FROM rate_limit.take_batch('{p}', ARRAY['k1', 'k2', 'k1', 'k1', 'k2'],                  ARRAY[1, 2, 1, 1, 1])"
            ))
            .expect("batch");
            // calls: the take and five keys; granted: the take, k1 twice, k2 twice (2 then 1 token);
            // denied: k1's third
            assert_eq!(
                text(&format!(
                    "SELECT concat_ws(',', calls, granted, denied, tokens_granted) FROM rate_limit.stats \
                     WHERE policy = '{p}'"
                ))
                .as_deref(),
                Some("6,5,1,6"),
                "{store}"
            );
        }
    }

    /// With all_or_nothing the keys are granted together or not at all, and every row says which.
    #[pg_test]
    fn an_all_or_nothing_batch_takes_every_key_or_none() {
        Spi::run("SELECT rate_limit.create_policy('pt_batch_all', 1, '1 hour', 2)")
            .expect("create");
        for store in ["table", "memory"] {
            Spi::run(&format!("SET rate_limit.store = '{store}'")).expect("store");
            let (a, b) = (format!("a_{store}"), format!("b_{store}"));
            let call = format!(
                "rate_limit.take_batch('pt_batch_all', ARRAY['{a}', '{b}'], ARRAY[1, 1], true)"
            );
            Spi::run(&format!(
                "SELECT * FROM rate_limit.take('pt_batch_all', '{b}', 2)"
            ))
            .expect("drain b");
            assert_eq!(
                rows(&call),
                format!("1:{a}:false:2:false 2:{b}:false:0:true"),
                "{store}: b is empty, so a keeps its tokens"
            );
            assert_eq!(
                int(&format!(
                    "SELECT remaining FROM rate_limit.peek('pt_batch_all', '{a}')"
                )),
                2,
                "{store}"
            );
            Spi::run(&format!(
                "SELECT * FROM rate_limit.refund('pt_batch_all', '{b}', 2)"
            ))
            .expect("refill b");
            assert_eq!(
                rows(&call),
                format!("1:{a}:true:1:false 2:{b}:true:1:false"),
                "{store}"
            );
        }
        Spi::run("RESET rate_limit.store").expect("reset");
    }

    /// Bad arguments: a class-22 SQLSTATE (42704 for an unknown policy, 42809 for a concurrency one).
    #[pg_test]
    fn bad_batches_are_refused_with_their_sqlstates() {
        Spi::run("SELECT rate_limit.create_policy('pt_batch_bad', 1, '1 hour', 2)")
            .expect("create");
        Spi::run("SELECT rate_limit.create_policy('pt_batch_lease', 2, '1 hour', algorithm => 'concurrency')")
            .expect("create a concurrency policy");
        let code =
            |sql: &str| error_of(sql).map(|e| e.split(':').next().unwrap_or_default().to_string());
        let long = "x".repeat(2049);
        for (sql, sqlstate) in [
            ("SELECT * FROM rate_limit.take_batch(NULL, ARRAY['a'])", "22004"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_bad', NULL)", "22004"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_bad', ARRAY['a', NULL])", "22004"),
            (&format!("SELECT * FROM rate_limit.take_batch('pt_batch_bad', ARRAY['{long}'])"), "22023"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_bad', ARRAY['a'], ARRAY[1, 2])", "22023"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_bad', ARRAY['a'], ARRAY[NULL::int])", "22004"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_bad', ARRAY['a'], ARRAY[-1])", "22023"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_bad', ARRAY['a'], NULL, NULL)", "22004"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_bad', ARRAY['a', 'a'], NULL, true)", "22023"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_bad', ARRAY['a', 'b'], ARRAY[1, 2], true)", "22023"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_bad', \
              (SELECT array_agg(i::text) FROM generate_series(1, 17) i), NULL, true)", "22023"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_bad', \
              array_fill('k'::text, ARRAY[1000001]))", "22023"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_none', ARRAY['a'])", "42704"),
            ("SELECT * FROM rate_limit.take_batch('pt_batch_lease', ARRAY['a'])", "42809"),
        ] {
            assert_eq!(code(sql).as_deref(), Some(sqlstate), "{sql}");
        }
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.buckets WHERE policy = 'pt_batch_bad'"),
            0,
            "a refused batch takes nothing"
        );
    }

    /// A batch's result rows stay in memory when they fit in 64 MB (beyond `work_mem`), and never take
    /// more: a larger result spills to a temporary file as any set in PostgreSQL does.
    #[pg_test]
    fn a_batchs_result_rows_stay_in_memory_up_to_the_bound() {
        use crate::bounds::{batch_result_kb, MAX_BATCH_RESULT_KB};
        Spi::run("SET LOCAL work_mem = '4MB'").expect("work_mem");
        assert_eq!(batch_result_kb(&["a"; 10]), 4096, "work_mem at least");
        // 100 000 keys of 10 bytes: 138 bytes a row, about 13 MB, all in memory
        assert_eq!(batch_result_kb(&["0123456789"; 100_000]), 13_477);
        let most = i32::try_from(MAX_BATCH_RESULT_KB).expect("fits");
        assert_eq!(batch_result_kb(&["0123456789"; 1_000_000]), most);
        Spi::run("SET LOCAL work_mem = '100MB'").expect("work_mem");
        assert_eq!(
            batch_result_kb(&["0123456789"; 1_000_000]),
            102_400,
            "work_mem if larger"
        );
    }
}
