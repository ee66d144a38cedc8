-- The limiter API (src/api): the compiled edition's names, signatures, defaults, results and errors.
-- Every function PUBLIC may call is SECURITY DEFINER with a fixed search_path: it runs as the edition's
-- owner, who alone may write the state tables, and no caller's search_path can redirect anything it
-- names. (The compiled edition names every object with its schema instead and has no SET clause; in
-- PL/pgSQL a fixed search_path is how every operator of every expression stays PostgreSQL's own.)

-- The bucket of key under policy p, with the key's override if it has one (one primary-key read).
CREATE FUNCTION rate_limit._policy_target(p rate_limit._policy, key text, read_override boolean DEFAULT true)
RETURNS rate_limit._target LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    t rate_limit._target;
    o rate_limit.key_overrides;
    e record;
BEGIN
    t.ns := p.name;
    t.key := key;
    t.lim := p.lim;
    t.changed_at := p.changed_at;
    t.shadow := p.shadow;
    t.policy := p.name;
    t.blk := rate_limit._block_limit(p);
    t.penalty_for := p.penalty_for;
    t.may_block := p.penalty_for IS NOT NULL OR p.blocks_by_hand;
    IF read_override THEN
        SELECT * INTO o FROM rate_limit.key_overrides AS k
         WHERE k.policy OPERATOR(pg_catalog.=) p.name AND k.key OPERATOR(pg_catalog.=) _policy_target.key
           AND k.set_at OPERATOR(pg_catalog.>=) rate_limit._ts(p.created_at);
        IF FOUND THEN
            -- a window's (a concurrency policy's) burst is its rate: a stored burst is not read for it
            -- (overrides::resolve_read)
            e := rate_limit._override_effect(p, o.action, o.rate, o.per,
                                             CASE WHEN (p.lim).algorithm = 'token_bucket' THEN o.burst END,
                                             o.expires_at, o.set_at,
                                             rate_limit._now());
            t.lim := e.lim;
            t.changed_at := e.changed_at;
            t.verdict := e.verdict;
            t.verdict_until := e.verdict_until;
        END IF;
    END IF;
    RETURN t;
END
$$;

-- The policy of a call that takes tokens (42809 for a concurrency policy).
CREATE FUNCTION rate_limit._token_policy(name text) RETURNS rate_limit._policy
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    p rate_limit._policy := rate_limit._policy_named(name);
BEGIN
    IF (p.lim).algorithm = 'concurrency' THEN
        PERFORM rate_limit._wrong_kind(p.name, true);
    END IF;
    RETURN p;
END
$$;

-- The policy of an acquire or release (42809 for any other kind).
CREATE FUNCTION rate_limit._lease_policy(name text) RETURNS rate_limit._policy
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    p rate_limit._policy := rate_limit._policy_named(name);
BEGIN
    IF (p.lim).algorithm <> 'concurrency' THEN
        PERFORM rate_limit._wrong_kind(p.name, false);
    END IF;
    RETURN p;
END
$$;

-- The buckets of key a call on p takes from (src/api/family.rs, family_targets): its own, then its
-- parent's when it has one.
CREATE FUNCTION rate_limit._family_targets(p rate_limit._policy, key text) RETURNS rate_limit._target[]
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF p.parent IS NULL THEN
        RETURN ARRAY[rate_limit._policy_target(p, key)];
    END IF;
    RETURN ARRAY[rate_limit._policy_target(p, key),
                 rate_limit._policy_target(rate_limit._token_policy(p.parent), key)];
END
$$;

-- named followed by the parent of each that has one, and tokens followed by each parent's: its child's
-- (family.rs, with_parents); 22023 beyond 16 buckets.
CREATE FUNCTION rate_limit._with_parents(INOUT named rate_limit._policy[], INOUT tokens bigint[])
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    n integer := pg_catalog.cardinality(named);
BEGIN
    FOR i IN 1..n LOOP
        IF named[i].parent IS NOT NULL THEN
            named := named || rate_limit._token_policy(named[i].parent);
            tokens := tokens || tokens[i];
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(named) > 16 THEN
        PERFORM rate_limit._raise('22023', 'the policies of one call and their parents must name at most 16 buckets, got '
            || pg_catalog.cardinality(named),
            'Split the limits over several calls: a call on a child also takes from its parent''s bucket.');
    END IF;
END
$$;

-- 0A000 for a call that does not take from a parent's bucket (yet) on a child policy (family.rs, no_parent).
CREATE FUNCTION rate_limit._no_parent(p rate_limit._policy, call text) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF p.parent IS NOT NULL THEN
        PERFORM rate_limit._raise('0A000', call || ' does not take from a parent''s bucket: policy '
            || rate_limit._quoted(p.name) || ' has parent ' || rate_limit._quoted(p.parent),
            'Call rate_limit.take (or take_many, reserve, charge) on a child policy, or give it no parent.');
    END IF;
END
$$;

