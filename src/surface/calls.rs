//! The functions users call, and the trigger function they attach to their own tables.

use super::{call, keyed, Access, Function, Route, Schema, Use};

/// The calls, in the reference's order.
pub const CALLS: &[Function] = &[
    Function {
        name: "rate_limiting_request",
        arguments: "text, integer, integer",
        schema: Schema::Extension,
        access: Access::Public,
        purpose: Use::Call,
        key: Some("id"),
        route: Route::KeysPartition,
        doc: Some("#rate_limiting_request"),
        ..Function::UNDECLARED
    }
    .declared(
        "id text, refill_per_sec integer DEFAULT 2, window_seconds integer DEFAULT 60",
        "integer",
    )
    .in_c("rate_limiting_request_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.1.0")
    .takes_tokens()
    .commented(
        "Take one token from bucket id (refill_per_sec tokens/s, capacity refill_per_sec * \
        window_seconds); returns the whole tokens left, or -1 when denied",
    ),
    keyed(
        "peek_request",
        "text, integer, integer",
        Access::Public,
        "id",
        "#rate_limitpeek_request-rate_limittokens",
    )
    .declared(
        "id text, refill_per_sec integer DEFAULT 2, window_seconds integer DEFAULT 60",
        "bigint",
    )
    .in_c("peek_request_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.2.0")
    .commented(
        "Whole tokens in rate_limiting_request's bucket id now under the given limit; consumes \
        nothing",
    ),
    keyed(
        "tokens",
        "text, integer, integer",
        Access::Public,
        "id",
        "#rate_limitpeek_request-rate_limittokens",
    )
    .declared(
        "id text, refill_per_sec integer DEFAULT 2, window_seconds integer DEFAULT 60",
        "numeric",
    )
    .in_c("tokens_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.1.0")
    .commented(
        "Tokens in rate_limiting_request's bucket id now under the given limit, exact to the \
        millionth",
    ),
    keyed("reset_request", "text", Access::Owner, "id", "#resets")
    .declared("id text", "boolean")
    .in_c("reset_request_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.2.0")
    .commented("Delete rate_limiting_request's bucket id, making it full; true if it existed; owner only"),
    keyed(
        "take",
        "text, text, integer",
        Access::Public,
        "key",
        "#rate_limittake",
    )
    .declared("policy text, key text, cost integer DEFAULT 1", "rate_limit.decision")
    .in_c("take_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.2.0")
    .takes_tokens()
    .commented(
        "Take cost tokens (0 only reports) from bucket key of a named policy; returns a \
        rate_limit.decision",
    ),
    keyed(
        "allow",
        "text, text, integer",
        Access::Public,
        "key",
        "#rate_limitallow",
    )
    .declared("policy text, key text, cost integer DEFAULT 1", "boolean")
    .in_c("allow_wrapper", "VOLATILE PARALLEL UNSAFE")
    .since("0.5.0")
    .takes_tokens()
    .commented(
        "Take cost tokens from bucket key of a named policy, as take does; true when allowed (a shadow \
        policy's would-be denial too)",
    ),
    call(
        "take_many",
        "text[], text[], integer",
        Access::Public,
        Route::FirstKeysPartition,
        "#rate_limittake_many",
    )
    .declared("policies text[], keys text[], cost integer DEFAULT 1", "rate_limit.decision")
    .in_c("take_many_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.2.0")
    .takes_tokens()
    .commented(
        "Take cost tokens under every policy, all or nothing: keys holds one key for all, or one \
        per policy",
    ),
    call(
        "take_batch",
        "text, text[], integer[], boolean",
        Access::Public,
        Route::NotForwarded,
        "#rate_limittake_batch",
    )
    .declared(
        "policy text, keys text[], costs integer[] DEFAULT NULL::integer[], all_or_nothing \
        boolean DEFAULT false",
        "TABLE(ordinality integer, key text, allowed boolean, remaining bigint, retry_after interval)",
    )
    .in_c("take_batch_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .takes_tokens()
    .commented(
        "Take costs[i] tokens (1 each by default) from bucket keys[i] of a policy for every key \
        in order; one row per key",
    ),
    keyed(
        "take_ad_hoc",
        "text, bigint, interval, bigint, integer",
        Access::Public,
        "key",
        "#rate_limittake_ad_hoc",
    )
    .declared(
        "key text, rate bigint, per interval, burst bigint DEFAULT NULL::bigint, cost integer DEFAULT 1",
        "rate_limit.decision",
    )
    .in_c("take_ad_hoc_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.1.0")
    .takes_tokens()
    .commented("Take cost tokens from bucket key under an ad-hoc token bucket: rate per per, at most burst"),
    keyed("peek", "text, text", Access::Public, "key", "#rate_limitpeek")
    .declared("policy text, key text", "rate_limit.decision")
    .in_c("peek_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.2.0")
    .commented("The bucket of key under a policy, taking nothing"),
    keyed(
        "wait",
        "text, text, integer, interval",
        Access::Public,
        "key",
        "#rate_limitwait",
    )
    .declared(
        "policy text, key text, cost integer DEFAULT 1, timeout interval DEFAULT NULL::interval",
        "rate_limit.decision",
    )
    .in_c("wait_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.1.0")
    .takes_tokens()
    .commented(
        "Sleep until cost tokens can be taken (or give up at timeout, taking nothing); returns \
        the decision",
    ),
    keyed(
        "charge",
        "text, text, bigint",
        Access::Public,
        "key",
        "#rate_limitcharge",
    )
    .declared("policy text, key text, cost bigint", "rate_limit.decision")
    .in_c("charge_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.4.0")
    .takes_tokens()
    .commented(
        "Charge cost tokens to bucket key of a policy after the fact: always taken, down to its \
        max_debt below zero",
    ),
    keyed(
        "acquire",
        "text, text",
        Access::Public,
        "key",
        "#rate_limitacquire-rate_limitrelease",
    )
    .declared("policy text, key text", "rate_limit.decision")
    .in_c("acquire_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.4.0")
    .takes_tokens()
    .commented(
        "Acquire a lease of key under a concurrency policy: the decision, with the lease id when \
        allowed",
    ),
    keyed(
        "release",
        "text, text, bigint",
        Access::Public,
        "key",
        "#rate_limitacquire-rate_limitrelease",
    )
    .declared("policy text, key text, lease bigint", "boolean")
    .in_c("release_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.4.0")
    .commented("Release a lease acquired with rate_limit.acquire: true if it was held and is now free"),
    keyed(
        "reserve",
        "text, text, bigint, interval",
        Access::Public,
        "key",
        "#rate_limitreserve-rate_limitsettle",
    )
    .declared(
        "policy text, key text, estimate bigint, hold interval DEFAULT '00:05:00'::interval",
        "rate_limit.decision",
    )
    .in_c("reserve_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .takes_tokens()
    .commented(
        "Reserve estimate tokens of key under a policy until settled or hold ends: the decision, with \
        the reservation id in lease when allowed",
    ),
    keyed(
        "settle",
        "text, text, bigint, bigint",
        Access::Public,
        "key",
        "#rate_limitreserve-rate_limitsettle",
    )
    .declared(
        "policy text, key text, reservation bigint, actual bigint",
        "rate_limit.decision",
    )
    .in_c("settle_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .commented(
        "Settle a reservation on the tokens actually used: gives back the rest or charges the excess, \
        once; allowed when this call settled it",
    ),
    keyed(
        "refund",
        "text, text, bigint",
        Access::Owner,
        "key",
        "#rate_limitrefund",
    )
    .declared("policy text, key text, tokens bigint", "rate_limit.decision")
    .in_c("refund_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.1.0")
    .commented("Put tokens back into bucket key of a policy, capped at its burst; owner only"),
    keyed("reset", "text, text", Access::Owner, "key", "#resets")
    .declared("policy text, key text", "boolean")
    .in_c("reset_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.2.0")
    .commented("Delete bucket key of a policy, making it full; owner only"),
    keyed("reset_ad_hoc", "text", Access::Owner, "key", "#resets")
    .declared("key text", "boolean")
    .in_c("reset_ad_hoc_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.2.0")
    .commented("Delete the ad-hoc bucket key, making it full; owner only"),
    keyed(
        "block",
        "text, text, interval",
        Access::Owner,
        "key",
        "#blocks-rate_limitblock-rate_limitunblock",
    )
    .declared("policy text, key text, duration interval", "rate_limit.decision")
    .in_c("block_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.4.0")
    .commented(
        "Block key under a policy for duration: its calls are denied without touching its bucket; \
        owner only",
    ),
    keyed(
        "unblock",
        "text, text",
        Access::Owner,
        "key",
        "#blocks-rate_limitblock-rate_limitunblock",
    )
    .declared("policy text, key text", "boolean")
    .in_c("unblock_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.4.0")
    .commented(
        "Lift the block of key under a policy and forget its penalty box count; true if it was \
        blocked; owner only",
    ),
    call(
        "headers",
        "rate_limit.decision, text",
        Access::Public,
        Route::AnyPartition,
        "#rate_limitheaders",
    )
    .declared("decision rate_limit.decision, policy text DEFAULT NULL::text", "jsonb")
    .in_c("headers_wrapper", "STABLE PARALLEL SAFE")
    .since("0.1.0")
    .commented("RateLimit, RateLimit-Policy and Retry-After HTTP field values for a decision, as jsonb"),
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
    Function {
        name: "limit_writes",
        arguments: "",
        schema: Schema::RateLimit,
        access: Access::Public,
        purpose: Use::UserTrigger,
        key: None,
        route: Route::NotForwarded,
        doc: Some("#rate_limitlimit_writes"),
        ..Function::UNDECLARED
    }
    .declared("", "trigger")
    .in_c("limit_writes_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.3.0")
    .takes_tokens()
    .commented(
        "Row trigger: limit_writes(policy, key_column [, cost]) takes cost tokens per written row \
        from the bucket of the row's key; a denied row raises 53400 with the RateLimit header \
        values in DETAIL",
    ),
];
