//! The extension's own functions: the triggers of its tables, and what its views and statements call.

use super::{internal, Access, Function, Route, Schema, Use};

/// The triggers and internal functions.
pub const INTERNAL: &[Function] = &[
    // the owner's: no other role may attach it to a table of its own (CREATE TRIGGER needs EXECUTE), and
    // it refuses to fire on any table but the two it is made for: a commit of a role's own table never
    // makes other backends forget what they cached
    Function {
        name: "policies_changed",
        arguments: "",
        schema: Schema::RateLimit,
        access: Access::Owner,
        purpose: Use::OwnTrigger,
        key: None,
        route: Route::NotForwarded,
        doc: None,
        ..Function::UNDECLARED
    }
    .declared("", "trigger")
    .in_c("policies_changed_wrapper", "VOLATILE PARALLEL UNSAFE")
    .since("0.2.0")
    .commented(
        "Trigger: a change of rate_limit.policies or rate_limit.key_overrides is seen by every \
        backend's next transaction; a direct call is refused",
    ),
    Function {
        name: "policies_dropped",
        arguments: "",
        schema: Schema::RateLimit,
        access: Access::Owner,
        purpose: Use::OwnTrigger,
        key: None,
        route: Route::NotForwarded,
        doc: None,
        ..Function::UNDECLARED
    }
    .declared("", "trigger")
    .since("0.4.0")
    .commented("Trigger: records dropped policies in rate_limit.dropped_policies, for the memory store"),
    internal("memory_buckets", "", Access::Owner)
    .declared(
        "",
        "TABLE(kind text, policy text, key text, tokens numeric, \"limit\" bigint, rate bigint, \
        per interval, algorithm text, updated_at timestamp with time zone)",
    )
    .in_c("memory_buckets_wrapper", "VOLATILE STRICT SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.2.0")
    .commented("Internal: buckets of the memory store, for rate_limit.buckets"),
    internal("stats_rows", "", Access::Owner)
    .declared(
        "",
        "TABLE(kind text, policy text, calls bigint, granted bigint, denied bigint, \
        tokens_granted bigint, last_denial timestamp with time zone, since timestamp with time \
        zone)",
    )
    .in_c("stats_rows_wrapper", "VOLATILE STRICT PARALLEL UNSAFE")
    .since("0.3.0")
    .commented("Internal: the rows of rate_limit.stats"),
    internal("metrics_rows", "", Access::Monitor)
    .declared(
        "",
        "TABLE(kind text, policy text, calls bigint, granted bigint, denied bigint, shadow_denied \
        bigint, blocked bigint, tokens_granted bigint)",
    )
    .in_c("metrics_rows_wrapper", "VOLATILE STRICT PARALLEL UNSAFE")
    .since("0.5.0")
    .commented("Internal: the rows of rate_limit.metrics"),
    internal("node_metrics_rows", "", Access::Monitor)
    .declared(
        "",
        "TABLE(kind text, policy text, calls bigint, granted bigint, denied bigint, shadow_denied \
        bigint, blocked bigint, tokens_granted bigint)",
    )
    .in_c("node_metrics_rows_wrapper", "VOLATILE STRICT PARALLEL UNSAFE")
    .since("0.5.0")
    .commented(
        "Internal: this node's own rows of rate_limit.metrics (on a Citus coordinator the view \
        sums every node's)",
    ),
    internal("leases_held_rows", "", Access::Monitor)
    .declared("", "TABLE(policy text, held bigint)")
    .since("0.5.0")
    .commented("Internal: the leases held of each concurrency policy, for rate_limit.metrics_policies"),
    internal("adaptive_limits_rows", "", Access::Monitor)
    .declared(
        "",
        "TABLE(policy text, limited_keys bigint, lowest_limit double precision, mean_limit double \
        precision)",
    )
    .since("0.5.0")
    .commented(
        "Internal: each adaptive concurrency policy's keys under a cut limit, for \
        rate_limit.metrics_policies",
    ),
    internal("purge_rows", "", Access::Monitor)
    .declared("", "TABLE(store text, finished_at timestamp with time zone, freed bigint)")
    .in_c("purge_rows_wrapper", "VOLATILE STRICT PARALLEL UNSAFE")
    .since("0.5.0")
    .commented("Internal: the rows of rate_limit.metrics_purge"),
    internal("purge_span", "interval, text, text", Access::Owner)
    .declared(
        "idle interval, after_namespace text, after_key text",
        "TABLE(deleted bigint, next_namespace text, next_key text)",
    )
    .in_c("purge_span_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .commented(
        "Internal: one transaction of rate_limit.purge_idle, the next 1000 rows after the one named",
    ),
    internal("metrics_top_keys_rows", "", Access::Monitor)
    .declared("", "TABLE(kind text, policy text, rank integer, key text, denials bigint)")
    .in_c("metrics_top_keys_rows_wrapper", "VOLATILE STRICT PARALLEL UNSAFE")
    .since("0.5.0")
    .commented("Internal: the rows of rate_limit.metrics_top_keys"),
    internal("top_limited_rows", "", Access::Owner)
    .declared(
        "",
        "TABLE(kind text, policy text, rank integer, key text, denials bigint, denials_min bigint)",
    )
    .in_c("top_limited_rows_wrapper", "VOLATILE STRICT PARALLEL UNSAFE")
    .since("0.3.0")
    .commented("Internal: the rows of rate_limit.top_limited"),
    internal(
        "state_after_take",
        "bigint, timestamp with time zone, text, bigint, bigint, bigint, text, bigint, bigint, bigint, \
        timestamp with time zone, timestamp with time zone, bigint, timestamp with time zone",
        Access::Owner,
    )
    .declared(
        "level bigint, updated_at timestamp with time zone, algorithm text, rate bigint, per_us \
        bigint, burst bigint, new_algorithm text, new_rate bigint, new_per_us bigint, new_burst \
        bigint, changed_at timestamp with time zone, now timestamp with time zone, cost bigint, \
        window_end timestamp with time zone",
        "bigint",
    )
    .in_c("state_after_take_at_wrapper", "IMMUTABLE STRICT PARALLEL SAFE")
    .since("0.4.0")
    .commented("Internal: the level of a stored row after a take, or -1 if short (the table store's UPDATE)"),
    internal(
        "state_tokens",
        "bigint, timestamp with time zone, text, bigint, bigint, bigint, timestamp with time zone",
        Access::Owner,
    )
    .declared(
        "level bigint, updated_at timestamp with time zone, algorithm text, rate bigint, per_us \
        bigint, burst bigint, at timestamp with time zone",
        "numeric",
    )
    .in_c("state_tokens_wrapper", "IMMUTABLE STRICT PARALLEL SAFE")
    .since("0.2.0")
    .commented("Internal: tokens of a stored row at a given time, exact to the millionth"),
    internal(
        "state_is_full",
        "bigint, timestamp with time zone, text, bigint, bigint, bigint, timestamp with time zone",
        Access::Owner,
    )
    .declared(
        "level bigint, updated_at timestamp with time zone, algorithm text, rate bigint, per_us \
        bigint, burst bigint, at timestamp with time zone",
        "boolean",
    )
    .in_c("state_is_full_wrapper", "IMMUTABLE STRICT PARALLEL SAFE")
    .since("0.2.0")
    .commented("Internal: whether a stored row is full at a given time"),
];
