-- take_batch (src/api/batch.rs, src/store/batch.rs, src/store/table/batch.rs) and limit_writes
-- (src/api/triggers.rs).

-- A batch of one policy's keys in three statements when nothing but the bucket applies (no block,
-- shadow mode or override, costs from 1 to the burst, a writable transaction): every row locked or
-- created full in key order (the lock order; DO UPDATE ... WHERE false locks a row and writes nothing),
-- the keys decided in the order given, the granted rows written. NULL when a row is ahead of the clock:
-- the per-key path (which rebases it) takes the batch then.
CREATE FUNCTION rate_limit._batch_each(t rate_limit._target, keys text[], costs bigint[],
                                       OUT allowed boolean[], OUT remaining bigint[], OUT retry_after bigint[])
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    now bigint := rate_limit._now();
    full_level bigint := rate_limit._full_level(t.lim);
    created text[];
    rec record;
    current_key text;
    lvl bigint;
    at bigint;
    numbers rate_limit._limit;
    changed boolean;
    o rate_limit._outcome;
    w_keys text[] := '{}';
    w_levels bigint[] := '{}';
    w_ats bigint[] := '{}';
BEGIN
    WITH inserted AS (
        INSERT INTO rate_limit.bucket_state AS b (namespace, key, level, updated_at, algorithm, rate, per_us, burst)
        SELECT t.ns, k.key, full_level, rate_limit._ts(now), (t.lim).algorithm, (t.lim).rate, (t.lim).per_us,
               (t.lim).burst
          FROM (SELECT DISTINCT u.key FROM pg_catalog.unnest(keys) AS u(key)) AS k
         ORDER BY k.key COLLATE "C"
        ON CONFLICT ON CONSTRAINT bucket_state_pkey DO UPDATE SET level = b.level WHERE false
        RETURNING b.key)
    SELECT pg_catalog.array_agg(i.key) INTO created FROM inserted AS i;
    created := COALESCE(created, '{}');
    IF EXISTS (SELECT FROM rate_limit.bucket_state AS s
                WHERE s.namespace OPERATOR(pg_catalog.=) t.ns AND s.key OPERATOR(pg_catalog.=) ANY (keys)
                  AND s.updated_at OPERATOR(pg_catalog.>) rate_limit._ts(now)) THEN
        RETURN;
    END IF;
    allowed := pg_catalog.array_fill(NULL::boolean, ARRAY[pg_catalog.cardinality(keys)]);
    remaining := pg_catalog.array_fill(NULL::bigint, ARRAY[pg_catalog.cardinality(keys)]);
    retry_after := pg_catalog.array_fill(NULL::bigint, ARRAY[pg_catalog.cardinality(keys)]);
    -- each key in the order given; a key named twice sees its own earlier grant
    FOR rec IN
        SELECT k.key, k.n, k.cost, s.level, rate_limit._us(s.updated_at) AS at,
               ROW(s.algorithm, s.rate, s.per_us, s.burst, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit AS numbers,
               c.key IS NOT NULL AS new
          FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(costs)) WITH ORDINALITY AS k(key, cost, n)
          JOIN rate_limit.bucket_state AS s
            ON s.namespace OPERATOR(pg_catalog.=) t.ns AND s.key OPERATOR(pg_catalog.=) k.key
          LEFT JOIN pg_catalog.unnest(created) AS c(key) ON c.key OPERATOR(pg_catalog.=) k.key
         ORDER BY k.key COLLATE "C", k.n
    LOOP
        IF current_key IS DISTINCT FROM rec.key THEN
            IF changed THEN
                w_keys := w_keys || current_key;
                w_levels := w_levels || lvl;
                w_ats := w_ats || at;
            END IF;
            current_key := rec.key;
            changed := false;
            -- a row this call created is the missing bucket it was
            IF rec.new THEN
                lvl := NULL;
                at := NULL;
            ELSE
                lvl := rec.level;
                at := rec.at;
            END IF;
            numbers := rec.numbers;
        END IF;
        o := rate_limit._evaluate(t.lim, lvl, at, numbers, t.changed_at, now, rec.cost);
        IF o.allowed THEN
            lvl := o.level;
            at := o.at;
            numbers := t.lim;
            changed := true;
        END IF;
        allowed[rec.n] := o.allowed;
        remaining[rec.n] := o.remaining;
        retry_after[rec.n] := CASE WHEN o.allowed THEN NULL ELSE o.retry_after END;
    END LOOP;
    IF changed THEN
        w_keys := w_keys || current_key;
        w_levels := w_levels || lvl;
        w_ats := w_ats || at;
    END IF;
    UPDATE rate_limit.bucket_state AS b
       SET level = u.level, updated_at = rate_limit._ts(u.at), algorithm = (t.lim).algorithm,
           rate = (t.lim).rate, per_us = (t.lim).per_us, burst = (t.lim).burst
      FROM ROWS FROM (pg_catalog.unnest(w_keys), pg_catalog.unnest(w_levels), pg_catalog.unnest(w_ats)) AS u(key, level, at)
     WHERE b.namespace OPERATOR(pg_catalog.=) t.ns AND b.key OPERATOR(pg_catalog.=) u.key;
