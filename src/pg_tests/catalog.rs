//! The SQL surface as the catalog holds it: exactly the functions of `surface`, with their privileges,
//! comments and key parameters; no per-call settings, SECURITY DEFINER where state is touched, no
//! same-arity overloads, and the buckets view naming kinds and policies as the model does.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{int, text};
    use crate::surface::{functions, Access, Body, Kind, Schema, Use};

    /// Every function the extension owns is in the surface's table and nothing else is; each one's
    /// schema, EXECUTE for PUBLIC and pg_monitor, comment, key parameter, parameters, result, language,
    /// symbol and attributes are what the table says: what pgrx's schema made is what the SQL generated from
    /// the table (its privileges and comments, an upgrade's CREATE FUNCTION, the router's forwarding)
    /// assumes. A new function fails here until it has its entry.
    #[pg_test]
    fn the_surface_is_the_catalog() {
        let query = "SELECT p.proname || '(' || pg_catalog.oidvectortypes(p.proargtypes) || ')', \
                        n.nspname = 'rate_limit', \
                        pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE'), \
                        pg_catalog.has_function_privilege('pg_monitor', p.oid, 'EXECUTE'), \
                        pg_catalog.obj_description(p.oid, 'pg_proc'), \
                        coalesce(pg_catalog.array_to_string(p.proargnames, ','), ''), \
                        pg_catalog.pg_get_function_arguments(p.oid), \
                        p.prokind = 'p', \
                        pg_catalog.pg_get_function_result(p.oid), \
                        CASE WHEN l.lanname = 'c' THEN p.prosrc END, \
                        CASE p.provolatile WHEN 'v' THEN 'VOLATILE' WHEN 's' THEN 'STABLE' \
                          ELSE 'IMMUTABLE' END \
                        || CASE WHEN p.proisstrict THEN ' STRICT' ELSE '' END \
                        || CASE WHEN p.prosecdef THEN ' SECURITY DEFINER' ELSE '' END \
                        || CASE p.proparallel WHEN 's' THEN ' PARALLEL SAFE' \
                          WHEN 'r' THEN ' PARALLEL RESTRICTED' ELSE ' PARALLEL UNSAFE' END \
                     FROM pg_catalog.pg_proc p \
                     JOIN pg_catalog.pg_language l ON l.oid = p.prolang \
                     JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
                     JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::regclass \
                       AND d.objid = p.oid AND d.deptype = 'e' \
                     JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'rate_limit' \
                     WHERE n.nspname <> 'tests'";
        /// What the catalog says of one function.
        struct Row {
            signature: String,
            in_rate_limit: bool,
            public: bool,
            monitor: bool,
            comment: Option<String>,
            names: String,
            parameters: String,
            procedure: bool,
            result: String,
            symbol: Option<String>,
            attributes: String,
        }
        let catalog: Vec<Row> = Spi::connect(|client| {
            client
                .select(query, None, &[])?
                .map(|r| {
                    Ok(Row {
                        signature: r.get(1)?.unwrap_or_default(),
                        in_rate_limit: r.get(2)?.unwrap_or_default(),
                        public: r.get(3)?.unwrap_or_default(),
                        monitor: r.get(4)?.unwrap_or_default(),
                        comment: r.get(5)?,
                        names: r.get(6)?.unwrap_or_default(),
                        parameters: r.get(7)?.unwrap_or_default(),
                        procedure: r.get(8)?.unwrap_or_default(),
                        result: r.get(9)?.unwrap_or_default(),
                        symbol: r.get(10)?,
                        attributes: r.get(11)?.unwrap_or_default(),
                    })
                })
                .collect::<Result<Vec<Row>, pgrx::spi::SpiError>>()
        })
        .expect("the catalog");
        let mut listed: Vec<String> = functions().map(|f| f.signature()).collect();
        listed.sort();
        // (the #[pg_test]s themselves are functions of this build, in schema tests)
        let mut found: Vec<String> = catalog.iter().map(|r| r.signature.clone()).collect();
        found.sort();
        assert_eq!(
            found, listed,
            "the extension's functions are the surface's table"
        );
        for row in catalog {
            let signature = row.signature;
            let f = functions()
                .find(|f| f.signature() == signature)
                .expect("listed");
            assert_eq!(
                row.in_rate_limit,
                f.schema == Schema::RateLimit,
                "{signature}: schema"
            );
            assert_eq!(
                row.public,
                f.access == Access::Public,
                "{signature}: EXECUTE for PUBLIC"
            );
            assert_eq!(
                row.monitor,
                matches!(f.access, Access::Public | Access::Monitor),
                "{signature}: EXECUTE for pg_monitor"
            );
            let comment = row
                .comment
                .unwrap_or_else(|| panic!("{signature} has no comment"));
            assert_eq!(comment, f.comment, "{signature}: comment");
            assert_eq!(
                row.procedure,
                f.kind == Kind::Procedure,
                "{signature}: a procedure"
            );
            // PostgreSQL 14 and later print a procedure's parameters with their mode (IN), 13 without
            let parameters = if row.procedure {
                row.parameters
                    .split(", ")
                    .map(|p| p.strip_prefix("IN ").unwrap_or(p))
                    .collect::<Vec<_>>()
                    .join(", ")
            } else {
                row.parameters
            };
            assert_eq!(parameters, f.parameters, "{signature}: parameters");
            assert_eq!(row.result, f.result, "{signature}: result");
            let body = row.symbol.map(|symbol| (symbol, row.attributes));
            match f.body {
                Body::C { symbol, attributes } => assert_eq!(
                    body,
                    Some((symbol.to_string(), attributes.to_string())),
                    "{signature}: C symbol and attributes"
                ),
                Body::Sql => assert_eq!(body, None, "{signature}: written in SQL"),
            }
            assert!(!f.since.is_empty(), "{signature}: since");
            if f.purpose == Use::Internal {
                assert!(comment.starts_with("Internal:"), "{signature}: {comment}");
            }
            if f.access == Access::Owner && f.purpose == Use::Call {
                assert!(comment.ends_with("owner only"), "{signature}: {comment}");
            }
            if let Some(key) = f.key {
                assert!(
                    row.names.split(',').any(|p| p == key),
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
        // distribute (closed to PUBLIC; Citus checks the caller's own rights on what it distributes);
        // and allow, which runs as its owner by switching itself (api/allow.rs; tested by
        // allow_runs_as_its_owner_for_a_role_without_rights); and purge_idle, a procedure that commits
        // (which SECURITY DEFINER forbids), closed to PUBLIC, calling the SECURITY DEFINER purge_span
        assert_eq!(
            text(
                "SELECT string_agg(DISTINCT p.proname, ' ' ORDER BY p.proname) FROM pg_proc p \
                 WHERE p.pronamespace = 'rate_limit'::regnamespace AND NOT p.prosecdef"
            )
            .as_deref(),
            Some(
                "allow clock_shift distribute headers memory_shares memory_usage metrics_rows metrics_top_keys_rows \
                 node_metrics_rows node_stats_rows node_top_limited_rows policies_changed policies_dropped \
                 purge_idle purge_rows reset_stats state_after_take state_is_full state_tokens stats_rows top_limited_rows"
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
