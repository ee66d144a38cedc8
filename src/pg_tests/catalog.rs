//! The SQL surface as the catalog holds it: exactly the functions of `surface`, with their privileges,
//! comments and key parameters; no per-call settings, SECURITY DEFINER where state is touched, no
//! same-arity overloads, and the buckets view naming kinds and policies as the model does.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{int, text};
    use crate::surface::{Access, Schema, Use, FUNCTIONS};

    /// Every function the extension owns is in the surface's table and nothing else is; each one's
    /// schema, EXECUTE for PUBLIC (as sql/finalize.sql grants it), comment, and key parameter are what the
    /// table says. A new function fails here until it has its entry (and a comment).
    #[pg_test]
    fn the_surface_is_the_catalog() {
        let query = "SELECT p.proname || '(' || pg_catalog.oidvectortypes(p.proargtypes) || ')', \
                        n.nspname = 'rate_limit', \
                        pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE'), \
                        pg_catalog.has_function_privilege('pg_monitor', p.oid, 'EXECUTE'), \
                        pg_catalog.obj_description(p.oid, 'pg_proc'), \
                        coalesce(pg_catalog.array_to_string(p.proargnames, ','), '') \
                     FROM pg_catalog.pg_proc p \
                     JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
                     JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::regclass \
                       AND d.objid = p.oid AND d.deptype = 'e' \
                     JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'rate_limit' \
                     WHERE n.nspname <> 'tests'";
        type Row = (String, bool, bool, bool, Option<String>, String);
        let catalog: Vec<Row> = Spi::connect(|client| {
            client
                .select(query, None, &[])?
                .map(|r| {
                    Ok((
                        r.get(1)?.unwrap_or_default(),
                        r.get(2)?.unwrap_or_default(),
                        r.get(3)?.unwrap_or_default(),
                        r.get(4)?.unwrap_or_default(),
                        r.get(5)?,
                        r.get(6)?.unwrap_or_default(),
                    ))
                })
                .collect::<Result<Vec<Row>, pgrx::spi::SpiError>>()
        })
        .expect("the catalog");
        let mut listed: Vec<String> = FUNCTIONS.iter().map(|f| f.signature()).collect();
        listed.sort();
        // (the #[pg_test]s themselves are functions of this build, in schema tests)
        let mut found: Vec<String> = catalog.iter().map(|r| r.0.clone()).collect();
        found.sort();
        assert_eq!(
            found, listed,
            "the extension's functions are the surface's table"
        );
        for (signature, in_rate_limit, public, monitor, comment, parameters) in catalog {
            let f = FUNCTIONS
                .iter()
                .find(|f| f.signature() == signature)
                .expect("listed");
            assert_eq!(
                in_rate_limit,
                f.schema == Schema::RateLimit,
                "{signature}: schema"
            );
            assert_eq!(
                public,
                f.access == Access::Public,
                "{signature}: EXECUTE for PUBLIC"
            );
            assert_eq!(
                monitor,
                matches!(f.access, Access::Public | Access::Monitor),
                "{signature}: EXECUTE for pg_monitor"
            );
            let comment = comment.unwrap_or_else(|| panic!("{signature} has no comment"));
            if f.purpose == Use::Internal {
                assert!(comment.starts_with("Internal:"), "{signature}: {comment}");
            }
            if f.access == Access::Owner && f.purpose == Use::Call {
                assert!(comment.ends_with("owner only"), "{signature}: {comment}");
            }
            if let Some(key) = f.key {
                assert!(
                    parameters.split(',').any(|p| p == key),
                    "{signature}: no parameter {key}"
                );
            }
            assert_eq!(
                f.doc.is_some(),
                matches!(f.purpose, Use::Call | Use::UserTrigger),
                "{signature}: documented"
            );
        }
    }

    /// The view's CASE for table rows and the model's `Kind::of_stored_name` (used for memory buckets and
    /// statistics) name every namespace alike.
    #[pg_test]
    fn the_buckets_view_names_kinds_as_the_model_does() {
        use rate_limit_model::target::Kind;
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
        // that read shared memory only (memory usage, statistics, metrics: closed to PUBLIC instead), and
        // distribute (closed to PUBLIC; Citus checks the caller's own rights on what it distributes)
        assert_eq!(
            text(
                "SELECT string_agg(DISTINCT p.proname, ' ' ORDER BY p.proname) FROM pg_proc p \
                 WHERE p.pronamespace = 'rate_limit'::regnamespace AND NOT p.prosecdef"
            )
            .as_deref(),
            Some(
                "clock_shift distribute headers memory_shares memory_usage metrics_rows metrics_top_keys_rows \
                 node_metrics_rows node_stats_rows node_top_limited_rows policies_changed policies_dropped \
                 purge_rows reset_stats state_after_take state_is_full state_tokens stats_rows top_limited_rows"
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
}