END
$$;

CREATE FUNCTION rate_limit.take_batch(policy text, keys text[], costs integer[] DEFAULT NULL,
                                      all_or_nothing boolean DEFAULT false)
RETURNS TABLE (ordinality integer, key text, allowed boolean, remaining bigint, retry_after interval)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy;
    n integer;
    c bigint[] := '{}';
    t rate_limit._target;
    template rate_limit._target;
    targets rate_limit._target[] := '{}';
    outcomes rate_limit._outcome[];
    held rate_limit._outcome[];
    ok boolean[];
    left_ bigint[];
    wait_ bigint[];
    overridden text[];
    b record;
    o rate_limit._outcome;
    i integer;
BEGIN
    IF keys IS NULL THEN
        PERFORM rate_limit._null_argument('keys', 'Pass an array of keys, e.g. ARRAY[''user1'', ''user2''].');
    END IF;
    n := COALESCE(pg_catalog.cardinality(keys), 0);
    IF n > 1000000 THEN
        PERFORM rate_limit._raise('22023', 'keys holds ' || n || ' keys, more than 1000000',
            'Split the job into batches of at most 1000000 keys.');
    END IF;
    p := rate_limit._token_policy(policy);
    PERFORM rate_limit._no_parent(p, 'take_batch');
    FOR i IN 1..n LOOP
        IF keys[i] IS NULL THEN
            PERFORM rate_limit._null_argument('keys[' || i || ']', 'Every element of keys must be a key; filter NULLs out first.');
        END IF;
        PERFORM rate_limit._key_arg('keys', keys[i]);
    END LOOP;
    IF costs IS NULL THEN
        c := pg_catalog.array_fill(1::bigint, ARRAY[n]);
    ELSE
        IF COALESCE(pg_catalog.cardinality(costs), 0) <> n THEN
            PERFORM rate_limit._raise('22023', 'costs holds ' || COALESCE(pg_catalog.cardinality(costs), 0)
                || ' values but keys holds ' || n, 'Pass one cost per key in the same order, or NULL for 1 each.');
        END IF;
        FOR i IN 1..n LOOP
            IF costs[i] IS NULL THEN
                PERFORM rate_limit._null_argument('costs[' || i || ']', 'Pass 0 or more tokens for every key.');
            ELSIF costs[i] < 0 THEN
                PERFORM rate_limit._out_of_range('costs[' || i || ']', costs[i], 0, 2147483647);
            END IF;
            c := c || costs[i]::bigint;
        END LOOP;
    END IF;
    IF all_or_nothing IS NULL THEN
        PERFORM rate_limit._null_argument('all_or_nothing',
            'Pass true to grant the batch whole or not at all, false to decide each key.');
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    PERFORM rate_limit._check_session_store(p.store);
    IF all_or_nothing THEN
        IF n > 16 THEN
            PERFORM rate_limit._raise('22023', 'an all-or-nothing batch names at most 16 keys, got ' || n,
                'Hold fewer buckets at once: split the batch, or pass all_or_nothing => false.');
        END IF;
        IF EXISTS (SELECT FROM pg_catalog.unnest(c) AS x WHERE x <> c[1]) THEN
            PERFORM rate_limit._raise('22023', 'an all-or-nothing batch takes one cost from every key',
                'Pass the same cost for every key, or all_or_nothing => false.');
        END IF;
        FOR i IN 1..n LOOP
            targets := targets || rate_limit._policy_target(p, keys[i]);
        END LOOP;
        FOR i IN 2..n LOOP
            IF keys[i] = ANY (keys[1:i - 1]) THEN
                PERFORM rate_limit._raise('22023', 'key "' || keys[i] || '" is named twice in an all-or-nothing batch',
                    'Name each key once; pass a higher cost to take more tokens.');
            END IF;
        END LOOP;
        outcomes := rate_limit._take_targets(targets, c[1]);
        IF NOT EXISTS (SELECT FROM pg_catalog.generate_series(1, n) AS g
                        WHERE NOT outcomes[g].allowed AND NOT targets[g].shadow) THEN
            NULL; -- granted
        ELSE
            -- nothing was taken: the keys that would have granted report what they hold
            FOR i IN 1..n LOOP
                o := outcomes[i];
                IF o.allowed THEN
                    o := (rate_limit._take_targets(ARRAY[targets[i]], 0))[1];
                END IF;
                o.allowed := false;
                outcomes[i] := o;
            END LOOP;
        END IF;
        RETURN QUERY SELECT g, keys[g], outcomes[g].allowed, outcomes[g].remaining,
                            CASE WHEN outcomes[g].allowed THEN NULL ELSE rate_limit._interval(outcomes[g].retry_after) END
                       FROM pg_catalog.generate_series(1, n) AS g;
        RETURN;
    END IF;
    template := rate_limit._policy_target(p, '', false);
    -- the keys with an override are decided one by one after the others, in key order
    SELECT pg_catalog.array_agg(o2.key) INTO overridden FROM rate_limit.key_overrides AS o2
     WHERE o2.policy OPERATOR(pg_catalog.=) p.name AND o2.key OPERATOR(pg_catalog.=) ANY (keys)
       AND o2.set_at OPERATOR(pg_catalog.>=) rate_limit._ts(p.created_at);
    overridden := COALESCE(overridden, '{}');
    ok := pg_catalog.array_fill(NULL::boolean, ARRAY[n]);
    left_ := pg_catalog.array_fill(NULL::bigint, ARRAY[n]);
    wait_ := pg_catalog.array_fill(NULL::bigint, ARRAY[n]);
    IF NOT template.shadow AND NOT template.may_block AND NOT rate_limit._in_read_only()
       AND pg_catalog.cardinality(overridden) = 0
       AND NOT EXISTS (SELECT FROM pg_catalog.unnest(c) AS x WHERE x < 1 OR x > (p.lim).burst) THEN
        b := rate_limit._batch_each(template, keys, c);
        IF b.allowed IS NOT NULL THEN
            ok := b.allowed;
            left_ := b.remaining;
            wait_ := b.retry_after;
        END IF;
    END IF;
    IF ok[1] IS NULL THEN
        -- every key on its own, in key order (the lock order); a key named twice in the order given
        FOR i IN SELECT g FROM pg_catalog.generate_series(1, n) AS g
                  ORDER BY (keys[g] = ANY (overridden)), keys[g] COLLATE "C", g LOOP
            IF keys[i] = ANY (overridden) THEN
                t := rate_limit._policy_target(p, keys[i]);
            ELSE
                t := template;
                t.key := keys[i];
            END IF;
            o := (rate_limit._take_targets(ARRAY[t], c[i]))[1];
            ok[i] := o.allowed;
            left_[i] := o.remaining;
            wait_[i] := CASE WHEN o.allowed THEN NULL ELSE o.retry_after END;
        END LOOP;
    END IF;
    RETURN QUERY SELECT g, keys[g], ok[g], left_[g], rate_limit._interval(wait_[g])
                   FROM pg_catalog.generate_series(1, n) AS g;
