-- The table store (src/store/table/mod.rs) and the seam above it (src/store/mod.rs, blocks.rs): the same
-- statements' effects, the same concurrency contract, the same order of steps.
--
-- Concurrency contract.
-- - One bucket, cost > 0: the row is read, the model decides at the later of now and the row's instant,
--   and a grant writes the row with an UPDATE that names the version read (ctid and xmin). Under READ
--   COMMITTED a concurrent writer makes that UPDATE wait, then find a newer version and write nothing
--   (PostgreSQL then holds the newer version's lock for this transaction): the call reads again and decides
--   on the newest version, which nobody else can change any more. Under REPEATABLE READ and SERIALIZABLE
--   the UPDATE raises 40001, as the compiled edition's does. A denial writes nothing (a row found ahead of
--   a clock that stepped back is rebased, as there). A missing row is inserted with ON CONFLICT DO NOTHING:
--   two creators never see a unique violation, the loser starts again.
-- - Several buckets, all or nothing: decided from reads first (a denial writes nothing), then each bucket
--   taken as above in one (namespace, key) order (two calls never deadlock), and what was taken given back
--   exactly if one turns out short after all.
-- - Every lock a call takes is a row lock of rate_limit.bucket_state, held until its transaction ends; no
--   advisory lock (a namespace any role can take) is used.

-- A bucket a call asks of: its namespace and key, the limit that applies now (since changed_at), shadow
-- mode, the policy the decision names, how its key may be blocked and an override's fixed answer.
CREATE TYPE rate_limit._target AS (
    ns             text,
    key            text,
    lim            rate_limit._limit,
    changed_at     bigint,
    shadow         boolean,
    policy         text,
    blk            rate_limit._limit,  -- the key's block bucket's numbers; NULL: never blocked
    penalty_for    bigint,             -- the penalty box's block, us; NULL: none
    may_block      boolean,            -- a block may exist: a penalty box, or blocks by hand
    verdict        text,               -- 'deny' or 'exempt' by an override; NULL: none
    verdict_until  bigint
);

-- One row of rate_limit.bucket_state as the store reads it (level NULL: no row, a full bucket).
CREATE TYPE rate_limit._row AS (
    level     bigint,
    at        bigint,
    numbers   rate_limit._limit,
    row_ctid  tid,
    row_xmin  xid
);

