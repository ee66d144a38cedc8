//! The administration's calls: policies and overrides, the purge, the clock shift, the memory store's
//! usage and shares, statistics resets, and Citus's distribution and per-node rows.

use super::{call, Access, Function, Route};

/// The administration's calls, in the reference's order (after [`super::calls::CALLS`]).
pub const ADMIN: &[Function] = &[
    call(
        "create_policy",
        "text, bigint, interval, bigint, text, text, boolean, bigint, text, timestamp without time zone, \
        bigint, interval, jsonb",
        Access::Owner,
        Route::EveryPartition,
        "#policies",
    )
    .declared(
        "name text, rate bigint, per interval, burst bigint DEFAULT NULL::bigint, algorithm text \
        DEFAULT 'token_bucket'::text, store text DEFAULT NULL::text, shadow boolean DEFAULT \
        false, max_debt bigint DEFAULT 0, time_zone text DEFAULT NULL::text, anchor timestamp \
        without time zone DEFAULT NULL::timestamp without time zone, block_after bigint DEFAULT \
        NULL::bigint, block_for interval DEFAULT NULL::interval, options jsonb DEFAULT \
        NULL::jsonb",
        "void",
    )
    .in_c("create_policy_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.4.0")
    .commented(
        "Create a named policy: rate tokens per per, at most burst; algorithm, store, shadow, \
        max_debt, time_zone, anchor, block_after, block_for and options (jsonb, by name) \
        optional; owner only",
    ),
    call(
        "alter_policy",
        "text, bigint, interval, bigint, text, boolean, bigint, text, timestamp without time zone, bigint, \
        interval, jsonb",
        Access::Owner,
        Route::EveryPartition,
        "#policies",
    )
    .declared(
        "name text, rate bigint DEFAULT NULL::bigint, per interval DEFAULT NULL::interval, burst \
        bigint DEFAULT NULL::bigint, algorithm text DEFAULT NULL::text, shadow boolean DEFAULT \
        NULL::boolean, max_debt bigint DEFAULT NULL::bigint, time_zone text DEFAULT NULL::text, \
        anchor timestamp without time zone DEFAULT NULL::timestamp without time zone, \
        block_after bigint DEFAULT NULL::bigint, block_for interval DEFAULT NULL::interval, \
        options jsonb DEFAULT NULL::jsonb",
        "void",
    )
    .in_c("alter_policy_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.4.0")
    .commented(
        "Change a policy (NULL keeps a value; in options, an option left out keeps its value and \
        null clears it); buckets carry their tokens over, never gaining any; owner only",
    ),
    call(
        "drop_policy",
        "text",
        Access::Owner,
        Route::EveryPartition,
        "#policies",
    )
    .declared("name text", "boolean")
    .in_c("drop_policy_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.1.0")
    .commented("Drop a policy, its overrides and its table-store buckets; owner only"),
    call(
        "set_override",
        "text, text, bigint, interval, bigint, text, timestamp with time zone, text",
        Access::Owner,
        Route::EveryPartition,
        "#per-key-overrides",
    )
    .declared(
        "policy text, key text, rate bigint DEFAULT NULL::bigint, per interval DEFAULT \
        NULL::interval, burst bigint DEFAULT NULL::bigint, action text DEFAULT 'limit'::text, \
        until timestamp with time zone DEFAULT NULL::timestamp with time zone, note text DEFAULT \
        NULL::text",
        "void",
    )
    .in_c("set_override_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .commented(
        "Give one key of a policy its own rate, per or burst (action limit), or deny or exempt \
        it, until a time or for ever; owner only",
    ),
    call(
        "clear_override",
        "text, text",
        Access::Owner,
        Route::EveryPartition,
        "#per-key-overrides",
    )
    .declared("policy text, key text", "boolean")
    .in_c("clear_override_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .commented(
        "Remove the override of a key: it follows its policy again; true if there was one; owner \
        only",
    ),
    call(
        "purge",
        "",
        Access::Owner,
        Route::EveryPartition,
        "#rate_limitbuckets-rate_limitpurge",
    )
    .declared("", "bigint")
    .in_c("purge_wrapper", "VOLATILE STRICT SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.2.0")
    .commented(
        "Delete every bucket of both stores that is full now (lossless); returns how many; owner \
        only",
    ),
    call(
        "purge_idle",
        "interval",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitpurge_idle",
    )
    .procedure()
    .declared("idle interval DEFAULT '00:05:00'::interval", "")
    .since("0.5.0")
    .commented(
        "Delete the full buckets untouched for idle, 1000 rows a transaction (CALL it on its own, as \
        pg_cron does); owner only",
    ),
    call(
        "clock_shift",
        "",
        Access::Public,
        Route::NotForwarded,
        "#rate_limitclock_shift",
    )
    .declared("", "interval")
    .in_c("clock_shift_wrapper", "VOLATILE STRICT PARALLEL SAFE")
    .since("0.4.0")
    .commented(
        "How far the table store's clock is behind clock_timestamp() (non-zero after promoting a \
        standby whose clock was off)",
    ),
    call(
        "memory_usage",
        "",
        Access::Public,
        Route::NotForwarded,
        "#rate_limitmemory_usage",
    )
    .declared(
        "",
        "TABLE(max_buckets bigint, buckets bigint, partitions bigint, slots bigint, slot_bytes \
        bigint, total_bytes bigint, bytes_per_bucket bigint, lossless_evictions bigint, \
        lossy_evictions bigint, refused_full bigint, share_percent bigint, share_buckets bigint, \
        database_buckets bigint, role_share_percent bigint, role_share_buckets bigint, \
        role_buckets bigint)",
    )
    .in_c("memory_usage_wrapper", "VOLATILE STRICT PARALLEL UNSAFE")
    .since("0.4.0")
    .commented(
        "Size and use of the memory store: buckets, slots, bytes per bucket, evictions, this \
        database's and this role's shares",
    ),
    call(
        "memory_shares",
        "",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitmemory_usage",
    )
    .declared("", "TABLE(database text, buckets bigint)")
    .in_c("memory_shares_wrapper", "VOLATILE STRICT PARALLEL UNSAFE")
    .since("0.4.0")
    .commented("Buckets each database holds in the memory store; owner only"),
    call(
        "reset_stats",
        "",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitstats-rate_limittop_limited-rate_limitreset_stats",
    )
    .declared("", "bigint")
    .in_c("reset_all_stats_wrapper", "VOLATILE STRICT PARALLEL UNSAFE")
    .since("0.4.0")
    .commented("Zero every statistic and top limited key of this database; owner only"),
    call(
        "reset_stats",
        "text",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitstats-rate_limittop_limited-rate_limitreset_stats",
    )
    .declared("policy text", "bigint")
    .in_c("reset_stats_wrapper", "VOLATILE PARALLEL UNSAFE")
    .since("0.4.0")
    .commented("Zero the statistics and top limited keys of a policy in this database; owner only"),
    call(
        "distribute",
        "integer",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitdistribute",
    )
    .declared("shard_count integer DEFAULT NULL::integer", "TABLE(object text, action text)")
    .in_c("distribute_wrapper", "VOLATILE PARALLEL UNSAFE")
    .since("0.4.0")
    .commented(
        "On a Citus coordinator: policies as a reference table, state distributed by key, keyed \
        calls delegated to the key's node; idempotent; owner only",
    ),
    call(
        "nodes_of",
        "text[]",
        Access::Public,
        Route::NotForwarded,
        "#rate_limitnodes_of",
    )
    .declared("keys text[]", "TABLE(key text, host text, port integer, shard bigint)")
    .in_c("nodes_of_wrapper", "STABLE SECURITY DEFINER PARALLEL SAFE")
    .since("0.5.0")
    .commented(
        "Under Citus, the node (host, port) and shard that hold each key, in the order given: \
        where to send its calls",
    ),
    call(
        "node_stats_rows",
        "",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitdistribute",
    )
    .declared(
        "",
        "TABLE(kind text, policy text, calls bigint, granted bigint, denied bigint, \
        tokens_granted bigint, last_denial timestamp with time zone, since timestamp with time \
        zone)",
    )
    .in_c("node_stats_rows_wrapper", "VOLATILE STRICT PARALLEL UNSAFE")
    .since("0.4.0")
    .commented(
        "This node's own rows of rate_limit.stats (on a Citus coordinator the view merges every \
        node's); owner only",
    ),
    call(
        "node_top_limited_rows",
        "",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitdistribute",
    )
    .declared(
        "",
        "TABLE(kind text, policy text, rank integer, key text, denials bigint, denials_min bigint)",
    )
    .in_c("node_top_limited_rows_wrapper", "VOLATILE STRICT PARALLEL UNSAFE")
    .since("0.4.0")
    .commented(
        "This node's own rows of rate_limit.top_limited (on a Citus coordinator the view merges \
        every node's); owner only",
    ),
    call(
        "node_memory_buckets",
        "",
        Access::Owner,
        Route::NotForwarded,
        "#rate_limitdistribute",
    )
    .declared(
        "",
        "TABLE(kind text, policy text, key text, tokens numeric, \"limit\" bigint, rate bigint, \
        per interval, algorithm text, updated_at timestamp with time zone)",
    )
    .in_c("node_memory_buckets_rows_wrapper", "VOLATILE STRICT SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.4.0")
    .commented(
        "This node's own memory-store buckets (on a Citus coordinator rate_limit.buckets lists \
        every node's); owner only",
    ),
];