-- Indexes 1..n of targets in the order every call locks buckets in: their namespaces' (one key).
CREATE FUNCTION rate_limit._lock_order(targets rate_limit._target[]) RETURNS integer[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT pg_catalog.array_agg(g ORDER BY targets[g].ns COLLATE "C")
  FROM pg_catalog.generate_series(1, pg_catalog.cardinality(targets)) AS g
$$;

-- take(policy, key, cost) as a decision, every case: also the body of peek and wait (the fast path in
-- 45_fast.sql decides the common ones).
CREATE FUNCTION rate_limit._take_policy(policy text, key text, cost integer) RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p rate_limit._policy := rate_limit._token_policy(policy);
    c bigint;
    targets rate_limit._target[];
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    c := rate_limit._cost_arg(cost);
    PERFORM rate_limit._check_session_store(p.store);
    targets := rate_limit._family_targets(p, key);
    RETURN rate_limit._combine(targets, rate_limit._take_targets(targets, c));
END
$$;

------------------------------------------------------------------------------------------------------------
-- rate_limiting_request and the functions over its buckets (src/api/request.rs).

-- The token bucket of rate_limiting_request(id, refill_per_sec, window_seconds), validated.
CREATE FUNCTION rate_limit._request_target(id text, refill_per_sec integer, window_seconds integer, cost bigint)
RETURNS rate_limit._target LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    t rate_limit._target;
    capacity bigint;
BEGIN
    PERFORM rate_limit._key_arg('id', id);
    IF refill_per_sec IS NULL THEN
        PERFORM rate_limit._null_argument('refill_per_sec',
            'Pass a whole number from 1 to 2147483647, or omit refill_per_sec for its default of 2.');
    ELSIF refill_per_sec < 1 THEN
        PERFORM rate_limit._out_of_range('refill_per_sec', refill_per_sec, 1, 2147483647);
    END IF;
    IF window_seconds IS NULL THEN
        PERFORM rate_limit._null_argument('window_seconds',
            'Pass a whole number from 1 to 2147483647, or omit window_seconds for its default of 60.');
    ELSIF window_seconds < 1 THEN
        PERFORM rate_limit._out_of_range('window_seconds', window_seconds, 1, 2147483647);
    END IF;
    capacity := refill_per_sec::bigint * window_seconds;
    IF capacity > 2147483648 THEN
        PERFORM rate_limit._raise('22003', 'capacity refill_per_sec * window_seconds = ' || capacity || ' is too large',
            'Lower refill_per_sec or window_seconds.',
            'The remaining tokens are returned as int, so the capacity may be at most 2147483648.');
    END IF;
    t.ns := '#request';
    t.key := id;
    t.lim := ROW('token_bucket', refill_per_sec, 1000000, capacity, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit;
    t.changed_at := -9223372036854775808;
    t.shadow := false;
    t.may_block := false;
    PERFORM rate_limit._check_caller_limit(t.lim, cost);
    PERFORM rate_limit._check_session_store();
    RETURN t;
END
$$;

-- rate_limiting_request's every case (the fast path in 45_fast.sql decides the common ones).
CREATE FUNCTION rate_limit._request(id text, refill_per_sec integer, window_seconds integer)
RETURNS integer LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t rate_limit._target := rate_limit._request_target(id, refill_per_sec, window_seconds, 1);
    o rate_limit._outcome := (rate_limit._take_targets(ARRAY[t], 1))[1];
BEGIN
    IF o.allowed THEN
        RETURN LEAST(o.remaining, 2147483647);
    END IF;
    RETURN -1;
END
$$;

CREATE FUNCTION rate_limit.peek_request(id text, refill_per_sec integer DEFAULT 2, window_seconds integer DEFAULT 60)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    t rate_limit._target := rate_limit._request_target(id, refill_per_sec, window_seconds, 0);
BEGIN
    RETURN ((rate_limit._take_targets(ARRAY[t], 0))[1]).remaining;
END
$$;

CREATE FUNCTION rate_limit.tokens(id text, refill_per_sec integer DEFAULT 2, window_seconds integer DEFAULT 60)
RETURNS numeric LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    t rate_limit._target := rate_limit._request_target(id, refill_per_sec, window_seconds, 0);
    o rate_limit._outcome := (rate_limit._take_targets(ARRAY[t], 0))[1];
BEGIN
    RETURN pg_catalog.round(rate_limit._tokens_millionths(t.lim, o.level, o.at, o.at)::numeric / 1000000, 6);
END
$$;

CREATE FUNCTION rate_limit.reset_request(id text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM rate_limit._key_arg('id', id);
    PERFORM rate_limit._check_session_store();
    RETURN rate_limit._reset('#request', id);
END
$$;

-- Deletes a bucket (it is full again); true if it existed. 25006 in a read-only transaction.
CREATE FUNCTION rate_limit._reset(ns text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    IF rate_limit._in_read_only() THEN
        PERFORM rate_limit._read_only('reset a bucket');
    END IF;
    DELETE FROM rate_limit.bucket_state AS s
     WHERE s.namespace OPERATOR(pg_catalog.=) _reset.ns AND s.key OPERATOR(pg_catalog.=) _reset.key;
    RETURN FOUND;
END
$$;

-- Deletes every bucket that is full now, losslessly (a missing bucket is a full one); how many. Callable
-- from pg_cron: SELECT cron.schedule('rate_limit purge', '*/5 * * * *', 'SELECT rate_limit.purge()').
CREATE FUNCTION rate_limit.purge() RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now bigint := rate_limit._now();
    freed bigint;
BEGIN
    DELETE FROM rate_limit.bucket_state AS s
     WHERE rate_limit._is_full(ROW(s.algorithm, s.rate, s.per_us, s.burst, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit,
                               s.level, rate_limit._us(s.updated_at), now);
    GET DIAGNOSTICS freed = ROW_COUNT;
    PERFORM rate_limit._purge_finished(freed);
    RETURN freed;
END
$$;

-- Records a finished purge (rate_limit.purge or purge_idle) for rate_limit.metrics_purge.
CREATE FUNCTION rate_limit._purge_finished(freed bigint) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
INSERT INTO rate_limit.purges AS p (store, finished_at, freed) VALUES ('table', clock_timestamp(), freed)
ON CONFLICT ON CONSTRAINT purges_pkey DO UPDATE SET finished_at = EXCLUDED.finished_at, freed = EXCLUDED.freed
$$;

-- One transaction of rate_limit.purge_idle: the next 1 000 rows of the state table after
-- (after_namespace, after_key) in the primary key's order (from its start when they are NULL); those full now
-- and untouched for idle are locked with SKIP LOCKED (a row a caller holds is left for the next round) and
-- deleted, checked again as they are. Returns how many it deleted and where the next span starts (NULL: the
-- table's end). Planned at each call (EXECUTE), for the table as it is. The compiled edition's
-- rate_limit.purge_span (src/store/table/purge.rs).
CREATE FUNCTION rate_limit._purge_span(idle interval, after_namespace text, after_key text,
                                       OUT deleted bigint, OUT next_namespace text, OUT next_key text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now bigint := rate_limit._now();
    idle_since timestamptz;
    read bigint;
    idle_and_full constant text :=
        '%1$s.updated_at <= $1 AND rate_limit._is_full(ROW(%1$s.algorithm, %1$s.rate, %1$s.per_us, %1$s.burst, '
        'NULL, NULL, NULL, NULL, NULL)::rate_limit._limit, %1$s.level, rate_limit._us(%1$s.updated_at), $2)';
BEGIN
    IF idle IS NULL THEN
        PERFORM rate_limit._null_argument('idle',
            'Pass how long a full bucket must have been untouched, e.g. interval ''5 minutes''.');
    END IF;
    idle_since := rate_limit._ts(now - rate_limit._period_us('idle', idle));
    EXECUTE format(
        'WITH span AS MATERIALIZED (
             SELECT s.ctid AS row_id, s.namespace, s.key FROM rate_limit.bucket_state AS s %s
              ORDER BY s.namespace, s.key LIMIT 1000),
         gone AS (
             DELETE FROM rate_limit.bucket_state AS d
              WHERE d.ctid = ANY (ARRAY(
                    SELECT f.ctid FROM rate_limit.bucket_state AS f
                     WHERE f.ctid = ANY (ARRAY(SELECT row_id FROM span)) AND %s
                       FOR UPDATE SKIP LOCKED))
                AND %s
             RETURNING 1)
         SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM span), last.namespace, last.key
           FROM span AS last ORDER BY last.namespace DESC, last.key DESC LIMIT 1',
        CASE WHEN after_namespace IS NULL OR after_key IS NULL THEN ''
             ELSE 'WHERE ROW(s.namespace, s.key) > ROW($3::text, $4::text)' END,
        format(idle_and_full, 'f'), format(idle_and_full, 'd'))
    INTO deleted, read, next_namespace, next_key
    USING idle_since, now, after_namespace, after_key;
    deleted := coalesce(deleted, 0);
    IF coalesce(read, 0) < 1000 THEN
        next_namespace := NULL;
        next_key := NULL;
    END IF;
END
$$;

-- The purge to schedule with pg_cron (docs/portable.md): the full buckets untouched for idle, read 1 000
-- rows of the state table a transaction in the primary key's order, committing after each, so that a
-- caller waits at most one short transaction for a row the purge locked and a bucket in use keeps its row;
-- recorded for rate_limit.metrics_purge. CALL it on its own, as pg_cron does: inside a transaction block its
-- first COMMIT fails with 2D000. A procedure that commits can be neither SECURITY DEFINER nor carry a SET
-- clause: it runs as its caller (owner only) and names everything with its schema.
CREATE PROCEDURE rate_limit.purge_idle(idle pg_catalog.interval DEFAULT pg_catalog.interval '5 minutes')
LANGUAGE plpgsql
AS $$
DECLARE
    span record;
    after_namespace pg_catalog.text;
    after_key pg_catalog.text;
    freed bigint := 0;
BEGIN
    LOOP
        SELECT s.deleted, s.next_namespace, s.next_key INTO span
          FROM rate_limit._purge_span(idle, after_namespace, after_key) AS s;
        freed := freed OPERATOR(pg_catalog.+) span.deleted;
        COMMIT;
        EXIT WHEN span.next_key IS NULL;
        after_namespace := span.next_namespace;
        after_key := span.next_key;
    END LOOP;
    PERFORM rate_limit._purge_finished(freed);
END
$$;

------------------------------------------------------------------------------------------------------------
-- The limiter API over named policies and ad-hoc limits (src/api/limits.rs).


CREATE FUNCTION rate_limit.peek(policy text, key text) RETURNS rate_limit.decision
LANGUAGE sql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$ SELECT rate_limit._take_policy(policy, key, 0) $$;

CREATE FUNCTION rate_limit.take_ad_hoc(key text, rate bigint, per interval, burst bigint DEFAULT NULL,
                                       cost integer DEFAULT 1)
RETURNS rate_limit.decision LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    t rate_limit._target;
    c bigint;
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    IF rate IS NULL THEN PERFORM rate_limit._null_argument('rate', 'Pass the tokens granted per period, e.g. 100.'); END IF;
    IF per IS NULL THEN PERFORM rate_limit._null_argument('per', 'Pass the period, e.g. interval ''1 minute''.'); END IF;
    c := rate_limit._cost_arg(cost);
    t.ns := '#ad_hoc';
    t.key := key;
    t.lim := rate_limit._build('token_bucket', rate, per, burst, NULL, NULL);
    t.changed_at := -9223372036854775808;
    t.shadow := false;
    t.may_block := false;
    PERFORM rate_limit._check_caller_limit(t.lim, c);
    PERFORM rate_limit._check_session_store();
    RETURN rate_limit._combine(ARRAY[t], rate_limit._take_targets(ARRAY[t], c));
END
$$;

-- 0A000 unless every policy of named, the policies of one call (a call, a reservation), keeps its buckets
-- in the same store (limits.rs, one_store): all or nothing holds within one store only.
CREATE FUNCTION rate_limit._one_store(named rate_limit._policy[], call text, hint text) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    FOR i IN 2..pg_catalog.cardinality(named) LOOP
        IF COALESCE(named[i].store, pg_catalog.current_setting('rate_limit.store', true), 'table')
           <> COALESCE(named[1].store, pg_catalog.current_setting('rate_limit.store', true), 'table') THEN
            PERFORM rate_limit._raise('0A000', 'the policies of one ' || call || ' must keep their buckets in the same store',
                hint, 'All-or-nothing consumption is atomic within one store only.');
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION rate_limit.take_many(policies text[], keys text[], cost integer DEFAULT 1)
RETURNS rate_limit.decision LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    c bigint;
    n integer;
    named rate_limit._policy[] := '{}';
    targets rate_limit._target[] := '{}';
    key_of integer[] := '{}';
    t rate_limit._target;
BEGIN
    IF policies IS NULL THEN
        PERFORM rate_limit._null_argument('policies', 'Pass an array of policy names, e.g. ARRAY[''per_user'', ''global''].');
    END IF;
    IF keys IS NULL THEN
        PERFORM rate_limit._null_argument('keys', 'Pass one key for every policy, e.g. ARRAY[user_id], or one key per policy.');
    END IF;
    c := rate_limit._cost_arg(cost);
    n := pg_catalog.cardinality(policies);
    IF n = 0 OR n > 16 THEN
        PERFORM rate_limit._raise('22023', 'policies must name 1 to 16 policies, got ' || n,
            'Split the limits over several calls, or combine them in fewer policies.');
    END IF;
    IF pg_catalog.cardinality(keys) <> 1 AND pg_catalog.cardinality(keys) <> n THEN
        PERFORM rate_limit._raise('22023', 'keys must hold one key, or one key per policy (' || n || '), got '
            || pg_catalog.cardinality(keys),
            'Pass ARRAY[key] to use one key for every policy, or one key per policy in the same order.');
    END IF;
    FOR i IN 1..n LOOP
        named := named || rate_limit._token_policy(policies[i]);
    END LOOP;
    FOR i IN 1..pg_catalog.cardinality(keys) LOOP
        PERFORM rate_limit._key_arg('keys', keys[i]);
    END LOOP;
    -- each policy's key, then each child's key again for its parent
    FOR i IN 1..n LOOP
        key_of := key_of || CASE WHEN pg_catalog.cardinality(keys) = 1 THEN 1 ELSE i END;
    END LOOP;
    FOR i IN 1..n LOOP
        IF named[i].parent IS NOT NULL THEN
            key_of := key_of || key_of[i];
        END IF;
    END LOOP;
    SELECT w.named INTO named FROM rate_limit._with_parents(named, pg_catalog.array_fill(0::bigint, ARRAY[n])) AS w;
    FOR i IN 1..pg_catalog.cardinality(named) LOOP
        t := rate_limit._policy_target(named[i], keys[key_of[i]]);
        FOR j IN 1..i - 1 LOOP
            IF targets[j].ns = t.ns AND targets[j].key = t.key THEN
                PERFORM rate_limit._raise('22023', 'policy ' || rate_limit._quoted(t.ns) || ' is named twice for key '
                    || rate_limit._quoted(t.key), 'Name each (policy, key) once (a call on a child also takes from its parent''s bucket); pass a higher cost to take more tokens.');
            END IF;
        END LOOP;
        targets := targets || t;
    END LOOP;
    PERFORM rate_limit._one_store(named, 'call',
        'Give the policies the same store (create_policy''s store argument), or call take twice.');
    PERFORM rate_limit._check_session_store(named[1].store);
    RETURN rate_limit._combine(targets, rate_limit._take_targets(targets, c));
END
$$;

CREATE FUNCTION rate_limit.wait(policy text, key text, cost integer DEFAULT 1, timeout interval DEFAULT NULL)
RETURNS rate_limit.decision LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    max_us bigint := rate_limit._interval_us(rate_limit.max_wait());
    timeout_us bigint;
    deadline numeric;
    d rate_limit.decision;
    retry bigint;
BEGIN
    IF timeout IS NULL THEN
        timeout_us := max_us;
    ELSE
        timeout_us := rate_limit._interval_us(timeout);
        IF rate_limit._interval_months(timeout) <> 0 OR timeout_us IS NULL OR timeout_us < 0 THEN
            PERFORM rate_limit._raise('22023', 'timeout must be zero or a positive interval without months',
                'Pass e.g. interval ''5 seconds'', or NULL to wait up to rate_limit.max_wait.');
        END IF;
        IF timeout_us > max_us THEN
            PERFORM rate_limit._raise('22023', 'timeout must be at most rate_limit.max_wait (' || (max_us / 1000)
                || ' ms), got ' || ((LEAST(timeout_us::numeric + 999, 9223372036854775807)::bigint) / 1000) || ' ms',
                'Pass a shorter timeout, or NULL for rate_limit.max_wait; a superuser sets rate_limit.max_wait.',
                'A waiting call holds its statement''s snapshot while it sleeps.');
        END IF;
    END IF;
    -- never past max_wait after the statement holding the caller's snapshot started
    deadline := LEAST(rate_limit._now()::numeric + timeout_us,
                      rate_limit._us(GREATEST(statement_timestamp(), transaction_timestamp()))::numeric + max_us);
    LOOP
        d := rate_limit._take_policy(policy, key, cost);
        IF d.allowed OR d.retry_after IS NULL THEN
            RETURN d; -- granted, or can never be
        END IF;
        retry := rate_limit._interval_us(d.retry_after);
        IF rate_limit._now()::numeric + retry > deadline THEN
            RETURN d; -- not within the timeout: give up now
        END IF;
        PERFORM pg_catalog.pg_sleep(LEAST(GREATEST((retry + 999) / 1000, 1), 1073741823) / 1000.0);
    END LOOP;
END
$$;

CREATE FUNCTION rate_limit.refund(policy text, key text, tokens bigint) RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._token_policy(policy);
    targets rate_limit._target[];
    outcomes rate_limit._outcome[];
    i integer;
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    IF tokens IS NULL THEN PERFORM rate_limit._null_argument('tokens', 'Pass the number of tokens to give back.'); END IF;
    IF tokens < 0 THEN PERFORM rate_limit._out_of_range('tokens', tokens, 0, 9223372036854775807); END IF;
    targets := rate_limit._family_targets(p, key);
    PERFORM rate_limit._check_session_store(p.store);
    -- every bucket of the family (a child's parent too), in the lock order
    outcomes := pg_catalog.array_fill(rate_limit._not_looked_at(), ARRAY[pg_catalog.cardinality(targets)]);
    FOREACH i IN ARRAY rate_limit._lock_order(targets) LOOP
        outcomes[i] := rate_limit._refund_target(targets[i], tokens, 'refund tokens');
    END LOOP;
    RETURN rate_limit._combine(targets, outcomes);
END
$$;

-- Puts up to tokens back into t's bucket, never above its capacity (pipeline::single::refund): the bucket
-- afterwards. A missing bucket is full (nothing written); an exempt or denied key's is not in use.
CREATE FUNCTION rate_limit._refund_target(t rate_limit._target, tokens bigint, action text)
RETURNS rate_limit._outcome LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    r rate_limit._row;
    now bigint;
    c record;
BEGIN
    IF t.verdict IS NOT NULL THEN
        RETURN (rate_limit._take_targets(ARRAY[t], 0))[1];
    END IF;
    r := rate_limit._lock(t, action);
    now := rate_limit._now();
    IF r.level IS NULL THEN
        RETURN rate_limit._evaluate(t.lim, NULL, NULL, NULL, t.changed_at, now, 0);
    END IF;
    c := rate_limit._current(t.lim, r.level, r.at, r.numbers, t.changed_at, now);
    c := rate_limit._refund(t.lim, c.new_level, c.new_at, now, tokens);
    PERFORM rate_limit._write(t, c.new_level, c.new_at);
    RETURN rate_limit._take(t.lim, c.new_level, c.new_at, now, 0);
END
$$;

CREATE FUNCTION rate_limit.charge(policy text, key text, cost bigint) RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._token_policy(policy);
    targets rate_limit._target[];
    outcomes rate_limit._outcome[];
    debts bigint[];
    i integer;
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    IF cost IS NULL THEN
        PERFORM rate_limit._null_argument('cost',
            'Pass the tokens the work used (or what it used beyond the estimate taken before it).');
    END IF;
    IF cost < 0 THEN
        PERFORM rate_limit._raise('22023', 'cost must be between 0 and 9223372036854775807, got ' || cost,
            'To give tokens back, use rate_limit.refund.');
    END IF;
    targets := rate_limit._family_targets(p, key);
    PERFORM rate_limit._check_session_store(p.store);
    -- each bucket down to its own policy's max_debt, in the lock order
    debts := ARRAY[p.max_debt];
    IF p.parent IS NOT NULL THEN
        debts := debts || (rate_limit._token_policy(p.parent)).max_debt;
    END IF;
    outcomes := pg_catalog.array_fill(rate_limit._not_looked_at(), ARRAY[pg_catalog.cardinality(targets)]);
    FOREACH i IN ARRAY rate_limit._lock_order(targets) LOOP
        outcomes[i] := rate_limit._charge_target(targets[i], cost, debts[i]);
    END LOOP;
    RETURN rate_limit._combine(targets, outcomes);
END
$$;

-- Charges cost tokens to t's bucket down to max_debt below zero (pipeline::single::charge), creating it
-- when missing: the bucket afterwards. An exempt key is charged nothing, a denied one has nothing to
-- charge.
CREATE FUNCTION rate_limit._charge_target(t rate_limit._target, cost bigint, max_debt bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    now bigint;
BEGIN
    IF t.verdict IS NULL THEN
        RETURN rate_limit._upsert(t, 'charge', cost, max_debt, 'charge a bucket');
    END IF;
    now := rate_limit._now();
    IF t.verdict = 'deny' THEN
        RETURN ROW(false, 0, now, 0, rate_limit._until(t.verdict_until::numeric, now),
                   COALESCE(rate_limit._until(t.verdict_until::numeric, now), 0))::rate_limit._outcome;
    END IF;
    RETURN ROW(true, rate_limit._full_level(t.lim), now, (t.lim).burst, NULL, 0)::rate_limit._outcome;
END
$$;

CREATE FUNCTION rate_limit.reset(policy text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._token_policy(policy);
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    PERFORM rate_limit._check_session_store(p.store);
    RETURN rate_limit._reset(p.name, key);
END
$$;

CREATE FUNCTION rate_limit.reset_ad_hoc(key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    PERFORM rate_limit._check_session_store();
    RETURN rate_limit._reset('#ad_hoc', key);
END
$$;

-- The HTTP fields of a decision (model/src/http.rs). SECURITY DEFINER only to run the edition's
-- internal helpers, which PUBLIC cannot execute; it reads nothing PUBLIC cannot (rate_limit.policies).
CREATE FUNCTION rate_limit.headers(decision rate_limit.decision, policy text DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    hint text := 'Pass the decision a call returned, e.g. SELECT rate_limit.headers(d) FROM rate_limit.take(''api'', ''alice'') AS d.';
    name text;
    p rate_limit._policy;
    reset_us bigint;
    retry_us bigint;
    fields jsonb;
    quota bigint;
BEGIN
    -- (a row of NULLs IS NULL too; only a NULL value has no text)
    IF decision::text IS NULL THEN
        PERFORM rate_limit._null_argument('decision',
            'Pass the decision of a call, e.g. SELECT rate_limit.headers(d) FROM rate_limit.take(''api'', ''alice'') AS d.');
    END IF;
    IF decision.allowed IS NULL THEN PERFORM rate_limit._null_argument('decision.allowed', hint); END IF;
    IF decision.remaining IS NULL THEN PERFORM rate_limit._null_argument('decision.remaining', hint); END IF;
    IF decision.reset_after IS NULL THEN PERFORM rate_limit._null_argument('decision.reset_after', hint); END IF;
    IF decision.remaining < 0 THEN
        PERFORM rate_limit._raise('22023', 'decision.remaining must not be negative', hint);
    ELSIF decision."limit" < 0 THEN
        PERFORM rate_limit._raise('22023', 'decision.limit must not be negative', hint);
    ELSIF decision.retry_after < interval '0' THEN
        PERFORM rate_limit._raise('22023', 'decision.retry_after must not be negative', hint);
    ELSIF decision.reset_after < interval '0' THEN
        PERFORM rate_limit._raise('22023', 'decision.reset_after must not be negative', hint);
    END IF;
    IF decision.policy IS NOT NULL THEN
        p := rate_limit._policy_named(decision.policy);
    END IF;
    name := COALESCE(policy, decision.policy, 'default');
    reset_us := rate_limit._interval_us(decision.reset_after);
    fields := pg_catalog.jsonb_build_object('RateLimit',
        '"' || name || '";r=' || decision.remaining || ';t=' || rate_limit._cdiv(GREATEST(reset_us, 0), 1000000));
    IF decision.policy IS NOT NULL THEN
        quota := COALESCE(decision."limit", (p.lim).burst);
        IF (p.lim).algorithm = 'concurrency' THEN
            fields := fields || pg_catalog.jsonb_build_object('RateLimit-Policy',
                '"' || name || '";q=' || quota || ';qu="concurrent-requests"');
        ELSE
            fields := fields || pg_catalog.jsonb_build_object('RateLimit-Policy',
                '"' || name || '";q=' || quota || ';w=' || rate_limit._window_seconds(p.lim));
        END IF;
    END IF;
    IF NOT decision.allowed AND decision.retry_after IS NOT NULL THEN
        retry_us := rate_limit._interval_us(decision.retry_after);
        fields := fields || pg_catalog.jsonb_build_object('Retry-After',
            GREATEST(rate_limit._cdiv(GREATEST(retry_us, 0), 1000000), 1)::text);
    END IF;
    RETURN fields;
END
$$;

-- The window w of RateLimit-Policy, in seconds (rounded up, at least 1).
CREATE FUNCTION rate_limit._window_seconds(l rate_limit._limit) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT GREATEST(rate_limit._cdiv(CASE WHEN l.algorithm = 'token_bucket'
                                      THEN rate_limit._cdiv(l.burst::numeric * l.per_us, l.rate)
                                      ELSE l.per_us END, 1000000), 1)
$$;

------------------------------------------------------------------------------------------------------------
-- Concurrency leases (src/api/leases.rs, src/store/table/leases.rs).

-- 52 random bits from gen_random_uuid (PostgreSQL's strong random source): the hex digits before its
-- version digit.
CREATE FUNCTION rate_limit._random_bits() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
SELECT ('x' || pg_catalog.substr(pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', ''), 1, 12)
            || pg_catalog.substr(pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', ''), 1, 1))::bit(52)::bigint
$$;

-- A slot of a key's leases: a bucket of namespace policy U+001F slot.
CREATE FUNCTION rate_limit._slot_target(t rate_limit._target, slot bigint) RETURNS rate_limit._target
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT ROW(t.ns || pg_catalog.chr(31) || slot, t.key, t.lim, t.changed_at, false, t.policy, NULL, NULL, false,
           NULL, NULL)::rate_limit._target
$$;

-- The adaptive limit of t's key (model/src/algorithm/adaptive.rs): a bucket of namespace policy U+001F
-- adaptive limit, numbers rate leases per lease TTL.
CREATE FUNCTION rate_limit._limit_target(t rate_limit._target) RETURNS rate_limit._target
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT ROW(t.ns || pg_catalog.chr(31) || 'adaptive limit', t.key,
           rate_limit._numbers('adaptive_limit', (t.lim).rate, (t.lim).per_us, (t.lim).rate), t.changed_at, false,
           t.policy, NULL, NULL, false, NULL, NULL)::rate_limit._target
$$;

-- The leases t's key may hold under adaptive policy p: its limit, read (not locked).
CREATE FUNCTION rate_limit._key_limit(p rate_limit._policy, t rate_limit._target) RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    lt rate_limit._target := rate_limit._limit_target(t);
    r rate_limit._row := rate_limit._read(lt.ns, lt.key);
    now bigint := rate_limit._now();
    c record := rate_limit._current(lt.lim, r.level, r.at, r.numbers, lt.changed_at, now);
BEGIN
    RETURN rate_limit._limit_leases(lt.lim, c.new_level, c.new_at, now, LEAST(p.adaptive_min, (t.lim).rate));
END
$$;

-- A released lease of t's key, acquired at acquired_at, adapts its limit under policy p (single::release):
-- the limit is read, and locked (after the slot) and written only when the report changes it.
CREATE FUNCTION rate_limit._adapt_limit(p rate_limit._policy, t rate_limit._target, acquired_at bigint,
                                        now bigint, latency_us bigint, outcome text)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    lt rate_limit._target := rate_limit._limit_target(t);
    min_leases bigint := LEAST(p.adaptive_min, (t.lim).rate);
    latency bigint := COALESCE(latency_us, GREATEST(now::numeric - acquired_at, 0)::bigint);
    r rate_limit._row := rate_limit._read(lt.ns, lt.key);
    c record := rate_limit._current(lt.lim, r.level, r.at, r.numbers, lt.changed_at, now);
    o rate_limit._outcome;
BEGIN
    -- most reports of a healthy key change nothing (a limit at its most): read before locking
    IF NOT (rate_limit._adapt(lt.lim, c.new_level, c.new_at, now, min_leases, p.latency_target_us, acquired_at,
                              latency, outcome)).allowed THEN
        RETURN;
    END IF;
    FOR attempt IN 1..16 LOOP
        r := rate_limit._lock(lt, 'release a lease');
        c := rate_limit._current(lt.lim, r.level, r.at, r.numbers, lt.changed_at, now);
        o := rate_limit._adapt(lt.lim, c.new_level, c.new_at, now, min_leases, p.latency_target_us, acquired_at,
                               latency, outcome);
        IF r.level IS NOT NULL THEN
            PERFORM rate_limit._write(lt, o.level, o.at);
            RETURN;
        END IF;
        IF rate_limit._insert(lt, o.level, o.at) THEN
            RETURN;
        END IF;
    END LOOP;
    PERFORM rate_limit._gave_up();
END
$$;

-- Acquires a lease in the first free slot of t's key: the decision's outcome, and the lease when granted.
-- An acquire never waits for another transaction: a slot another one is changing counts as held; a slot
-- without a row is created in a subtransaction that waits at most 1 ms for another creator of the same
-- slot (its lock_timeout), then counts it as held.
CREATE FUNCTION rate_limit._acquire(t rate_limit._target, slots bigint, OUT outcome rate_limit._outcome,
                                    OUT lease bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    now bigint := rate_limit._now();
    ro boolean := rate_limit._in_read_only();
    random bigint := rate_limit._random_bits();
    levels bigint[] := '{}';
    ats bigint[] := '{}';
    granted_level bigint;
    granted_at bigint;
    s rate_limit._target;
    r rate_limit._row;
    o rate_limit._outcome;
    held_n bigint := 0;
    first_expiry bigint;
    last_expiry bigint;
    saved_timeout text;
    inserted boolean;
    c record;
BEGIN
    -- the key's slots, or those below its adaptive limit
    FOR slot IN 0 .. slots - 1 LOOP
        s := rate_limit._slot_target(t, slot);
        IF granted_level IS NOT NULL OR ro THEN
            -- report only
            r := rate_limit._read(s.ns, s.key);
            o := rate_limit._evaluate(s.lim, r.level, r.at, r.numbers, s.changed_at, now, 0);
            IF ro AND o.allowed THEN
                PERFORM rate_limit._read_only('acquire a lease');
            END IF;
            levels := levels || o.level;
            ats := ats || o.at;
            CONTINUE;
        END IF;
        -- a free slot's row, locked unless another transaction is changing it
        SELECT b.level, rate_limit._us(b.updated_at),
               ROW(b.algorithm, b.rate, b.per_us, b.burst, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit,
               b.ctid, b.xmin
          INTO r
          FROM rate_limit.bucket_state AS b
         WHERE b.namespace OPERATOR(pg_catalog.=) s.ns AND b.key OPERATOR(pg_catalog.=) s.key
           AND rate_limit._is_full(ROW(b.algorithm, b.rate, b.per_us, b.burst, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit,
                                   b.level, rate_limit._us(b.updated_at), now)
           FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            c := rate_limit._current(s.lim, r.level, r.at, r.numbers, s.changed_at, now);
            o := rate_limit._acquire_in(s.lim, c.new_level, c.new_at, now, rate_limit._lease_id(random, slot));
            IF o.allowed THEN
                PERFORM rate_limit._write(s, o.level, o.at);
                granted_level := o.level;
                granted_at := o.at;
            END IF;
            levels := levels || o.level;
            ats := ats || o.at;
            CONTINUE;
        END IF;
        -- no free row this call could lock: held, being changed by another transaction, or no row yet
        r := rate_limit._read(s.ns, s.key);
        IF r.level IS NOT NULL THEN
            o := rate_limit._evaluate(s.lim, r.level, r.at, r.numbers, s.changed_at, now, 0);
            IF o.allowed THEN
                -- free, yet not lockable: another transaction is taking or releasing it
                levels := levels || 1::bigint;
                ats := ats || (now + (s.lim).per_us);
            ELSE
                levels := levels || o.level;
                ats := ats || o.at;
            END IF;
            CONTINUE;
        END IF;
        o := rate_limit._acquire_in(s.lim, 0, now, now, rate_limit._lease_id(random, slot));
        saved_timeout := pg_catalog.current_setting('lock_timeout');
        BEGIN
            PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);
            inserted := rate_limit._insert(s, o.level, o.at);
            PERFORM pg_catalog.set_config('lock_timeout', saved_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
            inserted := false;
        END;
        IF inserted THEN
            granted_level := o.level;
            granted_at := o.at;
            levels := levels || o.level;
            ats := ats || o.at;
        ELSE
            -- created by another transaction since this call looked
            levels := levels || 1::bigint;
            ats := ats || (now + (s.lim).per_us);
        END IF;
    END LOOP;
    -- leases_outcome over every slot as this call left them
    FOR i IN 1 .. pg_catalog.cardinality(levels) LOOP
        IF rate_limit._slot_held(t.lim, levels[i], ats[i], now) THEN
            held_n := held_n + 1;
            first_expiry := LEAST(first_expiry, rate_limit._lease_expiry(t.lim, ats[i]));
            last_expiry := GREATEST(last_expiry, rate_limit._lease_expiry(t.lim, ats[i]));
        END IF;
    END LOOP;
    outcome := ROW(granted_level IS NOT NULL, COALESCE(granted_level, 0), COALESCE(granted_at, now),
                   GREATEST(slots - held_n, 0),
                   CASE WHEN granted_level IS NULL THEN rate_limit._until(first_expiry::numeric, now) END,
                   COALESCE(rate_limit._until(last_expiry::numeric, now), 0))::rate_limit._outcome;
    lease := granted_level;
END
$$;

CREATE FUNCTION rate_limit.acquire(policy text, key text) RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._lease_policy(policy);
    t rate_limit._target;
    blocked rate_limit._outcome[];
    a record;
    outcomes rate_limit._outcome[];
    d rate_limit.decision;
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    PERFORM rate_limit._check_session_store(p.store);
    t := rate_limit._policy_target(p, key, false);
    -- a blocked key gets no lease (under shadow mode, acquires ignore blocks: they never deny)
    IF NOT t.shadow THEN
        blocked := rate_limit._blocked(ARRAY[t]);
        IF (blocked[1]).allowed IS NOT NULL THEN
            RETURN rate_limit._combine(ARRAY[t], blocked);
        END IF;
    ELSE
        blocked := ARRAY[NULL::rate_limit._outcome];
    END IF;
    a := rate_limit._acquire(t, CASE WHEN p.latency_target_us IS NULL THEN (t.lim).rate
                                     ELSE rate_limit._key_limit(p, t) END);
    outcomes := rate_limit._count_denials(ARRAY[t], ARRAY[a.outcome], blocked);
    d := rate_limit._combine(ARRAY[t], outcomes);
    d.lease := a.lease;
    RETURN d;
END
$$;

CREATE FUNCTION rate_limit.release(policy text, key text, lease bigint, outcome text DEFAULT 'ok',
                                   latency interval DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._lease_policy(policy);
    t rate_limit._target;
    s rate_limit._target;
    slot bigint;
    r rate_limit._row;
    now bigint;
    c record;
    o rate_limit._outcome;
    latency_us bigint;
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    IF lease IS NULL THEN PERFORM rate_limit._null_argument('lease', 'Pass the lease that rate_limit.acquire returned.'); END IF;
    IF outcome IS NULL THEN
        PERFORM rate_limit._null_argument('outcome', 'Pass ''ok'', ''dropped'' or ''timeout'', or leave it out (''ok'').');
    ELSIF outcome NOT IN ('ok', 'dropped', 'timeout') THEN
        PERFORM rate_limit._raise('22023', 'outcome must be ''ok'', ''dropped'' or ''timeout'', got "' || pg_catalog.left(outcome, 64) || '"',
            '''ok'': the backend served the call; ''dropped'': it refused or shed it (a 429, a 503); ''timeout'': the caller gave up waiting.');
    END IF;
    IF latency IS NOT NULL THEN
        IF rate_limit._interval_months(latency) <> 0 OR latency < interval '0' THEN
            PERFORM rate_limit._raise('22023', 'latency must be an interval of zero or more, without months',
                'Pass how long the call took, e.g. interval ''120 milliseconds'', or leave it out (the time the lease was held).');
        END IF;
        latency_us := COALESCE(rate_limit._interval_us(latency), 9223372036854775807);
    END IF;
    PERFORM rate_limit._check_session_store(p.store);
    t := rate_limit._policy_target(p, key, false);
    slot := lease & 1023;
    IF lease <= 0 OR slot >= (t.lim).rate THEN
        RETURN false;
    END IF;
    s := rate_limit._slot_target(t, slot);
    r := rate_limit._lock(s, 'release a lease');
    now := rate_limit._now();
    c := rate_limit._current(s.lim, r.level, r.at, r.numbers, s.changed_at, now);
    o := rate_limit._release_in(s.lim, c.new_level, c.new_at, now, lease);
    IF o.allowed AND r.level IS NOT NULL THEN
        PERFORM rate_limit._write(s, o.level, o.at);
        IF p.latency_target_us IS NOT NULL THEN
            PERFORM rate_limit._adapt_limit(p, t, c.new_at, now, latency_us, outcome);
        END IF;
    END IF;
    RETURN o.allowed AND r.level IS NOT NULL;
END
$$;

------------------------------------------------------------------------------------------------------------
-- Blocks by hand (src/api/blocks.rs): owner only.

CREATE FUNCTION rate_limit.block(policy text, key text, duration interval) RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._policy_named(policy);
    t rate_limit._target;
    us bigint;
    o rate_limit._outcome;
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    IF duration IS NULL THEN
        PERFORM rate_limit._null_argument('duration',
            'Pass how long to block the key, e.g. interval ''1 hour''; rate_limit.unblock lifts it.');
    END IF;
    us := rate_limit._block_duration_us('duration', duration);
    PERFORM rate_limit._check_session_store(p.store);
    t := rate_limit._policy_target(p, key, false);
    o := rate_limit._upsert(rate_limit._block_target(t, false), 'block', 0, us, 'block a key');
    IF NOT p.blocks_by_hand THEN
        UPDATE rate_limit.policies AS u SET blocks_by_hand = true
         WHERE u.name OPERATOR(pg_catalog.=) p.name AND NOT u.blocks_by_hand;
    END IF;
    -- what a call on the key is told from now on
    o.allowed := false;
    RETURN rate_limit._combine(ARRAY[t], ARRAY[o]);
END
$$;

CREATE FUNCTION rate_limit.unblock(policy text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._policy_named(policy);
    t rate_limit._target;
    b rate_limit._target;
    r rate_limit._row;
    now bigint;
    was_blocked boolean := false;
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    PERFORM rate_limit._check_session_store(p.store);
    t := rate_limit._policy_target(p, key, false);
    -- the real block, and the one a shadowed penalty box would have made
    FOREACH b IN ARRAY ARRAY[rate_limit._block_target(t, false), rate_limit._block_target(t, true)] LOOP
        r := rate_limit._lock(b, 'unblock a key');
        now := rate_limit._now();
        was_blocked := was_blocked
            OR NOT (rate_limit._evaluate(b.lim, r.level, r.at, r.numbers, b.changed_at, now, 0)).allowed;
        IF r.level IS NOT NULL THEN
            PERFORM rate_limit._write(b, 0, now); -- a clear state written over it
        END IF;
    END LOOP;
    RETURN was_blocked;
END
$$;

------------------------------------------------------------------------------------------------------------
-- Reservations (src/api/reservations.rs; the model's pipeline::single::reserve and settle).

-- The bucket of reservation id of t's key, read with hold hold_us (a settle does not know the hold: a
-- reservation expires when it was made to, whatever numbers it is read with).
CREATE FUNCTION rate_limit._reservation_target(t rate_limit._target, id bigint, hold_us bigint)
RETURNS rate_limit._target LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT ROW(t.policy || pg_catalog.chr(31) || 'reservation ' || id, t.key,
           rate_limit._numbers('reservation', 1, hold_us, 1), -9223372036854775808, false, t.policy, NULL, NULL,
           false, NULL, NULL)::rate_limit._target
$$;

-- A number of tokens reserve or settle takes: not NULL (22004), at least at_least (22023).
CREATE FUNCTION rate_limit._tokens_arg(argument text, value bigint, at_least bigint, hint text) RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF value IS NULL THEN
        PERFORM rate_limit._null_argument(argument, hint);
    END IF;
    IF value < at_least THEN
        PERFORM rate_limit._raise('22023', argument || ' must be ' || at_least || ' or more tokens, got ' || value,
            hint);
    END IF;
    RETURN value;
END
$$;

-- The key of t as it is, writing nothing (pipeline::single::report): its override's answer, or its bucket
-- (a take of 0 tokens, which only reports).
CREATE FUNCTION rate_limit._report(t rate_limit._target) RETURNS rate_limit._outcome
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    IF t.verdict IS NOT NULL THEN
        RETURN (rate_limit._take_targets(ARRAY[t], 0))[1];
    END IF;
    RETURN (rate_limit._store_take(ARRAY[t], 0))[1];
END
$$;

-- Frees the reservation (or booking) whose bucket is res if it is held (pipeline::single::free_held): the
-- tokens it held and when it would have expired; both NULL when it holds none (nothing written). Locks
-- its bucket: before its key's, the lock order's one exception (see semantics.md).
CREATE FUNCTION rate_limit._free_held(res rate_limit._target, action text, OUT tokens bigint, OUT expiry numeric)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    r rate_limit._row := rate_limit._lock(res, action);
    now bigint := rate_limit._now();
    c record;
BEGIN
    IF r.level IS NOT NULL THEN
        c := rate_limit._current(res.lim, r.level, r.at, r.numbers, res.changed_at, now);
        IF rate_limit._reservation_held(res.lim, c.new_level, c.new_at, now) THEN
            tokens := c.new_level;
            expiry := c.new_at::numeric + (res.lim).per_us;
            PERFORM rate_limit._write(res, 0, now);
        END IF;
    END IF;
END
$$;

-- What to pass as amounts of p's meters (reservations.rs, tokens_or_amounts): built only for an error.
CREATE FUNCTION rate_limit._meters_hint(p rate_limit._policy) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT 'Pass a JSON object of whole amounts of the policy''s meters: '
        || pg_catalog.string_agg(k, ', ' ORDER BY k COLLATE "C") || '.'
    FROM pg_catalog.jsonb_object_keys(p.meters) AS k
$$;

-- The tokens amounts of p's meters cost (the model's Meters::tokens): the sum of each amount times its
-- meter's weight, rounded up to a whole token. 22023 for a policy without meters or amounts they do not
-- read; 22003 beyond a bigint.
CREATE FUNCTION rate_limit._meter_tokens(p rate_limit._policy, amounts jsonb, argument text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    amount record;
    a numeric;
    total numeric := 0;
BEGIN
    IF p.meters IS NULL THEN
        PERFORM rate_limit._raise('22023', 'policy ' || rate_limit._quoted(p.name) || ' has no meters to weigh amounts with',
            'Give it meters with options => ''{"meters": {"input": 0.2, "output": 1}}'', or pass ' || argument
            || ' in tokens.');
    END IF;
    IF pg_catalog.jsonb_typeof(amounts) <> 'object' THEN
        PERFORM rate_limit._raise('22023', 'amounts must be a JSON object, got ' || pg_catalog.jsonb_typeof(amounts),
            rate_limit._meters_hint(p));
    END IF;
    FOR amount IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(amounts) AS e ORDER BY e.key COLLATE "C" LOOP
        IF NOT p.meters ? amount.key THEN
            PERFORM rate_limit._raise('22023', 'policy ' || rate_limit._quoted(p.name) || ' has no meter '
                || rate_limit._quoted(pg_catalog.left(amount.key, 80)), rate_limit._meters_hint(p));
        END IF;
        a := CASE WHEN pg_catalog.jsonb_typeof(amount.value) = 'number' THEN amount.value::text::numeric END;
        IF a IS NULL OR a < 0 OR a <> pg_catalog.trunc(a) OR a > 9223372036854775807 THEN
            PERFORM rate_limit._raise('22023', 'the amount of meter ' || rate_limit._quoted(amount.key)
                || ' must be a whole number of 0 or more, got ' || pg_catalog.left(amount.value::text, 80),
                rate_limit._meters_hint(p));
        END IF;
        total := total + a * (p.meters ->> amount.key)::numeric;
    END LOOP;
    total := pg_catalog.ceil(total);
    IF total > 9223372036854775807 THEN
        PERFORM rate_limit._raise('22003', 'amounts cost more than 9223372036854775807 tokens', 'Pass smaller amounts.');
    END IF;
    RETURN total::bigint;
END
$$;

-- The tokens of a reserve or settle (reservations.rs, tokens_or_amounts): given in tokens as argument,
-- or as amounts of p's meters, exactly one of them.
CREATE FUNCTION rate_limit._tokens_or_amounts(p rate_limit._policy, argument text, tokens bigint, amounts jsonb,
                                              at_least bigint, hint text, weighed_hint text) RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF amounts IS NULL THEN
        RETURN rate_limit._tokens_arg(argument, tokens, at_least, hint);
    ELSIF tokens IS NOT NULL THEN
        PERFORM rate_limit._raise('22023', 'pass ' || argument || ' or amounts, not both',
            'amounts are weighed with the policy''s meters into the tokens of ' || argument || '.');
    END IF;
    RETURN rate_limit._tokens_arg(argument, rate_limit._meter_tokens(p, amounts, argument), at_least, weighed_hint);
END
$$;

CREATE FUNCTION rate_limit.reserve(policy text, key text, estimate bigint DEFAULT NULL,
                                   hold interval DEFAULT '00:05:00'::interval, amounts jsonb DEFAULT NULL)
RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._token_policy(policy);
    t rate_limit._target;
    n bigint;
    us bigint;
    id bigint;
    o rate_limit._outcome;
    d rate_limit.decision;
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    n := rate_limit._tokens_or_amounts(p, 'estimate', estimate, amounts, 1,
        'Pass the tokens the work is expected to use (or amounts of the policy''s meters); settle it with what it used.',
        'Amounts of the work expected must cost 1 or more tokens.');
    IF hold IS NULL THEN
        PERFORM rate_limit._null_argument('hold',
            'Pass how long the reservation waits to be settled, e.g. interval ''5 minutes''.');
    END IF;
    us := rate_limit._hold_us('hold', hold);
    IF p.parent IS NOT NULL THEN
        RETURN rate_limit._reserve_over(ARRAY[p], key, ARRAY[n], us);
    END IF;
    PERFORM rate_limit._check_session_store(p.store);
    t := rate_limit._policy_target(p, key);
    o := (rate_limit._take_targets(ARRAY[t], n))[1];
    d := rate_limit._combine(ARRAY[t], ARRAY[o]);
    -- recorded only when tokens were taken: not for an exempt key nor a would-be denial in shadow mode
    IF o.allowed AND t.verdict IS NULL THEN
        -- 62 random bits, plus 1: positive, never 0
        id := ((rate_limit._random_bits() << 10) | (rate_limit._random_bits() & 1023)) + 1;
        o := rate_limit._upsert(rate_limit._reservation_target(t, id, us), 'take', n, 0, 'reserve tokens');
        IF o.allowed THEN
            d.lease := id;
        END IF;
    END IF;
    RETURN d;
END
$$;

CREATE FUNCTION rate_limit.settle(policy text, key text, reservation bigint, actual bigint DEFAULT NULL,
                                  amounts jsonb DEFAULT NULL)
RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._token_policy(policy);
    t rate_limit._target;
    used bigint;
    reserved bigint;
    o rate_limit._outcome;
    d rate_limit.decision;
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    IF reservation IS NULL THEN
        PERFORM rate_limit._null_argument('reservation',
            'Pass the id that rate_limit.reserve returned in its lease field.');
    END IF;
    used := rate_limit._tokens_or_amounts(p, 'actual', actual, amounts, 0,
        'Pass the tokens the work used (0 gives the whole reservation back), or amounts of the policy''s meters.',
        'Pass the amounts the work used.');
    IF p.parent IS NOT NULL THEN
        RETURN rate_limit._settle_over(ARRAY[p], key, reservation, ARRAY[used]);
    END IF;
    PERFORM rate_limit._check_session_store(p.store);
    t := rate_limit._policy_target(p, key);
    -- the reservation's bucket first, then the key's (the lock order's one exception: see semantics.md)
    reserved := (rate_limit._free_held(rate_limit._reservation_target(t, reservation, 1),
                                        'settle a reservation')).tokens;
    IF reserved IS NOT NULL AND used < reserved THEN
        o := rate_limit._refund_target(t, reserved - used, 'settle a reservation');
    ELSIF reserved IS NOT NULL AND used > reserved THEN
        o := rate_limit._charge_target(t, used - reserved, p.max_debt);
    ELSE
        o := rate_limit._report(t);
    END IF;
    d := rate_limit._combine(ARRAY[t], ARRAY[o]);
    d.allowed := reserved IS NOT NULL;
    d.lease := CASE WHEN reserved IS NOT NULL THEN reservation END;
    RETURN d;
END
$$;

-- The policies of a call over several limits (reservations_many.rs, policies_arg): 1 to 16, each known,
-- all in one store.
CREATE FUNCTION rate_limit._policies_many(policies text[]) RETURNS rate_limit._policy[]
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    n integer := pg_catalog.cardinality(policies);
    named rate_limit._policy[] := '{}';
BEGIN
    IF policies IS NULL THEN
        PERFORM rate_limit._null_argument('policies',
            'Pass an array of policy names, e.g. ARRAY[''requests_per_minute'', ''tokens_per_minute''].');
    END IF;
    IF n = 0 OR n > 16 THEN
        PERFORM rate_limit._raise('22023', 'policies must name 1 to 16 policies, got ' || n,
            'Split the limits over several reservations, or combine them in fewer policies.');
    END IF;
    FOR i IN 1..n LOOP
        named := named || rate_limit._token_policy(policies[i]);
    END LOOP;
    PERFORM rate_limit._one_store(named, 'reservation',
        'Give the policies the same store (create_policy''s store argument).');
    RETURN named;
END
$$;

-- Each policy's tokens of a call over several limits (reservations_many.rs, tokens_of_each): tokens (one
-- for every policy, or one per policy) or amounts weighed by each policy's own meters, exactly one of them;
-- each policy's checked as _tokens_or_amounts checks one, its messages naming the policy.
CREATE FUNCTION rate_limit._tokens_of_each(named rate_limit._policy[], argument text, plural text, tokens bigint[],
                                           amounts jsonb, at_least bigint, hint text, weighed_hint text)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    n integer := pg_catalog.cardinality(named);
    m integer := pg_catalog.cardinality(tokens);
    each bigint[] := '{}';
    v bigint;
BEGIN
    IF tokens IS NULL AND amounts IS NULL THEN
        PERFORM rate_limit._null_argument(plural, hint);
    ELSIF tokens IS NOT NULL AND amounts IS NOT NULL THEN
        PERFORM rate_limit._raise('22023', 'pass ' || plural || ' or amounts, not both',
            'amounts are weighed with each policy''s meters into the tokens of ' || plural || '.');
    ELSIF tokens IS NOT NULL AND m <> 1 AND m <> n THEN
        PERFORM rate_limit._raise('22023', plural || ' must hold one number, or one per policy (' || n || '), got ' || m,
            'Pass ARRAY[n] for every policy, or one number per policy in their order.');
    END IF;
    FOR i IN 1..n LOOP
        v := NULL;
        IF tokens IS NOT NULL THEN
            v := tokens[CASE WHEN m = 1 THEN 1 ELSE i END];
            IF v IS NULL THEN
                PERFORM rate_limit._null_argument(plural, hint);
            END IF;
        END IF;
        each := each || rate_limit._tokens_or_amounts(named[i], argument || ' of policy ' || rate_limit._quoted(named[i].name),
                                                      v, amounts, at_least, hint, weighed_hint);
    END LOOP;
    RETURN each;
END
$$;

-- The buckets of key under each of named, each once (reservations_many.rs, targets_of).
CREATE FUNCTION rate_limit._targets_of_one_key(named rate_limit._policy[], key text) RETURNS rate_limit._target[]
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    n integer := pg_catalog.cardinality(named);
    targets rate_limit._target[] := '{}';
    t rate_limit._target;
BEGIN
    FOR i IN 1..n LOOP
        t := rate_limit._policy_target(named[i], key);
        FOR j IN 1..i - 1 LOOP
            IF targets[j].ns = t.ns AND targets[j].key = t.key THEN
                PERFORM rate_limit._raise('22023', 'policy ' || rate_limit._quoted(t.ns) || ' is named twice for key '
                    || rate_limit._quoted(t.key), 'Name each (policy, key) once (a call on a child also takes from its parent''s bucket); pass a higher cost to take more tokens.');
            END IF;
        END LOOP;
        targets := targets || t;
    END LOOP;
    RETURN targets;
END
$$;

-- Reserves each[i] tokens of key under named[i] (one store), and each child's under its parent too, all or
-- nothing, for us microseconds: the decision over every bucket, with the reservation's id in lease when
-- recorded (reservations.rs, reserve_over): the body of reserve_many, and of reserve on a child.
CREATE FUNCTION rate_limit._reserve_over(named rate_limit._policy[], key text, each bigint[], us bigint)
RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    n integer;
    targets rate_limit._target[];
    id bigint;
    outcomes rate_limit._outcome[];
    o rate_limit._outcome;
    d rate_limit.decision;
    recorded boolean := false;
BEGIN
    SELECT w.named, w.tokens INTO named, each FROM rate_limit._with_parents(named, each) AS w;
    n := pg_catalog.cardinality(named);
    targets := rate_limit._targets_of_one_key(named, key);
    PERFORM rate_limit._check_session_store(named[1].store);
    outcomes := rate_limit._take_targets(targets, 1, each);
    d := rate_limit._combine(targets, outcomes);
    IF d.allowed THEN
        -- 62 random bits, plus 1: positive, never 0
        id := ((rate_limit._random_bits() << 10) | (rate_limit._random_bits() & 1023)) + 1;
        -- recorded only where tokens were taken: not for an exempt key nor a would-be denial in shadow mode
        FOR i IN 1..n LOOP
            IF outcomes[i].allowed AND targets[i].verdict IS NULL THEN
                o := rate_limit._upsert(rate_limit._reservation_target(targets[i], id, us), 'take', each[i], 0,
                                        'reserve tokens');
                recorded := recorded OR o.allowed;
            END IF;
        END LOOP;
        IF recorded THEN
            d.lease := id;
        END IF;
    END IF;
    RETURN d;
END
$$;

-- Settles reservation of key under each of named on each[i] tokens (and each child's under its parent
-- too): every reservation freed first, then every key's bucket refunded or charged, in the order every
-- call locks buckets in (reservations.rs, settle_over; settle_many in single.rs): the body of
-- settle_many, and of settle on a child.
CREATE FUNCTION rate_limit._settle_over(named rate_limit._policy[], key text, reservation bigint, each bigint[])
RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    n integer;
    targets rate_limit._target[];
    outcomes rate_limit._outcome[];
    reserved bigint[];
    settled boolean := false;
    i integer;
    o rate_limit._outcome;
    d rate_limit.decision;
BEGIN
    SELECT w.named, w.tokens INTO named, each FROM rate_limit._with_parents(named, each) AS w;
    n := pg_catalog.cardinality(named);
    targets := rate_limit._targets_of_one_key(named, key);
    PERFORM rate_limit._check_session_store(named[1].store);
    outcomes := pg_catalog.array_fill(rate_limit._not_looked_at(), ARRAY[n]);
    reserved := pg_catalog.array_fill(NULL::bigint, ARRAY[n]);
    FOREACH i IN ARRAY rate_limit._lock_order(targets) LOOP
        reserved[i] := (rate_limit._free_held(rate_limit._reservation_target(targets[i], reservation, 1),
                                               'settle a reservation')).tokens;
    END LOOP;
    FOREACH i IN ARRAY rate_limit._lock_order(targets) LOOP
        IF reserved[i] IS NOT NULL AND each[i] < reserved[i] THEN
            o := rate_limit._refund_target(targets[i], reserved[i] - each[i], 'settle a reservation');
        ELSIF reserved[i] IS NOT NULL AND each[i] > reserved[i] THEN
            o := rate_limit._charge_target(targets[i], each[i] - reserved[i], named[i].max_debt);
        ELSE
            o := rate_limit._report(targets[i]);
        END IF;
        outcomes[i] := o;
        settled := settled OR reserved[i] IS NOT NULL;
    END LOOP;
    d := rate_limit._combine(targets, outcomes);
    d.allowed := settled;
    d.lease := CASE WHEN settled THEN reservation END;
    RETURN d;
END
$$;

CREATE FUNCTION rate_limit.reserve_many(policies text[], key text, estimates bigint[] DEFAULT NULL,
                                        hold interval DEFAULT '00:05:00'::interval, amounts jsonb DEFAULT NULL)
RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    named rate_limit._policy[] := rate_limit._policies_many(policies);
    each bigint[];
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    each := rate_limit._tokens_of_each(named, 'estimate', 'estimates', estimates, amounts, 1,
        'Pass the tokens the work is expected to use (or amounts of the policy''s meters); settle it with what it used.',
        'Amounts of the work expected must cost 1 or more tokens.');
    IF hold IS NULL THEN
        PERFORM rate_limit._null_argument('hold',
            'Pass how long the reservation waits to be settled, e.g. interval ''5 minutes''.');
    END IF;
    RETURN rate_limit._reserve_over(named, key, each, rate_limit._hold_us('hold', hold));
END
$$;

CREATE FUNCTION rate_limit.settle_many(policies text[], key text, reservation bigint, actuals bigint[] DEFAULT NULL,
                                       amounts jsonb DEFAULT NULL)
RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    named rate_limit._policy[] := rate_limit._policies_many(policies);
    each bigint[];
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    IF reservation IS NULL THEN
        PERFORM rate_limit._null_argument('reservation',
            'Pass the id that rate_limit.reserve_many returned in its lease field.');
    END IF;
    each := rate_limit._tokens_of_each(named, 'actual', 'actuals', actuals, amounts, 0,
        'Pass the tokens the work used (0 gives the whole reservation back), or amounts of the policy''s meters.',
        'Pass the amounts the work used.');
    RETURN rate_limit._settle_over(named, key, reservation, each);
END
$$;

------------------------------------------------------------------------------------------------------------
-- Booked slots (src/api/bookings.rs; the model's pipeline::single::book and cancel).

-- The bucket of booking id of t's key, held for hold_us (a cancel reads it with any hold: it expires at
-- its booking's time, whatever numbers it is read with).
CREATE FUNCTION rate_limit._booking_target(t rate_limit._target, id bigint, hold_us bigint)
RETURNS rate_limit._target LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT ROW(t.policy || pg_catalog.chr(31) || 'booking ' || id, t.key,
           rate_limit._numbers('reservation', 1, hold_us, 1), -9223372036854775808, false, t.policy, NULL, NULL,
           false, NULL, NULL)::rate_limit._target
$$;

-- How long a caller waits at most, in microseconds: not NULL (22004), no months, 0 to 1 day (22023).
CREATE FUNCTION rate_limit._max_delay_us(max_delay interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    hint text := 'Pass how long the caller is ready to wait for its tokens, from interval ''0'' (only tokens that exist now) to interval ''1 day''.';
    us bigint;
BEGIN
    IF max_delay IS NULL THEN
        PERFORM rate_limit._null_argument('max_delay', hint);
    END IF;
    us := rate_limit._interval_us(max_delay);
    IF rate_limit._interval_months(max_delay) <> 0 OR us IS NULL OR us < 0 OR us > 86400000000 THEN
        PERFORM rate_limit._raise('22023', 'max_delay must be between 0 and 1 day, without months', hint);
    END IF;
    RETURN us;
END
$$;

CREATE FUNCTION rate_limit.book(policy text, key text, cost bigint DEFAULT 1, max_delay interval DEFAULT '1 day'::interval)
RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._token_policy(policy);
    t rate_limit._target;
    n bigint;
    delay bigint;
    decided rate_limit._outcome;
    o rate_limit._outcome;
    wait bigint := 0;
    booked_at bigint;
    id bigint;
    d rate_limit.decision;
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    n := rate_limit._tokens_arg('cost', cost, 1,
        'Pass the tokens to book, 1 or more (at most the burst plus the policy''s max_debt).');
    delay := rate_limit._max_delay_us(max_delay);
    IF (p.lim).algorithm <> 'token_bucket' THEN
        PERFORM rate_limit._raise('42809', 'policy ' || rate_limit._quoted(p.name) || ' is a '
            || (p.lim).algorithm || ' policy: only a token bucket books tokens ahead',
            'Book under a policy created with algorithm => ''token_bucket'' (or ''gcra''), whose steady refill gives every booking an exact time.');
    END IF;
    PERFORM rate_limit._no_parent(p, 'book');
    PERFORM rate_limit._check_session_store(p.store);
    t := rate_limit._policy_target(p, key);
    -- an override's answer, else a block (enforced, or reported in shadow mode): no bucket is touched
    IF t.verdict IS NOT NULL THEN
        decided := (rate_limit._take_targets(ARRAY[t], 0))[1];
    ELSE
        decided := (rate_limit._blocked(ARRAY[t]))[1];
    END IF;
    IF decided.allowed IS NOT NULL THEN
        o := decided;
    ELSE
        o := rate_limit._upsert(t, 'book', n, rate_limit._booking_depth(t.lim, p.max_debt, delay), 'book tokens');
        IF o.allowed THEN
            wait := rate_limit._booked_wait(t.lim, o.level);
            booked_at := o.at;
        ELSE
            o := (rate_limit._count_denials(ARRAY[t], ARRAY[o], ARRAY[decided]))[1];
        END IF;
    END IF;
    d := rate_limit._combine(ARRAY[t], ARRAY[o]);
    IF o.allowed THEN
        d.retry_after := wait * interval '1 microsecond';
    END IF;
    IF wait > 0 THEN
        -- 62 random bits, plus 1: positive, never 0
        id := ((rate_limit._random_bits() << 10) | (rate_limit._random_bits() & 1023)) + 1;
        -- as of the booking's instant: held until exactly its time
        o := rate_limit._upsert(rate_limit._booking_target(t, id, LEAST(wait, 86400000000)), 'record', n,
                                booked_at, 'book tokens');
        IF o.allowed THEN
            d.lease := id;
        END IF;
    END IF;
    RETURN d;
END
$$;

CREATE FUNCTION rate_limit.cancel_booking(policy text, key text, booking bigint)
RETURNS rate_limit.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._token_policy(policy);
    t rate_limit._target;
    held record;
    booked bigint;
    o rate_limit._outcome;
    d rate_limit.decision;
BEGIN
    PERFORM rate_limit._key_arg('key', key);
    IF booking IS NULL THEN
        PERFORM rate_limit._null_argument('booking', 'Pass the id that rate_limit.book returned in its lease field.');
    END IF;
    PERFORM rate_limit._check_session_store(p.store);
    t := rate_limit._policy_target(p, key);
    -- the booking's bucket first, then the key's (as settle)
    held := rate_limit._free_held(rate_limit._booking_target(t, booking, 1), 'cancel a booking');
    booked := held.tokens;
    IF booked IS NOT NULL AND t.verdict IS NULL THEN
        o := rate_limit._cancel_target(t, booked, held.expiry);
    ELSE
        o := rate_limit._report(t);
    END IF;
    d := rate_limit._combine(ARRAY[t], ARRAY[o]);
    d.allowed := booked IS NOT NULL;
    d.lease := CASE WHEN booked IS NOT NULL THEN booking END;
    RETURN d;
END
$$;

-- Gives a cancelled booking's tokens back to t's bucket when nothing was booked after them (the bucket
-- is out of debt by booked_at, Policy::cancel_booking): the bucket afterwards.
CREATE FUNCTION rate_limit._cancel_target(t rate_limit._target, tokens bigint, booked_at numeric)
RETURNS rate_limit._outcome LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    r rate_limit._row;
    now bigint;
    c record;
BEGIN
    r := rate_limit._lock(t, 'cancel a booking');
    now := rate_limit._now();
    IF r.level IS NULL THEN
        RETURN rate_limit._evaluate(t.lim, NULL, NULL, NULL, t.changed_at, now, 0);
    END IF;
    c := rate_limit._current(t.lim, r.level, r.at, r.numbers, t.changed_at, now);
    IF c.new_at::numeric + rate_limit._booked_wait(t.lim, c.new_level) <= booked_at THEN
        c := rate_limit._refund(t.lim, c.new_level, c.new_at, now, tokens);
        PERFORM rate_limit._write(t, c.new_level, c.new_at);
    END IF;
    RETURN rate_limit._take(t.lim, c.new_level, c.new_at, now, 0);
END
$$;