-- The row of bucket (ns, key), read with the statement's snapshot.
CREATE FUNCTION rate_limit._read(ns text, key text) RETURNS rate_limit._row
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    r rate_limit._row;
BEGIN
    SELECT s.level, rate_limit._us(s.updated_at),
           ROW(s.algorithm, s.rate, s.per_us, s.burst, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit,
           s.ctid, s.xmin
      INTO r
      FROM rate_limit.bucket_state AS s
     WHERE s.namespace OPERATOR(pg_catalog.=) _read.ns AND s.key OPERATOR(pg_catalog.=) _read.key;
    RETURN r;
END
$$;

-- Writes state (level, at) with t's numbers over the row of t's bucket (locked by this call).
CREATE FUNCTION rate_limit._write(t rate_limit._target, level bigint, at bigint) RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
UPDATE rate_limit.bucket_state AS s
   SET level = _write.level, updated_at = rate_limit._ts(_write.at), algorithm = (t.lim).algorithm,
       rate = (t.lim).rate, per_us = (t.lim).per_us, burst = (t.lim).burst
 WHERE s.namespace OPERATOR(pg_catalog.=) t.ns AND s.key OPERATOR(pg_catalog.=) t.key
$$;

-- Inserts state (level, at) as t's bucket unless a row exists; whether it did.
CREATE FUNCTION rate_limit._insert(t rate_limit._target, level bigint, at bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    INSERT INTO rate_limit.bucket_state (namespace, key, level, updated_at, algorithm, rate, per_us, burst)
    VALUES (t.ns, t.key, level, rate_limit._ts(at), (t.lim).algorithm, (t.lim).rate, (t.lim).per_us, (t.lim).burst)
    ON CONFLICT ON CONSTRAINT bucket_state_pkey DO NOTHING;
    RETURN FOUND;
END
$$;

-- t's limit as the compiled TAKE statement sees it: a calendar window known by its numbers, told where
-- the window open at now ends.
CREATE FUNCTION rate_limit._take_limit(t rate_limit._target, now bigint) RETURNS rate_limit._limit
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    l rate_limit._limit := t.lim;
BEGIN
    IF l.algorithm = 'calendar_window' THEN
        l.open_until := rate_limit._cal_window_end(t.lim, now);
        l.zone := NULL;
    END IF;
    RETURN l;
END
$$;

-- After a denial: a row ahead of now (the clock stepped back) is rebased on now (the denial's state,
-- which grants nothing) unless another session changed it meanwhile.
CREATE FUNCTION rate_limit._rebase_if_behind(t rate_limit._target, r rate_limit._row, o rate_limit._outcome,
                                             now bigint) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    IF r.level IS NULL OR now >= r.at OR rate_limit._in_read_only() THEN
        RETURN;
    END IF;
    UPDATE rate_limit.bucket_state AS s
       SET level = o.level, updated_at = rate_limit._ts(o.at), algorithm = (t.lim).algorithm,
           rate = (t.lim).rate, per_us = (t.lim).per_us, burst = (t.lim).burst
     WHERE s.namespace OPERATOR(pg_catalog.=) t.ns AND s.key OPERATOR(pg_catalog.=) t.key
       AND s.level OPERATOR(pg_catalog.=) r.level AND s.updated_at OPERATOR(pg_catalog.=) rate_limit._ts(r.at);
END
$$;

-- Takes cost (> 0) tokens from one bucket in a read-write transaction: the outcome, denied when short
-- (nothing taken). table::take_one.
CREATE FUNCTION rate_limit._take_one(t rate_limit._target, cost bigint) RETURNS rate_limit._outcome
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    r rate_limit._row;
    now bigint;
    instant bigint;
    lt rate_limit._limit;
    c record;
    o rate_limit._outcome;
    after bigint;
BEGIN
    FOR attempt IN 1..16 LOOP
        now := rate_limit._now();
        r := rate_limit._read(t.ns, t.key);
        IF r.level IS NOT NULL THEN
            -- 1. the conditional write: granted if the version read is still the newest
            lt := rate_limit._take_limit(t, now);
            instant := GREATEST(now, r.at);
            c := rate_limit._carry_over(lt, r.level, r.at, r.numbers, GREATEST(t.changed_at, 0), instant);
            o := rate_limit._take(lt, c.new_level, c.new_at, instant, cost);
            IF o.allowed THEN
                UPDATE rate_limit.bucket_state AS s
                   SET level = o.level, updated_at = rate_limit._ts(instant), algorithm = (t.lim).algorithm,
                       rate = (t.lim).rate, per_us = (t.lim).per_us, burst = (t.lim).burst
                 WHERE s.ctid OPERATOR(pg_catalog.=) r.row_ctid AND s.xmin OPERATOR(pg_catalog.=) r.row_xmin;
                IF NOT FOUND THEN
                    CONTINUE; -- changed under this call: read the newest version, which it now holds
                END IF;
                -- a row still ahead of the clock: the clock stepped back; rebase it on the clock
                after := rate_limit._now();
                IF after < instant THEN
                    o := rate_limit._take(t.lim, o.level, instant, after, 0);
                    PERFORM rate_limit._write(t, o.level, o.at);
                    instant := o.at;
                END IF;
                RETURN rate_limit._take(t.lim, o.level, instant, instant, 0);
            END IF;
        END IF;
        -- 2. short, or missing?
        now := rate_limit._now();
        o := rate_limit._evaluate(t.lim, r.level, r.at, r.numbers, t.changed_at, now, cost);
        IF NOT o.allowed THEN
            PERFORM rate_limit._rebase_if_behind(t, r, o, now);
            RETURN o;
        END IF;
        IF r.level IS NOT NULL THEN
            CONTINUE; -- tokens arrived since the first look: take them with the conditional write
        END IF;
        -- 3. create the row; a concurrent creator makes this a no-op and the call starts again
        IF rate_limit._insert(t, o.level, o.at) THEN
            RETURN o;
        END IF;
    END LOOP;
    PERFORM rate_limit._gave_up();
END
$$;

-- Asks every target for cost tokens (costs[i] of target i when costs is given; cost 0: only reports), all
-- or nothing (table::take): one outcome per target.
CREATE FUNCTION rate_limit._store_take(targets rate_limit._target[], cost bigint, costs bigint[] DEFAULT NULL)
RETURNS rate_limit._outcome[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    n integer := pg_catalog.cardinality(targets);
    rows rate_limit._row[] := '{}';
    outcomes rate_limit._outcome[] := '{}';
    now bigint;
    granted boolean := true;
    any_allowed boolean := false;
    order_of integer[];
    taken integer[] := '{}';
    o rate_limit._outcome;
    i integer;
    j integer;
    r record;
BEGIN
    IF cost = 0 OR rate_limit._in_read_only() THEN
        FOR i IN 1..n LOOP
            rows := rows || rate_limit._read(targets[i].ns, targets[i].key);
        END LOOP;
        now := rate_limit._now();
        FOR i IN 1..n LOOP
            o := rate_limit._evaluate(targets[i].lim, rows[i].level, rows[i].at, rows[i].numbers,
                                      targets[i].changed_at, now, COALESCE(costs[i], cost));
            outcomes := outcomes || o;
            granted := granted AND (o.allowed OR targets[i].shadow);
            any_allowed := any_allowed OR o.allowed;
        END LOOP;
        IF cost > 0 AND granted AND any_allowed THEN
            PERFORM rate_limit._read_only('take a token');
        END IF;
        RETURN outcomes;
    END IF;
    IF n = 1 THEN
        RETURN ARRAY[rate_limit._take_one(targets[1], COALESCE(costs[1], cost))];
    END IF;
    -- 1. decide denials from reads, writing nothing
    FOR i IN 1..n LOOP
        rows := rows || rate_limit._read(targets[i].ns, targets[i].key);
    END LOOP;
    now := rate_limit._now();
    FOR i IN 1..n LOOP
        o := rate_limit._evaluate(targets[i].lim, rows[i].level, rows[i].at, rows[i].numbers,
                                  targets[i].changed_at, now, COALESCE(costs[i], cost));
        outcomes := outcomes || o;
        granted := granted AND (o.allowed OR targets[i].shadow);
    END LOOP;
    IF NOT granted THEN
        FOR i IN 1..n LOOP
            IF NOT outcomes[i].allowed THEN
                PERFORM rate_limit._rebase_if_behind(targets[i], rows[i], outcomes[i], now);
            END IF;
        END LOOP;
        RETURN outcomes;
    END IF;
    -- 2. take bucket by bucket in the global (namespace, key) order
    SELECT pg_catalog.array_agg(x.i ORDER BY x.ns COLLATE "C", x.key COLLATE "C") INTO order_of
      FROM (SELECT g AS i, targets[g].ns AS ns, targets[g].key AS key
              FROM pg_catalog.generate_series(1, n) AS g) AS x;
    FOREACH i IN ARRAY order_of LOOP
        IF NOT outcomes[i].allowed THEN
            CONTINUE; -- a bucket in shadow mode that would deny: it keeps its state
        END IF;
        o := rate_limit._take_one(targets[i], COALESCE(costs[i], cost));
        outcomes[i] := o;
        IF NOT o.allowed AND targets[i].shadow THEN
            CONTINUE;
        END IF;
        IF NOT o.allowed THEN
            -- 3. short after all: give back what this call took (rows it holds), exactly
            FOREACH j IN ARRAY taken LOOP
                r := rate_limit._refund(targets[j].lim, outcomes[j].level, outcomes[j].at, outcomes[j].at,
                                        COALESCE(costs[j], cost));
                PERFORM rate_limit._write(targets[j], r.new_level, r.new_at);
            END LOOP;
            RETURN outcomes;
        END IF;
        taken := taken || i;
    END LOOP;
    RETURN outcomes;
END
$$;

-- Reports t's bucket now in a fresh read, writing nothing (table::peek_fresh).
CREATE FUNCTION rate_limit._peek_fresh(t rate_limit._target) RETURNS rate_limit._outcome
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    r rate_limit._row := rate_limit._read(t.ns, t.key);
BEGIN
    RETURN rate_limit._evaluate(t.lim, r.level, r.at, r.numbers, t.changed_at, rate_limit._now(), 0);
END
$$;

-- The lock-read-write step on one bucket (table::update): locks its row, and writes the new state when
-- the step gives one (a missing row is a full bucket: nothing is inserted). Returns the stored row.
CREATE FUNCTION rate_limit._lock(t rate_limit._target, action text) RETURNS rate_limit._row
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    r rate_limit._row;
BEGIN
    IF rate_limit._in_read_only() THEN
        PERFORM rate_limit._read_only(action);
    END IF;
    SELECT s.level, rate_limit._us(s.updated_at),
           ROW(s.algorithm, s.rate, s.per_us, s.burst, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit,
           s.ctid, s.xmin
      INTO r
      FROM rate_limit.bucket_state AS s
     WHERE s.namespace OPERATOR(pg_catalog.=) t.ns AND s.key OPERATOR(pg_catalog.=) t.key
       FOR UPDATE;
    RETURN r;
END
$$;

-- The lock-read-write-or-insert step (table::upsert) for an ask that always writes: a charge ('charge',
-- with max_debt), a penalty box's count ('count', with block_for), a block by hand ('block', duration), a
-- reservation recorded in its fresh bucket ('take', its tokens).
CREATE FUNCTION rate_limit._upsert(t rate_limit._target, ask text, amount bigint, arg bigint, action text)
RETURNS rate_limit._outcome LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    r rate_limit._row;
    now bigint;
    c record;
    o rate_limit._outcome;
BEGIN
    FOR attempt IN 1..16 LOOP
        r := rate_limit._lock(t, action);
        now := rate_limit._now();
        c := rate_limit._current(t.lim, r.level, r.at, r.numbers, t.changed_at, now);
        o := CASE ask
             WHEN 'charge' THEN rate_limit._charge(t.lim, c.new_level, c.new_at, now, amount, arg)
             WHEN 'take' THEN rate_limit._take(t.lim, c.new_level, c.new_at, now, amount)
             WHEN 'book' THEN rate_limit._book(t.lim, c.new_level, c.new_at, now, amount, arg)
             -- a reservation's record as of instant arg (a booking's: held until exactly its time)
             WHEN 'record' THEN rate_limit._take(t.lim, c.new_level, c.new_at, arg, amount)
             WHEN 'count' THEN rate_limit._count_denial(t.lim, c.new_level, c.new_at, now, arg)
             ELSE rate_limit._block_for(t.lim, now, arg) END;
        IF r.level IS NOT NULL THEN
            PERFORM rate_limit._write(t, o.level, o.at);
            RETURN o;
        END IF;
        IF rate_limit._insert(t, o.level, o.at) THEN
            RETURN o;
        END IF;
    END LOOP;
    PERFORM rate_limit._gave_up();
END
$$;

------------------------------------------------------------------------------------------------------------
-- Blocks (src/store/blocks.rs).

-- The block bucket of t (its shadow one when shadow).
CREATE FUNCTION rate_limit._block_target(t rate_limit._target, shadow boolean) RETURNS rate_limit._target
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT ROW(t.policy || pg_catalog.chr(31) || CASE WHEN shadow THEN 'shadow block' ELSE 'block' END,
           t.key, t.blk, -9223372036854775808, false, t.policy, NULL, NULL, false, NULL, NULL)::rate_limit._target
$$;

-- For each target, its block's outcome when its key is blocked (read fresh, nothing written).
CREATE FUNCTION rate_limit._blocked(targets rate_limit._target[]) RETURNS rate_limit._outcome[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    found rate_limit._outcome[] := pg_catalog.array_fill(NULL::rate_limit._outcome, ARRAY[pg_catalog.cardinality(targets)]);
    o rate_limit._outcome;
BEGIN
    FOR i IN 1..pg_catalog.cardinality(targets) LOOP
        CONTINUE WHEN (targets[i].blk).algorithm IS NULL OR NOT targets[i].may_block;
        o := rate_limit._peek_fresh(rate_limit._block_target(targets[i], false));
        IF NOT o.allowed THEN
            found[i] := o;
        ELSIF targets[i].shadow THEN
            -- a shadowed call reads the block its shadowed penalty box would have made too
            o := rate_limit._peek_fresh(rate_limit._block_target(targets[i], true));
            IF NOT o.allowed THEN
                found[i] := o;
            END IF;
        END IF;
    END LOOP;
    RETURN found;
END
$$;

-- Counts each denial of a call in its policy's penalty box (blocks::count_denials), in (namespace, key)
-- order, each after locking the denied bucket's row (the lock order); a denial that starts a block is
-- reported as the block. decided[i] marks targets decided without their bucket. (An outcome, like every
-- composite, IS NULL only when all its fields are: "no outcome" is tested on its allowed field.)
CREATE FUNCTION rate_limit._count_denials(targets rate_limit._target[], outcomes rate_limit._outcome[],
                                          decided rate_limit._outcome[]) RETURNS rate_limit._outcome[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    i integer;
    counted rate_limit._outcome;
BEGIN
    FOR i IN SELECT g FROM pg_catalog.generate_series(1, pg_catalog.cardinality(targets)) AS g
             ORDER BY targets[g].ns COLLATE "C", targets[g].key COLLATE "C" LOOP
        CONTINUE WHEN targets[i].penalty_for IS NULL OR outcomes[i].allowed OR (decided[i]).allowed IS NOT NULL;
        CONTINUE WHEN rate_limit._in_read_only();
        -- the lock order: the policy's bucket before its block bucket
        PERFORM rate_limit._lock(targets[i], 'take a token');
        counted := rate_limit._upsert(rate_limit._block_target(targets[i], targets[i].shadow), 'count', 0,
                                      targets[i].penalty_for, 'take a token');
        IF counted.retry_after IS NOT NULL THEN
            counted.allowed := false;
            outcomes[i] := counted;
        END IF;
    END LOOP;
    RETURN outcomes;
END
$$;

------------------------------------------------------------------------------------------------------------
-- The seam's take (store::take_in): a block or an override's answer decides a key before its bucket is
-- touched; the store decides the rest; the denials are then counted in the penalty boxes.

CREATE FUNCTION rate_limit._not_looked_at() RETURNS rate_limit._outcome
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ROW(true, 0, 0, 0, NULL, 0)::rate_limit._outcome $$;

CREATE FUNCTION rate_limit._take_targets(targets rate_limit._target[], cost bigint, costs bigint[] DEFAULT NULL)
RETURNS rate_limit._outcome[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    n integer := pg_catalog.cardinality(targets);
    decided rate_limit._outcome[] := rate_limit._blocked(targets);
    outcomes rate_limit._outcome[];
    open rate_limit._target[] := '{}';
    open_costs bigint[] := '{}';
    asked rate_limit._outcome[];
    now bigint;
    v rate_limit._outcome;
    next integer := 1;
BEGIN
    -- an override's fixed answer comes before any block
    FOR i IN 1..n LOOP
        IF targets[i].verdict IS NOT NULL THEN
            now := COALESCE(now, rate_limit._now());
            IF targets[i].verdict = 'deny' THEN
                v := ROW(false, 0, now, 0, rate_limit._until(targets[i].verdict_until::numeric, now),
                         COALESCE(rate_limit._until(targets[i].verdict_until::numeric, now), 0))::rate_limit._outcome;
            ELSE
                v := ROW(true, rate_limit._full_level(targets[i].lim), now, (targets[i].lim).burst, NULL, 0)::rate_limit._outcome;
            END IF;
            decided[i] := v;
        END IF;
    END LOOP;
    -- a blocked or denied key denies the call: no bucket is touched
    FOR i IN 1..n LOOP
        IF NOT (decided[i]).allowed AND NOT targets[i].shadow THEN
            outcomes := pg_catalog.array_fill(rate_limit._not_looked_at(), ARRAY[n]);
            outcomes[i] := decided[i];
            RETURN outcomes; -- (nothing to count: the one denial was decided without its bucket)
        END IF;
    END LOOP;
    FOR i IN 1..n LOOP
        IF (decided[i]).allowed IS NULL THEN
            open := open || targets[i];
            open_costs := open_costs || COALESCE(costs[i], cost);
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(open) = 0 THEN
        asked := '{}';
    ELSE
        asked := rate_limit._store_take(open, cost, open_costs);
    END IF;
    outcomes := '{}';
    FOR i IN 1..n LOOP
        IF (decided[i]).allowed IS NOT NULL THEN
            outcomes := outcomes || decided[i];
        ELSE
            outcomes := outcomes || asked[next];
            next := next + 1;
        END IF;
    END LOOP;
    IF cost > 0 THEN
        outcomes := rate_limit._count_denials(targets, outcomes, decided);
    END IF;
    RETURN outcomes;
END
$$;

-- Decision::combine: allowed when every bucket not in shadow mode granted; the reported bucket is the one
-- with the fewest tokens left when all granted, else a denying one with the longest wait (never: longest),
-- a denial by a bucket in shadow mode reported as shadow_denied.
CREATE FUNCTION rate_limit._combine(targets rate_limit._target[], outcomes rate_limit._outcome[])
RETURNS rate_limit.decision LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    n integer := pg_catalog.cardinality(outcomes);
    allowed boolean := true;
    shadow_denied boolean := false;
    pick integer;
    best numeric;
    w numeric;
    o rate_limit._outcome;
    d rate_limit.decision;
BEGIN
    FOR i IN 1..n LOOP
        IF NOT outcomes[i].allowed AND NOT targets[i].shadow THEN
            allowed := false;
        END IF;
    END LOOP;
    IF allowed THEN
        FOR i IN 1..n LOOP
            shadow_denied := shadow_denied OR NOT outcomes[i].allowed;
        END LOOP;
    END IF;
    FOR i IN 1..n LOOP
        IF shadow_denied OR NOT allowed THEN
            -- the longest wait (the last of equals, as Rust's max_by_key picks)
            CONTINUE WHEN outcomes[i].allowed;
            CONTINUE WHEN NOT allowed AND targets[i].shadow;
            w := COALESCE(outcomes[i].retry_after, 9223372036854775807);
            IF pick IS NULL OR w >= best THEN
                pick := i;
                best := w;
            END IF;
        ELSE
            -- the fewest tokens left (the first of equals, as min_by_key picks)
            IF pick IS NULL OR outcomes[i].remaining < best THEN
                pick := i;
                best := outcomes[i].remaining;
            END IF;
        END IF;
    END LOOP;
    pick := COALESCE(pick, 1);
    o := outcomes[pick];
    d.allowed := allowed;
    d.remaining := GREATEST(o.remaining, 0);
    d."limit" := (targets[pick].lim).burst;
    d.retry_after := CASE WHEN allowed THEN NULL ELSE rate_limit._interval(o.retry_after) END;
    d.reset_after := rate_limit._interval(o.reset_after);
    d.policy := targets[pick].policy;
    d.shadow_denied := shadow_denied;
    RETURN d;
END
$$;
