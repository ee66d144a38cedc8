-- Named policies: their checks (src/policies/checks.rs, with the same messages), their rows, and the
-- owner's functions that change them; per-key overrides (src/api/overrides.rs). Policies are read per call,
-- with the call's statement snapshot: a change committed before a statement starts applies to it.

-- The settings the compiled edition reads from superuser-only GUCs. A placeholder GUC would be settable by
-- every role, so here each is a function that only its owner (the edition's owner) may replace:
--   CREATE OR REPLACE FUNCTION rate_limit.max_wait() RETURNS interval LANGUAGE sql IMMUTABLE
--       AS $$ SELECT interval '10 seconds' $$;
-- Statements that use one are planned again after it is replaced. One exception: the bound of named
-- policies is checked only by the owner's functions (create_policy, alter_policy, set_override), so a
-- session may raise it for itself as on the compiled edition (SET rate_limit.max_policy_refill_time =
-- '36500d'; a number alone is minutes): only the roles that may change policies can use it.
CREATE FUNCTION rate_limit.max_refill_time() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '86400 seconds' $$;
CREATE FUNCTION rate_limit.max_policy_refill_time() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '400 days' $$;
CREATE FUNCTION rate_limit.max_wait() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '30 seconds' $$;
COMMENT ON FUNCTION rate_limit.max_refill_time() IS
    'Setting (portable edition): how long a bucket of a limit a caller chooses may take to refill (the compiled edition''s rate_limit.max_refill_time); the owner replaces it';
COMMENT ON FUNCTION rate_limit.max_policy_refill_time() IS
    'Setting (portable edition): how long a named policy''s bucket may stay short (rate_limit.max_policy_refill_time); the owner replaces it';
COMMENT ON FUNCTION rate_limit.max_wait() IS
    'Setting (portable edition): the longest rate_limit.wait per statement (rate_limit.max_wait); the owner replaces it';

-- A policy as a call uses it: its limit, and what the compiled edition's Named holds.
CREATE TYPE rate_limit._policy AS (
    name           text,
    lim            rate_limit._limit,
    created_at     bigint,
    changed_at     bigint,
    shadow         boolean,
    max_debt       bigint,
    store          text,
    block_after    bigint,   -- the penalty box (NULL: none)
    penalty_for    bigint,   -- its block, in us
    blocks_by_hand boolean,
    -- the row's numbers, which an override's missing ones are
    rate           bigint,
    per            interval,
    burst          bigint,
    time_zone      text,
    anchor         timestamp,
    -- an adaptive concurrency policy's settings (NULL: fixed leases)
    adaptive_min   bigint,
    latency_target_us bigint,
    -- weighted meters: what a unit of each named quantity costs in tokens (NULL: none)
    meters         jsonb,
    -- the policy whose bucket of a key a call on this one also takes from (NULL: none)
    parent         text
);

-- 22023 for numbers that do not make a policy (PolicyError), with its hint.
CREATE FUNCTION rate_limit._policy_error(kind text) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    limit_hint text := 'Pass rate >= 1, burst >= 1 and a positive per; burst × per (in microseconds) must fit in bigint.';
BEGIN
    CASE kind
    WHEN 'rate' THEN
        PERFORM rate_limit._raise('22023', 'the refill rate must be at least 1', limit_hint);
    WHEN 'period' THEN
        PERFORM rate_limit._raise('22023', 'the refill period must be at least 1 microsecond', limit_hint);
    WHEN 'burst' THEN
        PERFORM rate_limit._raise('22023', 'the capacity must be at least 1', limit_hint);
    WHEN 'too_large' THEN
        PERFORM rate_limit._raise('22023', 'capacity × period is too large to count exactly', limit_hint);
    WHEN 'window_burst' THEN
        PERFORM rate_limit._raise('22023',
            'a window algorithm allows rate tokens per window: burst must be NULL or equal to rate',
            'Omit burst (it defaults to rate), or use algorithm => ''token_bucket'' for a burst above the rate.');
    WHEN 'window_too_large' THEN
        PERFORM rate_limit._raise('22023', 'a window algorithm counts at most 2147483647 tokens per window',
            'Use a shorter window with a proportionally lower rate.');
    WHEN 'too_many_leases' THEN
        PERFORM rate_limit._raise('22023', 'a concurrency policy allows at most 1000 leases per key',
            'Allow at most 1000 leases per key (rate), or split the key.');
    ELSE -- leases_burst
        PERFORM rate_limit._raise('22023',
            'a concurrency policy holds at most rate leases at once: burst must be NULL or equal to rate',
            'Omit burst: rate is the number of leases a key may hold at once.');
    END CASE;
END
$$;

-- Policy::new: the limit of algorithm, rate per period_us, at most burst, or 22023.
CREATE FUNCTION rate_limit._new_limit(algorithm text, rate bigint, period_us bigint, burst bigint)
RETURNS rate_limit._limit LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF rate < 1 THEN
        PERFORM rate_limit._policy_error('rate');
    ELSIF period_us < 1 THEN
        PERFORM rate_limit._policy_error('period');
    ELSIF burst < 1 THEN
        PERFORM rate_limit._policy_error('burst');
    ELSIF burst::numeric * period_us > 9223372036854775807 THEN
        PERFORM rate_limit._policy_error('too_large');
    ELSIF algorithm = 'concurrency' AND burst <> rate THEN
        PERFORM rate_limit._policy_error('leases_burst');
    ELSIF algorithm <> 'token_bucket' AND burst <> rate THEN
        PERFORM rate_limit._policy_error('window_burst');
    ELSIF algorithm <> 'token_bucket' AND burst > 2147483647 THEN
        PERFORM rate_limit._policy_error('window_too_large');
    ELSIF algorithm = 'concurrency' AND rate > 1000 THEN
        PERFORM rate_limit._policy_error('too_many_leases');
    END IF;
    RETURN ROW(algorithm, rate, period_us, burst, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit;
END
$$;

-- An interval argument as microseconds: positive and without months (22023 otherwise).
CREATE FUNCTION rate_limit._period_us(argument text, per interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    us bigint;
BEGIN
    IF rate_limit._interval_months(per) <> 0 THEN
        PERFORM rate_limit._raise('22023', argument || ' must not contain months or years, whose length varies',
            'Use days, hours, minutes or seconds, e.g. interval ''30 days''; for a quota that resets on the first of the month, create_policy(..., algorithm => ''calendar_window'').');
    END IF;
    us := rate_limit._interval_us(per);
    IF us IS NULL AND EXTRACT(DAY FROM per) > 0 THEN
        PERFORM rate_limit._raise('22023', argument || ' is too long', NULL);
    ELSIF us IS NULL OR us < 1 THEN
        PERFORM rate_limit._raise('22023', argument || ' must be a positive interval',
            'Pass an interval of at least 1 microsecond, e.g. interval ''1 minute''.');
    END IF;
    RETURN us;
END
$$;

-- A block's length: positive, without months, at most 100 years.
CREATE FUNCTION rate_limit._block_duration_us(argument text, duration interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    us bigint := rate_limit._period_us(argument, duration);
BEGIN
    IF us > rate_limit._max_block_us() THEN
        PERFORM rate_limit._raise('22023', argument || ' must be at most 100 years',
            'Pass a shorter interval; a key blocked for good is better refused by the application.');
    END IF;
    RETURN us;
END
$$;

-- A reservation's hold in microseconds: positive, at most one day (MAX_HOLD_US); 22023 otherwise.
CREATE FUNCTION rate_limit._hold_us(argument text, hold interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    us bigint := rate_limit._period_us(argument, hold);
BEGIN
    IF us > 86400000000 THEN
        PERFORM rate_limit._raise('22023', argument || ' must be at most 1 day',
            'Pass a shorter interval: a reservation not settled by then is settled at its estimate.');
    END IF;
    RETURN us;
END
$$;

-- The canonical name of a time zone PostgreSQL knows (as SET TimeZone loads it), or 22023.
CREATE FUNCTION rate_limit._known_zone(zone text) RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    saved text := pg_catalog.current_setting('TimeZone');
    canonical text;
BEGIN
    BEGIN
        PERFORM pg_catalog.set_config('TimeZone', zone, true);
        canonical := pg_catalog.current_setting('TimeZone');
        PERFORM pg_catalog.set_config('TimeZone', saved, true);
    EXCEPTION WHEN invalid_parameter_value THEN
        canonical := NULL;
    END;
    -- SET TimeZone also takes offsets ('5', 'INTERVAL ...') that name no zone: refuse what AT TIME ZONE
    -- cannot read
    IF canonical IS NULL OR zone = '' OR zone ~ '^[-+0-9 .:]+$' THEN
        PERFORM rate_limit._raise('22023', 'unknown time zone ' || rate_limit._quoted(zone),
            'Use a name from pg_timezone_names, e.g. ''Europe/Paris'' or ''UTC''.');
    END IF;
    RETURN canonical;
END
$$;

-- A calendar window's limit: per's step (whole months or days, at most 100 years), zone, anchor.
CREATE FUNCTION rate_limit._calendar_limit(rate bigint, per interval, zone text, anchor timestamp)
RETURNS rate_limit._limit LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    months bigint := rate_limit._interval_months(per);
    days bigint := EXTRACT(DAY FROM per)::bigint;
    time_us numeric := EXTRACT(HOUR FROM per)::numeric * 3600000000 + EXTRACT(MINUTE FROM per)::numeric * 60000000
                       + EXTRACT(MICROSECONDS FROM per)::numeric;
    anchor_us bigint;
    l rate_limit._limit;
BEGIN
    IF months > 1200 OR days > 36525 THEN
        PERFORM rate_limit._raise('22023', 'a calendar window''s per must be at most 100 years, got ' || per,
            'Use a shorter window, e.g. interval ''1 year'' with a proportionally lower rate.');
    END IF;
    IF NOT ((months > 0 AND days = 0 AND time_us = 0) OR (months = 0 AND days > 0 AND time_us = 0)) THEN
        PERFORM rate_limit._raise('22023', 'a calendar window''s per must be whole months or whole days, got ' || per,
            'Use interval ''1 day'', ''1 week'', ''1 month'', ''3 months'' or ''1 year''; for shorter windows use algorithm => ''fixed_window''.');
    END IF;
    zone := rate_limit._known_zone(zone);
    IF anchor IS NOT NULL THEN
        IF NOT pg_catalog.isfinite(anchor) OR EXTRACT(MICROSECONDS FROM anchor)::bigint % 1000000 <> 0 THEN
            PERFORM rate_limit._raise('22023', 'a calendar window''s anchor must be a finite timestamp in whole seconds',
                'Pass the wall-clock start of one window, e.g. timestamp ''2026-01-15 00:00''.');
        END IF;
        anchor_us := rate_limit._wall_us(anchor);
    END IF;
    l := rate_limit._new_limit('calendar_window', rate,
                               CASE WHEN months > 0 THEN months * 2629746000000 ELSE days * 86400000000 END, rate);
    l.zone := zone;
    l.months := months;
    l.days := days;
    l.anchor := COALESCE(anchor_us, CASE WHEN months > 0 THEN 0 ELSE 2 * 86400000000 END);
    RETURN l;
END
$$;

-- checks::build: the limit of a policy's numbers (burst NULL: rate), or 22023.
CREATE FUNCTION rate_limit._build(algorithm text, rate bigint, per interval, burst bigint, zone text,
                                  anchor timestamp)
RETURNS rate_limit._limit LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF algorithm = 'calendar_window' THEN
        IF burst IS NOT NULL AND burst <> rate THEN
            PERFORM rate_limit._policy_error('window_burst');
        END IF;
        RETURN rate_limit._calendar_limit(rate, per, COALESCE(zone, 'UTC'), anchor);
    END IF;
    IF zone IS NOT NULL OR anchor IS NOT NULL THEN
        PERFORM rate_limit._raise('22023',
            'time_zone and anchor belong to calendar windows, not to algorithm ''' || algorithm || '''',
            'Use algorithm => ''calendar_window'' for windows that turn at dates, or omit them.');
    END IF;
    RETURN rate_limit._new_limit(algorithm, rate, rate_limit._period_us('per', per), COALESCE(burst, rate));
END
$$;

CREATE FUNCTION rate_limit._parse_algorithm(s text) RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF s IN ('token_bucket', 'fixed_window', 'sliding_window', 'calendar_window', 'concurrency') THEN
        RETURN s;
    END IF;
    -- the generic cell rate algorithm decides exactly as the token bucket: another name of it
    IF s = 'gcra' THEN
        RETURN 'token_bucket';
    END IF;
    PERFORM rate_limit._raise('22023', 'unknown algorithm ' || rate_limit._quoted(s),
        'Use ''token_bucket'' (or ''gcra''), ''fixed_window'', ''sliding_window'', ''calendar_window'' or ''concurrency''.');
END
$$;

-- A policy's store: 'table', 'memory' or NULL (the session's rate_limit.store). The portable edition has
-- the table store only: a call of a policy kept in memory raises 55000, as an unpreloaded compiled server
-- does.
CREATE FUNCTION rate_limit._parse_store(s text) RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF s IS NOT NULL AND s NOT IN ('table', 'memory') THEN
        PERFORM rate_limit._raise('22023', 'store must be ''table'', ''memory'' or NULL, got ' || rate_limit._quoted(s),
            'NULL follows the rate_limit.store setting of the calling session.');
    END IF;
    RETURN s;
END
$$;

-- 55000: the memory store needs the compiled edition's library, preloaded.
CREATE FUNCTION rate_limit._memory_store() RETURNS void
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
SELECT rate_limit._raise('55000', 'the rate_limit memory store is not available in the portable edition',
    'SET rate_limit.store = ''table'' (the default), keep the policy''s buckets in the table store, or install the compiled edition with shared_preload_libraries = ''rate_limit''.',
    'The portable edition is written in SQL and PL/pgSQL: it has no shared memory.')
$$;

-- The store of a call: the policy's (policy_store), else the session's rate_limit.store; 55000 unless it
-- is the table store.
CREATE FUNCTION rate_limit._check_session_store(policy_store text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF COALESCE(policy_store, pg_catalog.current_setting('rate_limit.store', true)) = 'memory' THEN
        PERFORM rate_limit._memory_store();
    END IF;
END
$$;

-- A policy name: 1 to 63 ASCII letters, digits, '_', '.', ':', '/' or '-'.
CREATE FUNCTION rate_limit._check_name(name text) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF name !~ '^[A-Za-z0-9_.:/-]{1,63}$' COLLATE "C" OR pg_catalog.octet_length(name) > 63 THEN
        PERFORM rate_limit._raise('22023', 'invalid policy name ' || rate_limit._quoted(name),
            'Use 1 to 63 ASCII letters, digits, ''_'', ''.'', '':'', ''/'' or ''-''.');
    END IF;
END
$$;

-- 42704 for an unknown policy name.
CREATE FUNCTION rate_limit._unknown_policy(name text) RETURNS void
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
SELECT rate_limit._raise('42704', 'rate limit policy ' || rate_limit._quoted(name) || ' does not exist',
    'Create it with rate_limit.create_policy(name, rate, per), or see rate_limit.policies.')
$$;

-- 42809 for a policy of the wrong kind.
CREATE FUNCTION rate_limit._wrong_kind(name text, concurrency boolean) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF concurrency THEN
        PERFORM rate_limit._raise('42809', 'policy ' || rate_limit._quoted(name) || ' limits leases held at once, not tokens',
            'Take a lease with rate_limit.acquire(policy, key) and give it back with rate_limit.release.');
    END IF;
    PERFORM rate_limit._raise('42809', 'policy ' || rate_limit._quoted(name) || ' limits tokens, not leases held at once',
        'rate_limit.acquire and release need a policy created with algorithm => ''concurrency''.');
END
$$;

-- The policy a row of rate_limit.policies makes (policies::checked): every parameter checked as a
-- caller's would be (22023), the numbers a window keeps, a calendar's canonical zone.
CREATE FUNCTION rate_limit._checked(r rate_limit.policies) RETURNS rate_limit._policy
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    l rate_limit._limit := rate_limit._build(r.algorithm, r.rate, r.per, r.burst, r.time_zone, r.anchor);
    most bigint := rate_limit._most_debt(l);
    p rate_limit._policy;
BEGIN
    IF r.max_debt < 0 THEN
        PERFORM rate_limit._raise('22023', 'max_debt must be 0 or more tokens',
            'max_debt is in tokens: how far below zero rate_limit.charge may drive a bucket (0: not at all).');
    ELSIF r.max_debt > most THEN
        PERFORM rate_limit._raise('22023', 'max_debt must be at most ' || most || ' tokens for these numbers',
            'max_debt is in tokens: how far below zero rate_limit.charge may drive a bucket (0: not at all).');
    END IF;
    p.name := r.name;
    p.lim := l;
    p.created_at := rate_limit._us(r.created_at);
    p.changed_at := rate_limit._us(r.changed_at);
    p.shadow := r.shadow;
    p.max_debt := r.max_debt;
    p.store := r.store;
    p.blocks_by_hand := r.blocks_by_hand;
    IF r.block_after IS NOT NULL OR r.block_for IS NOT NULL THEN
        IF r.block_after IS NULL OR r.block_for IS NULL THEN
            PERFORM rate_limit._raise('22023', 'block_after and block_for go together',
                'Pass both block_after (denials within one window of the policy) and block_for (how long the key is then blocked), e.g. block_after => 10, block_for => interval ''15 minutes''; or neither, for blocks by hand only.');
        ELSIF r.block_after < 1 OR r.block_after > 2147483647 THEN
            PERFORM rate_limit._out_of_range('block_after', r.block_after, 1, 2147483647);
        END IF;
        p.block_after := r.block_after;
        p.penalty_for := rate_limit._block_duration_us('block_for', r.block_for);
    END IF;
    -- checks::adaptive
    IF r.latency_target IS NULL THEN
        IF r.adaptive_min IS NOT NULL THEN
            PERFORM rate_limit._raise('22023', 'policy option "adaptive_min" needs "latency_target"',
                'Make the policy adaptive with options => ''{"latency_target": "250 milliseconds", "adaptive_min": 2}'', or clear adaptive_min with null.');
        END IF;
    ELSE
        IF l.algorithm <> 'concurrency' THEN
            PERFORM rate_limit._raise('22023', 'policy option "latency_target" adapts a concurrency policy''s leases; this policy''s algorithm is ' || l.algorithm,
                'Use it with algorithm => ''concurrency'', or clear it with options => ''{"latency_target": null, "adaptive_min": null}''.');
        END IF;
        p.latency_target_us := rate_limit._period_us('latency_target', r.latency_target);
        p.adaptive_min := COALESCE(r.adaptive_min, 1);
        IF p.adaptive_min < 1 OR p.adaptive_min > l.rate THEN
            PERFORM rate_limit._raise('22023', 'policy option "adaptive_min" must be from 1 to the policy''s rate ('
                || l.rate || '), got ' || p.adaptive_min,
                'The limit of an adaptive policy stays between adaptive_min and the policy''s rate (its most leases).');
        END IF;
    END IF;
    p.meters := r.meters;
    p.parent := r.parent;
    p.rate := l.rate;
    p.per := r.per;
    p.burst := l.burst;
    p.time_zone := l.zone;
    p.anchor := CASE WHEN l.zone IS NULL THEN NULL ELSE r.anchor END;
    RETURN p;
END
$$;

-- The numbers of the block buckets of a policy's keys.
CREATE FUNCTION rate_limit._block_limit(p rate_limit._policy) RETURNS rate_limit._limit
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT ROW('block', COALESCE(p.block_after, 1), (p.lim).per_us, COALESCE(p.block_after, 1),
           NULL, NULL, NULL, NULL, NULL)::rate_limit._limit
$$;

-- bounds::policy: a named policy's buckets are full again within rate_limit.max_policy_refill_time() of
-- any role's last call, however deep its debt or long its penalty box's block (22023 otherwise).
CREATE FUNCTION rate_limit._check_policy_bound(p rate_limit._policy) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    longest bigint := GREATEST(rate_limit._longest_short_us(p.lim, p.max_debt), COALESCE(p.penalty_for, 0));
    setting text := pg_catalog.current_setting('rate_limit.max_policy_refill_time', true);
    max_us bigint := rate_limit._interval_us(CASE WHEN COALESCE(setting, '') = '' THEN rate_limit.max_policy_refill_time()
                                                  WHEN setting ~ '^[0-9]+$' THEN setting::bigint * interval '1 minute'
                                                  ELSE setting::interval END);
    what text;
BEGIN
    IF longest <= max_us THEN
        RETURN;
    END IF;
    what := CASE WHEN p.penalty_for = longest THEN 'its penalty box blocks a key'
                 WHEN p.max_debt > 0 THEN 'a bucket emptied and charged to max_debt refills'
                 ELSE 'a bucket emptied refills' END;
    PERFORM rate_limit._raise('22023',
        what || ' in ' || ((LEAST(longest::numeric + 999999, 9223372036854775807)::bigint) / 1000000)
             || ' s; rate_limit.max_policy_refill_time allows ' || (max_us / 1000000) || ' s',
        'Lower max_debt, block_for or the window, or have a superuser raise rate_limit.max_policy_refill_time.',
        'Any role that may call the policy can leave its buckets short for that long, and the purge deletes a bucket only once it is full again.');
END
$$;

-- bounds::caller_limit: a limit the caller chooses (ad hoc, rate_limiting_request) refills within
-- rate_limit.max_refill_time() when a call may create its bucket; roles with the owner's privileges are
-- not bounded.
CREATE FUNCTION rate_limit._check_caller_limit(l rate_limit._limit, cost bigint) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    refill_us bigint;
    max_us bigint;
BEGIN
    IF cost = 0 THEN
        RETURN;
    END IF;
    -- emptied now, full again after ceil(burst × per / rate)
    refill_us := LEAST(rate_limit._cdiv(l.burst::numeric * l.per_us, l.rate), 9223372036854775807)::bigint;
    max_us := rate_limit._interval_us(rate_limit.max_refill_time());
    -- the role calling (this runs as the owner): SET ROLE's, else the session's
    IF refill_us <= max_us OR pg_catalog.pg_has_role(
            CASE WHEN pg_catalog.current_setting('role') = 'none' THEN session_user::text
                 ELSE pg_catalog.current_setting('role') END,
            (SELECT n.nspowner FROM pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) 'rate_limit'),
            'USAGE') THEN
        RETURN;
    END IF;
    PERFORM rate_limit._raise('22023',
        'this limit takes ' || ((LEAST(refill_us::numeric + 999999, 9223372036854775807)::bigint) / 1000000)
            || ' s to refill from empty; rate_limit.max_refill_time allows ' || (max_us / 1000000) || ' s',
        'Use a higher rate or a smaller burst, or ask the extension''s owner for a named policy (rate_limit.create_policy), which rate_limit.take uses without this bound.',
        'Only the extension''s owner may make buckets that refill more slowly, as named policies.');
END
$$;

-- The policy called name, read with the statement's snapshot, checked (42704 when there is none).
CREATE FUNCTION rate_limit._policy_named(name text) RETURNS rate_limit._policy
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    r rate_limit.policies;
BEGIN
    IF name IS NULL THEN
        PERFORM rate_limit._null_argument('policy', 'Pass the name of a policy from rate_limit.policies.');
    END IF;
    SELECT * INTO r FROM rate_limit.policies AS p WHERE p.name OPERATOR(pg_catalog.=) _policy_named.name;
    IF NOT FOUND THEN
        PERFORM rate_limit._unknown_policy(name);
    END IF;
    RETURN rate_limit._checked(r);
END
$$;

-- The string an option takes (NULL for JSON null); 22023 for a value of another JSON type
-- (options.rs, wrong_value), its hint showing example.
CREATE FUNCTION rate_limit._option_string(name text, value jsonb, takes text, example text) RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    CASE pg_catalog.jsonb_typeof(value)
    WHEN 'null' THEN
        RETURN NULL;
    WHEN 'string' THEN
        RETURN value #>> '{}';
    ELSE
        PERFORM rate_limit._raise('22023', 'policy option "' || name || '" takes ' || takes || ', got a '
            || pg_catalog.jsonb_typeof(value), 'Pass e.g. options => ''{"' || name || '": ' || example || '}''.');
    END CASE;
    RETURN NULL;
END
$$;

-- options (jsonb): each known option set on the row; 22023 for anything else (src/policies/options.rs).
-- The option meters (options.rs, set_meters; the model's Meters::from_json): up to 16 names of [a-z0-9_]
-- (1 to 63 bytes) with weights from 0 to 1000000 tokens exact to the millionth, written as the compiled
-- edition writes them (a whole weight as an integer); JSON null removes them.
CREATE FUNCTION rate_limit._meters_option(value jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    hint constant text := 'Pass e.g. options => ''{"meters": {"input": 0.2, "output": 1}}'', or null to remove them.';
    meter record;
    w numeric;
BEGIN
    IF pg_catalog.jsonb_typeof(value) = 'null' THEN
        RETURN NULL;
    ELSIF pg_catalog.jsonb_typeof(value) <> 'object' THEN
        PERFORM rate_limit._raise('22023', 'policy option "meters" must be a JSON object, got '
            || pg_catalog.jsonb_typeof(value), hint);
    ELSIF value = '{}'::jsonb THEN
        PERFORM rate_limit._raise('22023', 'policy option "meters" names no meter', hint);
    ELSIF (SELECT pg_catalog.count(*) FROM pg_catalog.jsonb_object_keys(value)) > 16 THEN
        PERFORM rate_limit._raise('22023', 'policy option "meters" names '
            || (SELECT pg_catalog.count(*) FROM pg_catalog.jsonb_object_keys(value))
            || ' meters; at most 16 are accepted', hint);
    END IF;
    FOR meter IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(value) AS e ORDER BY e.key COLLATE "C" LOOP
        IF meter.key !~ '^[a-z0-9_]{1,63}$' THEN
            PERFORM rate_limit._raise('22023', 'meter name "' || pg_catalog.left(meter.key, 80)
                || '" must be 1 to 63 bytes of a-z, 0-9 and _', hint);
        END IF;
        w := CASE WHEN pg_catalog.jsonb_typeof(meter.value) = 'number' THEN meter.value::text::numeric END;
        IF w IS NULL OR w < 0 OR w > 1000000 OR w <> pg_catalog.round(w, 6) THEN
            PERFORM rate_limit._raise('22023', 'meter "' || meter.key
                || '" must weigh 0 to 1000000 tokens exact to the millionth, got '
                || pg_catalog.left(meter.value::text, 80), hint);
        END IF;
    END LOOP;
    RETURN (SELECT pg_catalog.jsonb_object_agg(e.key, pg_catalog.trim_scale(e.value::text::numeric))
            FROM pg_catalog.jsonb_each(value) AS e);
END
$$;

CREATE FUNCTION rate_limit._apply_options(r rate_limit.policies, options jsonb) RETURNS rate_limit.policies
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    text_form text;
    depth integer := 0;
    deepest integer := 0;
    in_string boolean := false;
    escaped boolean := false;
    c text;
    option record;
BEGIN
    IF options IS NULL THEN
        RETURN r;
    END IF;
    text_form := options::text;
    FOR i IN 1 .. pg_catalog.length(text_form) LOOP
        c := pg_catalog.substr(text_form, i, 1);
        IF in_string THEN
            IF escaped THEN escaped := false;
            ELSIF c = '\' THEN escaped := true;
            ELSIF c = '"' THEN in_string := false;
            END IF;
        ELSIF c = '"' THEN in_string := true;
        ELSIF c IN ('[', '{') THEN depth := depth + 1; deepest := GREATEST(deepest, depth);
        ELSIF c IN (']', '}') THEN depth := GREATEST(depth - 1, 0);
        END IF;
    END LOOP;
    IF deepest > 16 THEN
        PERFORM rate_limit._raise('22023', 'options are nested ' || deepest || ' levels deep; at most 16 are accepted',
            'Pass a flat JSON object of options, e.g. options => ''{"description": "…"}''; known options: description, latency_target, adaptive_min, meters, parent.');
    END IF;
    IF pg_catalog.jsonb_typeof(options) <> 'object' THEN
        PERFORM rate_limit._raise('22023', 'options must be a JSON object, got ' || pg_catalog.jsonb_typeof(options),
            'Pass options by name, e.g. options => ''{"description": "…"}''; known options: description, latency_target, adaptive_min, meters, parent.');
    END IF;
    FOR option IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(options) AS e LOOP
        IF option.key NOT IN ('description', 'latency_target', 'adaptive_min', 'meters', 'parent') THEN
            PERFORM rate_limit._raise('22023', 'unknown policy option "'
                || pg_catalog.left(option.key, 64) || CASE WHEN pg_catalog.length(option.key) > 64 THEN '…' ELSE '' END || '"',
                'Known options: description, latency_target, adaptive_min, meters, parent.');
        END IF;
        CASE option.key
        WHEN 'description' THEN
            r.description := rate_limit._option_string(option.key, option.value,
                'a string of at most 1000 characters, or null', '"Partner API, owned by the integrations team"');
            IF pg_catalog.length(r.description) > 1000 THEN
                PERFORM rate_limit._raise('22023', 'policy option "description" takes at most 1000 characters, got '
                    || pg_catalog.length(r.description), 'Shorten it; link to a longer text if needed.');
            END IF;
        WHEN 'latency_target' THEN
            r.latency_target := rate_limit._option_string(option.key, option.value,
                'an interval as a string (a concurrency policy''s), or null', '"250 milliseconds"')::interval;
        WHEN 'meters' THEN
            r.meters := rate_limit._meters_option(option.value);
        WHEN 'parent' THEN
            r.parent := rate_limit._option_string(option.key, option.value,
                'the name of another policy that limits tokens, in the same store and without a parent of its own, or null',
                '"tenant"');
            IF r.parent IS NOT NULL THEN
                PERFORM rate_limit._check_name(r.parent);
            END IF;
        ELSE -- adaptive_min
            IF pg_catalog.jsonb_typeof(option.value) = 'null' THEN
                r.adaptive_min := NULL;
            ELSIF pg_catalog.jsonb_typeof(option.value) = 'number' AND option.value::text ~ '^-?[0-9]{1,19}$'
                  AND option.value::text::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
                r.adaptive_min := option.value::text::bigint;
            ELSE
                PERFORM rate_limit._raise('22023', 'policy option "adaptive_min" takes a whole number of leases from 1 to the policy''s rate, or null (1), got a '
                    || pg_catalog.jsonb_typeof(option.value),
                    'Pass e.g. options => ''{"adaptive_min": 2}''.');
            END IF;
        END CASE;
    END LOOP;
    RETURN r;
END
$$;

-- A policy's parent and children (src/policies/family.rs, check), for the row r about to be written:
-- 22023 for itself as parent, a second level or a seventeenth child, 42704 for a parent that does not
-- exist, 42809 when either limits leases, 0A000 for two stores. Locks the parent's row.
CREATE FUNCTION rate_limit._check_family(r rate_limit.policies) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    parent_row rate_limit.policies;
    child record;
    first_child text;
    siblings integer;
BEGIN
    IF r.parent = r.name THEN
        PERFORM rate_limit._raise('22023', 'policy ' || rate_limit._quoted(r.name) || ' cannot be its own parent',
            'Name another policy as its parent, or null for none.');
    END IF;
    FOR child IN SELECT c.name, c.algorithm, c.store FROM rate_limit.policies AS c
                  WHERE c.parent OPERATOR(pg_catalog.=) r.name ORDER BY c.name COLLATE "C" LIMIT 17 LOOP
        IF first_child IS NULL THEN
            first_child := child.name;
            IF r.parent IS NOT NULL THEN
                PERFORM rate_limit._two_levels(r.name, child.name);
            END IF;
            IF r.algorithm = 'concurrency' THEN
                PERFORM rate_limit._leases_in_family(r.name);
            END IF;
        END IF;
        IF child.store IS DISTINCT FROM r.store THEN
            PERFORM rate_limit._two_stores(child.name, r.name);
        END IF;
        IF child.algorithm = 'concurrency' THEN
            PERFORM rate_limit._leases_in_family(child.name);
        END IF;
    END LOOP;
    IF r.parent IS NULL THEN
        RETURN;
    END IF;
    SELECT * INTO parent_row FROM rate_limit.policies AS p WHERE p.name OPERATOR(pg_catalog.=) r.parent FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM rate_limit._raise('42704', 'rate limit policy ' || rate_limit._quoted(r.parent) || ' does not exist',
            'Create the parent first with rate_limit.create_policy, or see rate_limit.policies.');
    END IF;
    IF parent_row.parent IS NOT NULL THEN
        PERFORM rate_limit._two_levels(parent_row.name, parent_row.parent);
    END IF;
    IF r.algorithm = 'concurrency' THEN
        PERFORM rate_limit._leases_in_family(r.name);
    END IF;
    IF parent_row.algorithm = 'concurrency' THEN
        PERFORM rate_limit._leases_in_family(parent_row.name);
    END IF;
    IF parent_row.store IS DISTINCT FROM r.store THEN
        PERFORM rate_limit._two_stores(r.name, parent_row.name);
    END IF;
    SELECT pg_catalog.count(*) INTO siblings FROM rate_limit.policies AS c
     WHERE c.parent OPERATOR(pg_catalog.=) r.parent AND c.name OPERATOR(pg_catalog.<>) r.name;
    IF siblings >= 16 THEN
        PERFORM rate_limit._raise('22023', 'policy ' || rate_limit._quoted(r.parent) || ' has 16 children, the most a parent may have',
            'Give some of the children another parent, or limit them with take_many over two keys.');
    END IF;
END
$$;

-- 22023: policy middle would be both a parent and a child (family.rs, two_levels).
CREATE FUNCTION rate_limit._two_levels(middle text, related text) RETURNS void
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
SELECT rate_limit._raise('22023', 'policy ' || rate_limit._quoted(middle) || ' would be both a parent and a child (of or with '
    || rate_limit._quoted(related) || '); a hierarchy has one level',
    'Give every child the top policy as its parent; limit deeper trees (org, team, user) with take_many over their keys.')
$$;

-- 42809: a concurrency policy can be neither a parent nor a child (family.rs, leases_in_family).
CREATE FUNCTION rate_limit._leases_in_family(name text) RETURNS void
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
SELECT rate_limit._raise('42809', 'policy ' || rate_limit._quoted(name)
    || ' limits leases held at once, not tokens: it can be neither a parent nor a child',
    'Parents and children limit tokens; hold leases with a concurrency policy of its own.')
$$;

-- 0A000: a child and its parent in two stores (family.rs, two_stores).
CREATE FUNCTION rate_limit._two_stores(child text, parent text) RETURNS void
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
SELECT rate_limit._raise('0A000', 'policy ' || rate_limit._quoted(child) || ' and its parent ' || rate_limit._quoted(parent)
    || ' must keep their buckets in the same store',
    'Give both the same store (create_policy''s store argument).',
    'All-or-nothing consumption is atomic within one store only.')
$$;

------------------------------------------------------------------------------------------------------------
-- The owner's functions.

CREATE FUNCTION rate_limit.create_policy(
    name text, rate bigint, per interval, burst bigint DEFAULT NULL, algorithm text DEFAULT 'token_bucket',
    store text DEFAULT NULL, shadow boolean DEFAULT false, max_debt bigint DEFAULT 0, time_zone text DEFAULT NULL,
    anchor timestamp DEFAULT NULL, block_after bigint DEFAULT NULL, block_for interval DEFAULT NULL,
    options jsonb DEFAULT NULL)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r rate_limit.policies;
    p rate_limit._policy;
    now_at timestamptz := clock_timestamp();
BEGIN
    IF name IS NULL THEN PERFORM rate_limit._null_argument('name', 'Pass the policy''s name, e.g. ''api''.'); END IF;
    PERFORM rate_limit._check_name(name);
    IF rate IS NULL THEN PERFORM rate_limit._null_argument('rate', 'Pass the tokens granted per period, e.g. 100.'); END IF;
    IF per IS NULL THEN PERFORM rate_limit._null_argument('per', 'Pass the period, e.g. interval ''1 minute''.'); END IF;
    IF algorithm IS NULL THEN
        PERFORM rate_limit._null_argument('algorithm',
            'Pass ''token_bucket'', ''fixed_window'', ''sliding_window'', ''calendar_window'' or ''concurrency'', or omit it.');
    END IF;
    IF shadow IS NULL THEN PERFORM rate_limit._null_argument('shadow', 'Pass true or false, or omit it (false).'); END IF;
    IF max_debt IS NULL THEN PERFORM rate_limit._null_argument('max_debt', 'Pass 0 or more tokens, or omit it (0).'); END IF;
    r.name := name;
    r.algorithm := rate_limit._parse_algorithm(algorithm);
    r.rate := rate;
    r.per := per;
    r.burst := COALESCE(burst, rate);
    r.store := rate_limit._parse_store(store);
    r.created_at := now_at;
    r.changed_at := now_at;
    r.shadow := shadow;
    r.max_debt := max_debt;
    r.time_zone := time_zone;
    r.anchor := anchor;
    r.block_after := block_after;
    r.block_for := block_for;
    r.blocks_by_hand := false;
    r := rate_limit._apply_options(r, options);
    p := rate_limit._checked(r);
    PERFORM rate_limit._check_policy_bound(p);
    r.rate := p.rate;
    r.burst := p.burst;
    r.time_zone := p.time_zone;
    r.anchor := p.anchor;
    PERFORM rate_limit._check_family(r);
    INSERT INTO rate_limit.policies VALUES (r.*) ON CONFLICT ON CONSTRAINT policies_pkey DO NOTHING;
    IF NOT FOUND THEN
        PERFORM rate_limit._raise('42710', 'rate limit policy ' || rate_limit._quoted(name) || ' already exists',
            'Change it with rate_limit.alter_policy(name, ...).');
    END IF;
END
$$;

CREATE FUNCTION rate_limit.alter_policy(
    name text, rate bigint DEFAULT NULL, per interval DEFAULT NULL, burst bigint DEFAULT NULL,
    algorithm text DEFAULT NULL, shadow boolean DEFAULT NULL, max_debt bigint DEFAULT NULL,
    time_zone text DEFAULT NULL, anchor timestamp DEFAULT NULL, block_after bigint DEFAULT NULL,
    block_for interval DEFAULT NULL, options jsonb DEFAULT NULL)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    old rate_limit.policies;
    r rate_limit.policies;
    p rate_limit._policy;
    -- a change of these may lengthen how long its buckets stay short: checked against the bound
    sets_the_bound boolean := rate IS NOT NULL OR per IS NOT NULL OR burst IS NOT NULL OR algorithm IS NOT NULL
        OR max_debt IS NOT NULL OR (block_after IS NOT NULL AND block_after <> 0) OR block_for IS NOT NULL;
BEGIN
    IF name IS NULL THEN PERFORM rate_limit._null_argument('name', 'Pass the name of an existing policy.'); END IF;
    SELECT * INTO old FROM rate_limit.policies AS o WHERE o.name OPERATOR(pg_catalog.=) alter_policy.name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM rate_limit._unknown_policy(name);
    END IF;
    r := old;
    r.algorithm := CASE WHEN algorithm IS NULL THEN old.algorithm ELSE rate_limit._parse_algorithm(algorithm) END;
    r.rate := COALESCE(rate, old.rate);
    -- window algorithms allow rate per window: their burst follows the rate
    r.burst := CASE WHEN burst IS NOT NULL THEN burst
                    WHEN r.algorithm = 'token_bucket' THEN old.burst ELSE r.rate END;
    IF r.algorithm = 'calendar_window' THEN
        r.time_zone := COALESCE(time_zone, old.time_zone);
        r.anchor := COALESCE(anchor, old.anchor);
    ELSE
        r.time_zone := time_zone;
        r.anchor := anchor;
    END IF;
    IF block_after = 0 THEN
        r.block_after := NULL;
        r.block_for := NULL;
    ELSE
        r.block_after := COALESCE(block_after, old.block_after);
        r.block_for := COALESCE(block_for, old.block_for);
    END IF;
    -- the blocks a removed penalty box made end as blocks by hand do: calls keep reading them
    r.blocks_by_hand := old.blocks_by_hand OR (old.block_after IS NOT NULL AND r.block_after IS NULL);
    r.per := COALESCE(per, old.per);
    r.changed_at := clock_timestamp();
    r.shadow := COALESCE(shadow, old.shadow);
    r.max_debt := COALESCE(max_debt, old.max_debt);
    r := rate_limit._apply_options(r, options);
    p := rate_limit._checked(r);
    IF sets_the_bound THEN
        PERFORM rate_limit._check_policy_bound(p);
    END IF;
    PERFORM rate_limit._check_family(r);
    UPDATE rate_limit.policies AS u
       SET algorithm = r.algorithm, rate = p.rate, per = r.per, burst = p.burst, store = r.store,
           changed_at = r.changed_at, shadow = r.shadow, max_debt = r.max_debt, time_zone = p.time_zone,
           anchor = p.anchor, block_after = r.block_after, block_for = r.block_for,
           blocks_by_hand = r.blocks_by_hand, description = r.description,
           adaptive_min = r.adaptive_min, latency_target = r.latency_target, meters = r.meters,
           parent = r.parent
     WHERE u.name OPERATOR(pg_catalog.=) alter_policy.name;
END
$$;

CREATE FUNCTION rate_limit.drop_policy(name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    first_child text;
    children bigint;
BEGIN
    IF name IS NULL THEN PERFORM rate_limit._null_argument('name', 'Pass the name of an existing policy.'); END IF;
    DELETE FROM rate_limit.policies AS p WHERE p.name OPERATOR(pg_catalog.=) drop_policy.name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- a parent outlives its children (family.rs, refuse_orphans)
    SELECT pg_catalog.min(c.name COLLATE "C"), pg_catalog.count(*) INTO first_child, children
      FROM rate_limit.policies AS c WHERE c.parent OPERATOR(pg_catalog.=) drop_policy.name;
    IF children > 0 THEN
        PERFORM rate_limit._raise('2BP01', 'policy ' || rate_limit._quoted(name) || ' has ' || children
            || ' children (' || rate_limit._quoted(first_child) || ' first)',
            'Drop the children first, or give them another parent: alter_policy(child, options => ''{"parent": null}'').');
    END IF;
    -- only a policy's own namespace and those it owns (name U+001F part): never '#'-named ones
    DELETE FROM rate_limit.bucket_state AS s
     WHERE s.namespace OPERATOR(pg_catalog.=) drop_policy.name
        OR pg_catalog.split_part(s.namespace, pg_catalog.chr(31), 1) OPERATOR(pg_catalog.=) drop_policy.name;
    DELETE FROM rate_limit.key_overrides AS o WHERE o.policy OPERATOR(pg_catalog.=) drop_policy.name;
    RETURN true;
END
$$;

------------------------------------------------------------------------------------------------------------
-- Per-key overrides.

-- What an override row gives a key of policy p at now (overrides::resolve then in_effect): the limit and
-- when it took effect, or a fixed answer ('deny' until verdict_until, or 'exempt').
CREATE FUNCTION rate_limit._override_effect(p rate_limit._policy, action text, rate bigint, per interval,
                                            burst bigint, expires_at timestamptz, set_at timestamptz, now bigint,
                                            OUT lim rate_limit._limit, OUT changed_at bigint,
                                            OUT verdict text, OUT verdict_until bigint)
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    ends bigint := rate_limit._us(expires_at);
BEGIN
    lim := p.lim;
    changed_at := p.changed_at;
    IF action = 'limit' THEN
        -- the numbers are checked even once the override has ended, as the compiled edition resolves
        -- them before it looks at the end
        lim := rate_limit._build((p.lim).algorithm, COALESCE(rate, p.rate), COALESCE(per, p.per),
                                 CASE WHEN burst IS NOT NULL THEN burst
                                      WHEN (p.lim).algorithm <> 'token_bucket' THEN NULL ELSE p.burst END,
                                 p.time_zone, p.anchor);
        changed_at := GREATEST(rate_limit._us(set_at), p.changed_at);
    END IF;
    IF ends IS NOT NULL AND now >= ends THEN
        -- ended: the policy's numbers from its end on
        lim := p.lim;
        changed_at := GREATEST(p.changed_at, ends);
        RETURN;
    END IF;
    IF action IN ('deny', 'exempt') THEN
        lim := p.lim;
        changed_at := p.changed_at;
        verdict := action;
        verdict_until := ends;
    END IF;
END
$$;

CREATE FUNCTION rate_limit.set_override(
    policy text, key text, rate bigint DEFAULT NULL, per interval DEFAULT NULL, burst bigint DEFAULT NULL,
    action text DEFAULT 'limit', until timestamptz DEFAULT NULL, note text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    p rate_limit._policy := rate_limit._policy_named(policy);
    a text := COALESCE(action, 'limit');
    numbers boolean := rate IS NOT NULL OR per IS NOT NULL OR burst IS NOT NULL;
    e record;
    set_at timestamptz := clock_timestamp();
BEGIN
    IF (p.lim).algorithm = 'concurrency' THEN
        PERFORM rate_limit._wrong_kind(p.name, true);
    END IF;
    PERFORM rate_limit._key_arg('key', key);
    IF a NOT IN ('limit', 'deny', 'exempt') THEN
        PERFORM rate_limit._raise('22023', 'unknown override action ' || rate_limit._quoted(a),
            'Use ''limit'' (with rate, per or burst), ''deny'' or ''exempt''.');
    ELSIF a = 'limit' AND NOT numbers THEN
        PERFORM rate_limit._raise('22023', 'an override of action ''limit'' needs a rate, a period or a burst',
            'Pass rate, per or burst (those left out are the policy''s), or action => ''deny'' or ''exempt''.');
    ELSIF a <> 'limit' AND numbers THEN
        PERFORM rate_limit._raise('22023', 'an override of action ''' || a || ''' takes no rate, period or burst',
            'Leave rate, per and burst out, or use action => ''limit''.');
    END IF;
    IF until IS NOT NULL AND until <= clock_timestamp() THEN
        PERFORM rate_limit._raise('22023', 'until is not in the future',
            'Pass a time to come, or NULL for an override without end; clear_override removes one.');
    END IF;
    e := rate_limit._override_effect(p, a, rate, per, burst, NULL, set_at, rate_limit._us(set_at));
    IF a = 'limit' THEN
        p.lim := e.lim;
        PERFORM rate_limit._check_policy_bound(p);
    END IF;
    IF pg_catalog.length(note) > 1000 THEN
        PERFORM rate_limit._raise('22023', 'note is longer than 1000 characters',
            'Keep the note short; link to a ticket for more.');
    END IF;
    INSERT INTO rate_limit.key_overrides AS o (policy, key, action, rate, per, burst, expires_at, set_at, note)
    VALUES (p.name, key, a, rate, per, burst, until, set_at, note)
    ON CONFLICT ON CONSTRAINT key_overrides_pkey DO UPDATE
       SET action = EXCLUDED.action, rate = EXCLUDED.rate, per = EXCLUDED.per, burst = EXCLUDED.burst,
           expires_at = EXCLUDED.expires_at, set_at = EXCLUDED.set_at, note = EXCLUDED.note;
END
$$;

CREATE FUNCTION rate_limit.clear_override(policy text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
BEGIN
    IF policy IS NULL THEN PERFORM rate_limit._null_argument('policy', 'Pass the policy''s name.'); END IF;
    PERFORM rate_limit._key_arg('key', key);
    DELETE FROM rate_limit.key_overrides AS o
     WHERE o.policy OPERATOR(pg_catalog.=) clear_override.policy AND o.key OPERATOR(pg_catalog.=) clear_override.key;
    RETURN FOUND;
END
$$;

CREATE VIEW rate_limit.overrides AS
SELECT o.policy, o.key, o.action, o.rate, o.per, o.burst, o.expires_at,
       o.expires_at IS NULL OR o.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() AS active,
       o.set_at, o.note
FROM rate_limit.key_overrides AS o
JOIN rate_limit.policies AS p ON p.name OPERATOR(pg_catalog.=) o.policy
  AND o.set_at OPERATOR(pg_catalog.>=) p.created_at;
COMMENT ON VIEW rate_limit.overrides IS
    'Per-key overrides of the policies (rate_limit.set_override), with whether each applies now; owner only';
