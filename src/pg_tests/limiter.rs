//! The named-policy limiter: peeks and denials that write nothing, the short-denial fast path,
//! multi-limit denials, shadow mode in read-only transactions, charges in both stores, and `allow`, take's
//! answer as a boolean.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{error_of, int, text};

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

    /// Repeated denials of every call of one bucket are answered from the backend's memory of short
    /// buckets, without reading the table, with exact figures computed from the remembered state; a
    /// multi-limit call reads its buckets, whose longest wait only the table knows.
    #[pg_test]
    fn repeated_denials_of_every_call_of_one_bucket_skip_the_table() {
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
                int("SELECT rate_limiting_request('pt_short_r', 1, 1)::bigint"),
                -1
            );
        }
        assert_eq!(reads(), before, "no denial read the table");
        assert_eq!(
            denial("rate_limit.take_many(ARRAY['pt_roomy', 'pt_short'], ARRAY['k'])").as_deref(),
            Some("false:0:pt_short:true")
        );
        assert!(reads() > before, "a multi-limit denial reads its buckets");
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

    /// `allow` takes exactly as `take` does, in both stores, and answers its `allowed`: the same bucket
    /// drained by either, a shadow policy's would-be denial allowed; every bad argument raises take's
    /// SQLSTATE (never a NULL that a caller's `IF NOT allow(...)` would read as allowed).
    #[pg_test]
    fn allow_answers_takes_allowed() {
        for store in ["table", "memory"] {
            let p = format!("pt_allow_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 1, '1 day', burst => 3, store => '{store}')"
            ))
            .expect("policy");
            let answers: Vec<String> = [
                format!("SELECT rate_limit.allow('{p}', 'k', 2)::text"),
                format!("SELECT remaining::text FROM rate_limit.peek('{p}', 'k')"),
                format!("SELECT rate_limit.allow('{p}', 'k', 2)::text"),
                format!("SELECT rate_limit.allow('{p}', 'k')::text"),
                format!("SELECT allowed::text FROM rate_limit.take('{p}', 'k')"),
                format!("SELECT rate_limit.allow('{p}', 'k', 0)::text"),
            ]
            .iter()
            .map(|q| text(q).unwrap_or_default())
            .collect();
            assert_eq!(
                answers,
                ["true", "1", "false", "true", "false", "true"],
                "{p}"
            );
        }
        Spi::run("SELECT rate_limit.create_policy('pt_allow_shadow', 1, '1 day', burst => 1, shadow => true)")
            .expect("policy");
        assert_eq!(
            text(
                "SELECT concat_ws(',', rate_limit.allow('pt_allow_shadow', 'k'), \
                 rate_limit.allow('pt_allow_shadow', 'k'))"
            )
            .as_deref(),
            Some("t,t")
        );
        for (call, sqlstate) in [
            ("rate_limit.allow(NULL, 'k')", "22004"),
            ("rate_limit.allow('pt_allow_table', NULL)", "22004"),
            ("rate_limit.allow('pt_allow_table', 'k', NULL)", "22004"),
            ("rate_limit.allow('pt_allow_table', 'k', -1)", "22023"),
            ("rate_limit.allow('pt_allow_none', 'k')", "42704"),
            (
                "rate_limit.allow('pt_allow_table', repeat('k', 2049))",
                "22023",
            ),
        ] {
            let e = error_of(&format!("SELECT {call}"));
            assert!(
                e.as_deref().is_some_and(|e| e.starts_with(sqlstate)),
                "{call}: {e:?}"
            );
        }
    }

    /// `allow` is not SECURITY DEFINER: it switches to its owner itself (api/allow.rs). A role with no
    /// right on any table of the extension takes through it from both stores (the table store writes
    /// `rate_limit.bucket_state`, which only the owner may), is itself again after the call and after a
    /// call that raised, and still may not read the state table itself.
    #[pg_test]
    fn allow_runs_as_its_owner_for_a_role_without_rights() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_allow_role_table', 1, '1 day', burst => 2, store => 'table');
             SELECT rate_limit.create_policy('pt_allow_role_memory', 1, '1 day', burst => 2, store => 'memory');
             CREATE ROLE pt_allow_nobody",
        )
        .expect("setup");
        assert_eq!(error_of("SELECT 1"), None); // the helper exists before SET ROLE
        Spi::run("SET ROLE pt_allow_nobody").expect("set role");
        for store in ["table", "memory"] {
            let p = format!("pt_allow_role_{store}");
            assert_eq!(
                text(&format!(
                    "SELECT concat_ws(',', rate_limit.allow('{p}', 'k'), rate_limit.allow('{p}', 'k'), \
                     rate_limit.allow('{p}', 'k'))"
                ))
                .as_deref(),
                Some("t,t,f"),
                "{store}"
            );
            assert_eq!(
                text("SELECT current_user::text").as_deref(),
                Some("pt_allow_nobody")
            );
        }
        // the role itself still may not touch the state
        assert_eq!(
            text(
                "SELECT left(pg_temp.error_of('SELECT count(*) FROM rate_limit.bucket_state'), 5)"
            )
            .as_deref(),
            Some("42501")
        );
        // an error inside the call (an unknown policy) leaves the caller's role in place
        assert_eq!(
            text("SELECT left(pg_temp.error_of('SELECT rate_limit.allow(''pt_allow_role_none'', ''k'')'), 5)")
                .as_deref(),
            Some("42704")
        );
        assert_eq!(
            text("SELECT current_user::text").as_deref(),
            Some("pt_allow_nobody")
        );
        Spi::run("RESET ROLE").expect("reset role");
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.buckets WHERE policy = 'pt_allow_role_table' AND key = 'k'"),
            1,
            "the role's takes were written"
        );
    }

    /// `allow` reads a short, inline ASCII text in place and any other form through pgrx's conversion
    /// (api/allow.rs): a non-ASCII key, a 200-byte key (a 4-byte header), a key stored compressed in a
    /// table each take from the same bucket as `take` of that key does; a key too long raises take's 22023
    /// whichever way it was read.
    #[pg_test]
    fn allow_reads_every_form_of_a_text_argument() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_allow_forms', 1, '1 day', burst => 2, store => 'table');
             CREATE TABLE pt_allow_keys (form text, k text);
             INSERT INTO pt_allow_keys VALUES ('ascii', 'k'), ('utf8', 'ключ-🔑'),
               ('long', repeat('x', 200)), ('compressed', repeat('ab', 1020)),
               ('too long compressed', repeat('ab', 1100))",
        )
        .expect("setup");
        assert_eq!(
            int("SELECT count(*) FROM pt_allow_keys WHERE pg_column_size(k) < octet_length(k)"),
            2,
            "the two long repeats are stored compressed"
        );
        for form in ["ascii", "utf8", "long", "compressed"] {
            let answers = text(&format!(
                "SELECT concat_ws(',', rate_limit.allow('pt_allow_forms', k), rate_limit.allow('pt_allow_forms', k), \
                 (SELECT allowed FROM rate_limit.take('pt_allow_forms', k))) FROM pt_allow_keys WHERE form = '{form}'"
            ));
            assert_eq!(answers.as_deref(), Some("t,t,f"), "{form}");
        }
        let too_long = error_of(
            "SELECT rate_limit.allow('pt_allow_forms', k) FROM pt_allow_keys WHERE form = 'too long compressed'",
        );
        assert_eq!(too_long.as_deref().map(|e| &e[..5]), Some("22023"));
    }

    /// The owner `allow` runs as is remembered by the backend (backend.rs), and forgotten when a
    /// function's catalog row changes: after `ALTER FUNCTION ... OWNER TO` a role without rights on the
    /// extension's tables, the next statement's call runs as that role (and is refused reading the
    /// policies, 42501); given back, it takes again.
    #[pg_test]
    fn allow_runs_as_its_new_owner_after_an_owner_change() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_allow_owner', 1, '1 day', burst => 5, store => 'table');
             CREATE ROLE pt_allow_weak_owner",
        )
        .expect("setup");
        let owner = text("SELECT proowner::regrole::text FROM pg_proc WHERE oid = 'rate_limit.allow(text, text, integer)'::regprocedure")
            .expect("allow's owner");
        let call = || {
            error_of("SELECT rate_limit.allow('pt_allow_owner', 'k')").map(|e| e[..5].to_string())
        };
        assert_eq!(call(), None, "as {owner}");
        Spi::run(
            "ALTER FUNCTION rate_limit.allow(text, text, integer) OWNER TO pt_allow_weak_owner",
        )
        .expect("owner changed");
        assert_eq!(call().as_deref(), Some("42501"), "as the new owner");
        Spi::run(&format!(
            "ALTER FUNCTION rate_limit.allow(text, text, integer) OWNER TO {owner}"
        ))
        .expect("owner given back");
        assert_eq!(call(), None, "as {owner} again");
    }
}
