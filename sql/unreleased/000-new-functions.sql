-- The functions new in 0.5.0, made from src/surface/ by scripts/generate-surface.sh (do not
-- edit): each as pgrx's schema creates it. Their privileges and comments end the upgrade script.
CREATE FUNCTION rate_limit.allow(policy text, key text, cost integer DEFAULT 1) RETURNS boolean
    VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'allow_wrapper';
CREATE FUNCTION rate_limit.take_batch(policy text, keys text[], costs integer[] DEFAULT NULL::integer[], all_or_nothing boolean DEFAULT false) RETURNS TABLE(ordinality integer, key text, allowed boolean, remaining bigint, retry_after interval)
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'take_batch_wrapper';
CREATE FUNCTION rate_limit.release(policy text, key text, lease bigint, outcome text DEFAULT 'ok'::text, latency interval DEFAULT NULL::interval) RETURNS boolean
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'release_wrapper';
CREATE FUNCTION rate_limit.reserve(policy text, key text, estimate bigint DEFAULT NULL::bigint, hold interval DEFAULT '00:05:00'::interval, amounts jsonb DEFAULT NULL::jsonb) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'reserve_wrapper';
CREATE FUNCTION rate_limit.settle(policy text, key text, reservation bigint, actual bigint DEFAULT NULL::bigint, amounts jsonb DEFAULT NULL::jsonb) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'settle_wrapper';
CREATE FUNCTION rate_limit.reserve_many(policies text[], key text, estimates bigint[] DEFAULT NULL::bigint[], hold interval DEFAULT '00:05:00'::interval, amounts jsonb DEFAULT NULL::jsonb) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'reserve_many_wrapper';
CREATE FUNCTION rate_limit.settle_many(policies text[], key text, reservation bigint, actuals bigint[] DEFAULT NULL::bigint[], amounts jsonb DEFAULT NULL::jsonb) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'settle_many_wrapper';
CREATE FUNCTION rate_limit.book(policy text, key text, cost bigint DEFAULT 1, max_delay interval DEFAULT '1 day'::interval) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'book_wrapper';
CREATE FUNCTION rate_limit.cancel_booking(policy text, key text, booking bigint) RETURNS rate_limit.decision
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'cancel_booking_wrapper';
CREATE FUNCTION rate_limit.set_override(policy text, key text, rate bigint DEFAULT NULL::bigint, per interval DEFAULT NULL::interval, burst bigint DEFAULT NULL::bigint, action text DEFAULT 'limit'::text, until timestamp with time zone DEFAULT NULL::timestamp with time zone, note text DEFAULT NULL::text) RETURNS void
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'set_override_wrapper';
CREATE FUNCTION rate_limit.clear_override(policy text, key text) RETURNS boolean
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'clear_override_wrapper';
CREATE FUNCTION rate_limit.nodes_of(keys text[]) RETURNS TABLE(key text, host text, port integer, shard bigint)
    STABLE SECURITY DEFINER PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'nodes_of_wrapper';
CREATE FUNCTION rate_limit.metrics_rows() RETURNS TABLE(kind text, policy text, calls bigint, granted bigint, denied bigint, shadow_denied bigint, blocked bigint, tokens_granted bigint)
    VOLATILE STRICT PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'metrics_rows_wrapper';
CREATE FUNCTION rate_limit.node_metrics_rows() RETURNS TABLE(kind text, policy text, calls bigint, granted bigint, denied bigint, shadow_denied bigint, blocked bigint, tokens_granted bigint)
    VOLATILE STRICT PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'node_metrics_rows_wrapper';
CREATE FUNCTION rate_limit.purge_rows() RETURNS TABLE(store text, finished_at timestamp with time zone, freed bigint)
    VOLATILE STRICT PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'purge_rows_wrapper';
CREATE FUNCTION rate_limit.purge_span(idle interval, after_namespace text, after_key text) RETURNS TABLE(deleted bigint, next_namespace text, next_key text)
    VOLATILE SECURITY DEFINER PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'purge_span_wrapper';
CREATE FUNCTION rate_limit.metrics_top_keys_rows() RETURNS TABLE(kind text, policy text, rank integer, key text, denials bigint)
    VOLATILE STRICT PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'metrics_top_keys_rows_wrapper';
