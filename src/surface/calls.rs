//! The functions users call (the administration's are [`super::admin`]'s), and the trigger function they
//! attach to their own tables.

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
        "text, text, bigint, text, interval",
        Access::Public,
        "key",
        "#rate_limitacquire-rate_limitrelease",
    )
    .declared(
        "policy text, key text, lease bigint, outcome text DEFAULT 'ok'::text, latency interval DEFAULT NULL::interval",
        "boolean",
    )
    .in_c("release_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .commented(
        "Release a lease acquired with rate_limit.acquire: true if it was held and is now free; an \
        adaptive policy's limit follows the outcome and latency reported",
    ),
    keyed(
        "reserve",
        "text, text, bigint, interval, jsonb",
        Access::Public,
        "key",
        "#rate_limitreserve-rate_limitsettle",
    )
    .declared(
        "policy text, key text, estimate bigint DEFAULT NULL::bigint, hold interval DEFAULT \
        '00:05:00'::interval, amounts jsonb DEFAULT NULL::jsonb",
        "rate_limit.decision",
    )
    .in_c("reserve_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .takes_tokens()
    .commented(
        "Reserve estimate tokens (or amounts of the policy's meters) of key under a policy until settled \
        or hold ends: the decision, with the reservation id in lease when allowed",
    ),
    keyed(
        "settle",
        "text, text, bigint, bigint, jsonb",
        Access::Public,
        "key",
        "#rate_limitreserve-rate_limitsettle",
    )
    .declared(
        "policy text, key text, reservation bigint, actual bigint DEFAULT NULL::bigint, amounts jsonb \
        DEFAULT NULL::jsonb",
        "rate_limit.decision",
    )
    .in_c("settle_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .commented(
        "Settle a reservation on the tokens actually used (or amounts of the policy's meters): gives \
        back the rest or charges the excess, once; allowed when this call settled it",
    ),
    keyed(
        "reserve_many",
        "text[], text, bigint[], interval, jsonb",
        Access::Public,
        "key",
        "#rate_limitreserve_many-rate_limitsettle_many",
    )
    .declared(
        "policies text[], key text, estimates bigint[] DEFAULT NULL::bigint[], hold interval DEFAULT \
        '00:05:00'::interval, amounts jsonb DEFAULT NULL::jsonb",
        "rate_limit.decision",
    )
    .in_c("reserve_many_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .takes_tokens()
    .commented(
        "Reserve estimates of key under several policies at once, all or nothing (or amounts each \
        policy weighs with its own meters): the decision, with one reservation id in lease when allowed",
    ),
    keyed(
        "settle_many",
        "text[], text, bigint, bigint[], jsonb",
        Access::Public,
        "key",
        "#rate_limitreserve_many-rate_limitsettle_many",
    )
    .declared(
        "policies text[], key text, reservation bigint, actuals bigint[] DEFAULT NULL::bigint[], \
        amounts jsonb DEFAULT NULL::jsonb",
        "rate_limit.decision",
    )
    .in_c("settle_many_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .commented(
        "Settle a reservation of rate_limit.reserve_many under each of its policies on what the work \
        used, once each; allowed when this call settled it under at least one",
    ),
    keyed(
        "book",
        "text, text, bigint, interval",
        Access::Public,
        "key",
        "#rate_limitbook-rate_limitcancel_booking",
    )
    .declared(
        "policy text, key text, cost bigint DEFAULT 1, max_delay interval DEFAULT '1 day'::interval",
        "rate_limit.decision",
    )
    .in_c("book_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .takes_tokens()
    .commented(
        "Book cost tokens of key under a token bucket policy, first come first served: when allowed, \
        retry_after is when they exist and lease the booking id",
    ),
    keyed(
        "cancel_booking",
        "text, text, bigint",
        Access::Public,
        "key",
        "#rate_limitbook-rate_limitcancel_booking",
    )
    .declared("policy text, key text, booking bigint", "rate_limit.decision")
    .in_c("cancel_booking_wrapper", "VOLATILE SECURITY DEFINER PARALLEL UNSAFE")
    .since("0.5.0")
    .commented(
        "Cancel a booking before its time; its tokens go back when nothing was booked after them; \
        allowed when this call cancelled it",
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
];

/// The trigger function users attach to their own tables (after the administration's calls, in the
/// reference's order).
pub const TRIGGERS: &[Function] = &[Function {
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
.in_c(
    "limit_writes_wrapper",
    "VOLATILE SECURITY DEFINER PARALLEL UNSAFE",
)
.since("0.3.0")
.takes_tokens()
.commented(
    "Row trigger: limit_writes(policy, key_column [, cost]) takes cost tokens per written row \
        from the bucket of the row's key; a denied row raises 53400 with the RateLimit header \
        values in DETAIL",
)];