END
$$;

-- BEFORE INSERT OR UPDATE ... FOR EACH ROW: takes cost tokens (third argument, default 1) from the bucket
-- of the row's key column (second argument) under a policy (first argument); a denied row raises 53400
-- with the decision's RateLimit header values in DETAIL.
CREATE FUNCTION rate_limit.limit_writes() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    usage text := 'Use CREATE TRIGGER ... BEFORE INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION rate_limit.limit_writes(''policy'', ''key_column'' [, ''cost'']).';
    cost integer := 1;
    key text;
    d rate_limit.decision;
    h jsonb;
BEGIN
    IF TG_LEVEL <> 'ROW' OR TG_WHEN <> 'BEFORE' OR TG_OP NOT IN ('INSERT', 'UPDATE') THEN
        PERFORM rate_limit._raise('39P01', 'limit_writes must fire BEFORE INSERT or UPDATE, FOR EACH ROW', usage);
    END IF;
    IF TG_NARGS NOT IN (2, 3) THEN
        PERFORM rate_limit._raise('39P01',
            'limit_writes takes 2 or 3 trigger arguments (policy, key column, cost), got ' || TG_NARGS, usage);
    END IF;
    IF TG_NARGS = 3 THEN
        IF pg_catalog.btrim(TG_ARGV[2]) !~ '^\+?[0-9]{1,10}$' OR pg_catalog.btrim(TG_ARGV[2])::numeric > 2147483647 THEN
            PERFORM rate_limit._raise('22023', 'cost must be an integer from 0 to 2147483647, got '
                || rate_limit._quoted(TG_ARGV[2]), 'Pass the tokens one row takes as the third trigger argument, e.g. ''1''.');
        END IF;
        cost := pg_catalog.btrim(TG_ARGV[2])::integer;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_attribute AS a
                    WHERE a.attrelid OPERATOR(pg_catalog.=) TG_RELID AND a.attname OPERATOR(pg_catalog.=) TG_ARGV[1]
                      AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped) THEN
        PERFORM rate_limit._raise('42703', 'table ' || rate_limit._quoted(TG_TABLE_NAME) || ' has no column '
            || rate_limit._quoted(TG_ARGV[1]) || ' to limit writes by',
            'Name a column of the table as the second trigger argument (case matters).');
    END IF;
    -- the column's text as its type's output function writes it (format's %s), as the compiled edition reads it
    EXECUTE pg_catalog.format('SELECT CASE WHEN pg_catalog.num_nulls(($1).%I) = 1 THEN NULL ELSE pg_catalog.format(''%%s'', ($1).%I) END',
                              TG_ARGV[1], TG_ARGV[1]) INTO key USING NEW;
    IF key IS NULL THEN
        PERFORM rate_limit._raise('22004', 'column ' || rate_limit._quoted(TG_ARGV[1])
            || ' is NULL: there is no key to limit this write by',
            'Give the column a value (NOT NULL or a default), or limit by another column.');
    END IF;
    d := rate_limit._take_policy(TG_ARGV[0], key, cost);
    IF d.allowed THEN
        RETURN NEW;
    END IF;
    h := rate_limit.headers(ROW(false, d.remaining, d."limit", d.retry_after, d.reset_after, TG_ARGV[0], false,
                                NULL)::rate_limit.decision, TG_ARGV[0]);
    PERFORM rate_limit._raise('53400',
        'rate limit exceeded: policy ' || rate_limit._quoted(TG_ARGV[0]) || ', key ' || rate_limit._quoted(key),
        CASE WHEN d.retry_after IS NULL
             THEN 'This write costs more than the policy''s burst: it can never be granted.'
             ELSE 'Retry after ' || rate_limit._cdiv(rate_limit._interval_us(d.retry_after), 1000000)
                  || ' second(s), when the bucket holds enough tokens again.' END,
        (SELECT pg_catalog.string_agg(e.key || ': ' || (e.value #>> '{}'), ', ' ORDER BY e.key COLLATE "C")
           FROM pg_catalog.jsonb_each(h) AS e));
END
$$;
