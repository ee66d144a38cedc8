-- The model: the compiled edition's arithmetic (model/src/algorithm), function by function, exact in
-- integers. A bucket's state is (level, at) as the compiled edition stores it; a limit is its algorithm and
-- numbers, with a calendar window's calendar. Where the Rust computes in i128, this computes in numeric, so
-- no input overflows. The differential test (tests/integration/tests/differential.rs) holds the two equal.

-- A limit: algorithm, rate per per_us microseconds, at most burst; for a calendar window its zone, step
-- (months or days) and anchor (wall-clock microseconds), or only open_until: the end of the window open at
-- the call, for a calendar window known by its numbers alone (what the compiled TAKE statement is given).
CREATE TYPE rate_limit._limit AS (
    algorithm  text,
    rate       bigint,
    per_us     bigint,
    burst      bigint,
    zone       text,
    months     integer,
    days       integer,
    anchor     bigint,
    open_until bigint
);

-- What one bucket decided (the model's Outcome): the state to store (level, at), the whole tokens left,
-- microseconds until the cost could be granted (NULL: allowed, or never) and until full.
CREATE TYPE rate_limit._outcome AS (
    allowed     boolean,
    level       bigint,
    at          bigint,
    remaining   bigint,
    retry_after bigint,
    reset_after bigint
);

-- A limit of stored numbers (no calendar: a stored state holds its window's end).
CREATE FUNCTION rate_limit._numbers(algorithm text, rate bigint, per_us bigint, burst bigint)
RETURNS rate_limit._limit LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ROW(algorithm, rate, per_us, burst, NULL, NULL, NULL, NULL, NULL)::rate_limit._limit $$;

-- Whether two limits have the same numbers (what a bucket stores with its state).
CREATE FUNCTION rate_limit._same(a rate_limit._limit, b rate_limit._limit) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT a.algorithm = b.algorithm AND a.rate = b.rate AND a.per_us = b.per_us AND a.burst = b.burst $$;

-- The state of a key never seen: a full bucket.
CREATE FUNCTION rate_limit._full_level(l rate_limit._limit) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE WHEN l.algorithm = 'token_bucket' THEN l.burst * l.per_us
            WHEN l.algorithm = 'adaptive_limit' THEN l.rate * 1000
            ELSE 0 END
$$;

------------------------------------------------------------------------------------------------------------
-- Token bucket (model/src/algorithm/token_bucket.rs): the level in ticks, one token = per_us ticks.

-- The level at now: the stored level plus rate ticks per elapsed microsecond, never above full; a now
-- before at (a clock stepped back) adds nothing.
CREATE FUNCTION rate_limit._tb_level_at(level bigint, at bigint, rate bigint, full_level bigint, now bigint)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    lvl bigint := LEAST(level, full_level);
    elapsed numeric;
BEGIN
    IF now <= at THEN
        RETURN lvl;
    END IF;
    elapsed := now::numeric - at;
    IF lvl >= 0 AND elapsed < 4294967296 AND rate < 2147483648 THEN
        -- rate × elapsed < 2^63: plain bigint arithmetic
        RETURN LEAST(lvl + rate * elapsed::bigint, full_level);
    END IF;
    RETURN LEAST(lvl + rate * elapsed, full_level)::bigint;
END
$$;

-- The outcome reporting the bucket (level, at) at now.
CREATE FUNCTION rate_limit._tb_outcome(l rate_limit._limit, allowed boolean, level bigint, at bigint,
                                       retry_after bigint, now bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    missing numeric := (l.burst::numeric * l.per_us) - level;
    full_at numeric := at + rate_limit._cdiv(missing, l.rate);
BEGIN
    RETURN ROW(allowed, level, at, GREATEST(level / l.per_us, 0), retry_after,
               rate_limit._until(full_at, now))::rate_limit._outcome;
END
$$;

CREATE FUNCTION rate_limit._take_tb(l rate_limit._limit, level bigint, at bigint, now bigint, cost bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    full_level bigint := l.burst * l.per_us;
    current bigint := rate_limit._tb_level_at(level, at, l.rate, full_level, now);
    need numeric;
    retry bigint;
BEGIN
    IF cost = 0 THEN
        RETURN rate_limit._tb_outcome(l, true, current, now, NULL, now);
    END IF;
    need := cost::numeric * l.per_us;
    IF cost >= 1 AND current >= need THEN
        RETURN rate_limit._tb_outcome(l, true, (current - need)::bigint, now, NULL, now);
    END IF;
    -- when cost tokens could be there if nobody took any; never when it exceeds the capacity
    IF cost <= l.burst THEN
        IF need - current <= 0 THEN
            retry := 0;
        ELSE
            retry := rate_limit._until(now + rate_limit._cdiv(need - current, l.rate), now);
        END IF;
    END IF;
    RETURN rate_limit._tb_outcome(l, false, current, now, retry, now);
END
$$;

------------------------------------------------------------------------------------------------------------
-- Fixed and sliding windows (model/src/algorithm/window.rs), aligned on multiples of per_us since 2000.

-- (previous, current) counts of the window containing t; a t before at keeps the counts as they were.
CREATE FUNCTION rate_limit._counts_at(l rate_limit._limit, level bigint, at bigint, t bigint,
                                      OUT previous bigint, OUT current bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    moved bigint := GREATEST(rate_limit._div(t, l.per_us) - rate_limit._div(at, l.per_us), 0);
    lvl bigint := GREATEST(level, 0);
BEGIN
    previous := 0;
    current := 0;
    IF l.algorithm = 'fixed_window' THEN
        IF moved = 0 THEN
            current := lvl;
        END IF;
    ELSIF l.algorithm = 'sliding_window' THEN
        IF moved = 0 THEN
            previous := lvl >> 32;
            current := lvl & 4294967295;
        ELSIF moved = 1 THEN
            previous := lvl & 4294967295;
        END IF;
    END IF;
END
$$;

-- The used amount at t, times per_us: previous × (per − elapsed) + current × per.
CREATE FUNCTION rate_limit._weighted_use(l rate_limit._limit, previous bigint, current bigint, t bigint)
RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT previous::numeric * (l.per_us - rate_limit._mod(t, l.per_us)) + current::numeric * l.per_us
$$;

CREATE FUNCTION rate_limit._pack(previous bigint, current bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (previous << 32) | current $$;

CREATE FUNCTION rate_limit._window_outcome(l rate_limit._limit, allowed boolean, previous bigint,
                                           current bigint, retry_after bigint, t bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    period numeric := l.per_us;
    used numeric := rate_limit._weighted_use(l, previous, current, t);
    next_start numeric := rate_limit._div(t, l.per_us)::numeric * period + period;
    full_at numeric;
BEGIN
    IF current > 0 THEN
        full_at := CASE WHEN l.algorithm = 'sliding_window' THEN next_start + period ELSE next_start END;
    ELSIF previous > 0 THEN
        full_at := next_start;
    ELSE
        full_at := t;
    END IF;
    RETURN ROW(allowed,
               CASE WHEN l.algorithm = 'sliding_window' THEN rate_limit._pack(previous, current) ELSE current END,
               t, pg_catalog.div(GREATEST(l.burst * period - used, 0), period)::bigint, retry_after,
               rate_limit._until(full_at, t))::rate_limit._outcome;
END
$$;

-- The first instant at or after t at which cost (<= burst) tokens fit, if nobody takes any.
CREATE FUNCTION rate_limit._window_retry(l rate_limit._limit, previous bigint, current bigint, t bigint,
                                         cost bigint)
RETURNS numeric LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    period numeric := l.per_us;
    window_start numeric := rate_limit._div(t, l.per_us)::numeric * period;
    next_start numeric := window_start + period;
    room numeric := l.burst::numeric - current - cost;
    e numeric;
BEGIN
    IF l.algorithm = 'fixed_window' THEN
        RETURN next_start;
    END IF;
    -- in this window: previous × (per − e) <= (burst − current − cost) × per
    IF room >= 0 AND previous > 0 THEN
        e := period - pg_catalog.div(room * period, previous);
        IF e < period THEN
            RETURN GREATEST(window_start + e, t);
        END IF;
    END IF;
    -- in the next window the current count becomes the previous one, weighted down to zero
    IF current = 0 THEN
        RETURN next_start;
    END IF;
    e := GREATEST(period - pg_catalog.div((l.burst::numeric - cost) * period, current), 0);
    RETURN next_start + e;
END
$$;

CREATE FUNCTION rate_limit._take_window(l rate_limit._limit, level bigint, at bigint, now bigint, cost bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    c record := rate_limit._counts_at(l, level, at, now);
    used numeric := rate_limit._weighted_use(l, c.previous, c.current, now);
    allowed boolean := used + cost::numeric * l.per_us <= l.burst::numeric * l.per_us;
    retry bigint;
BEGIN
    IF NOT allowed AND cost <= l.burst THEN
        retry := rate_limit._until(rate_limit._window_retry(l, c.previous, c.current, now, cost), now);
    END IF;
    RETURN rate_limit._window_outcome(l, allowed, c.previous,
                                      CASE WHEN allowed THEN c.current + cost ELSE c.current END, retry, now);
END
$$;

------------------------------------------------------------------------------------------------------------
-- Calendar windows (model/src/algorithm/calendar.rs): windows that start at dates on a zone's clocks.
-- The zone's rules are PostgreSQL's own AT TIME ZONE, as the compiled edition's zones are.

-- The instant the zone's clocks read the wall-clock time local (microseconds).
CREATE FUNCTION rate_limit._zone_utc(zone text, local bigint) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT rate_limit._us(rate_limit._wall(local) AT TIME ZONE zone) $$;

-- What the zone's clocks read at the instant utc.
CREATE FUNCTION rate_limit._zone_local(zone text, utc bigint) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT rate_limit._wall_us(rate_limit._ts(utc) AT TIME ZONE zone) $$;

-- Months since January 2000 of a wall-clock time.
CREATE FUNCTION rate_limit._month_index(local bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT (EXTRACT(YEAR FROM rate_limit._wall(local))::bigint - 2000) * 12
       + EXTRACT(MONTH FROM rate_limit._wall(local))::bigint - 1
$$;

-- The instant window k of the calendar starts: anchor + k steps on the wall clock (months first, the day
-- clamped to the month's length, as PostgreSQL adds months), then through the zone.
CREATE FUNCTION rate_limit._cal_start(l rate_limit._limit, k bigint) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT rate_limit._zone_utc(l.zone, CASE
    WHEN l.months > 0 THEN rate_limit._wall_us(rate_limit._wall(l.anchor) + (k * l.months) * interval '1 month')
    ELSE l.anchor + k * l.days * 86400000000 END)
$$;

-- The calendar window containing t: (start, end) with start <= t < end (see Calendar::window).
CREATE FUNCTION rate_limit._cal_window(l rate_limit._limit, t bigint, OUT start_at bigint, OUT end_at bigint)
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    local bigint := rate_limit._zone_local(l.zone, t);
    k bigint;
BEGIN
    IF l.months > 0 THEN
        k := rate_limit._div(rate_limit._month_index(local) - rate_limit._month_index(l.anchor), l.months);
    ELSE
        k := rate_limit._div(rate_limit._div(local - l.anchor, 86400000000), l.days);
    END IF;
    FOR i IN 1..8 LOOP
        IF rate_limit._cal_start(l, k) > t THEN
            k := k - 1;
        ELSIF rate_limit._cal_start(l, k + 1) <= t THEN
            k := k + 1;
        ELSE
            EXIT;
        END IF;
    END LOOP;
    -- a zone that skips whole days can make a window empty; a window always moves forward
    start_at := LEAST(rate_limit._cal_start(l, k), t);
    end_at := GREATEST(rate_limit._cal_start(l, k + 1), t + 1);
END
$$;

-- The instant the calendar window containing t ends: the calendar's, else (numbers alone) the end the
-- call was told while t is before it, else t plus the nominal window.
CREATE FUNCTION rate_limit._cal_window_end(l rate_limit._limit, t bigint) RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    IF l.zone IS NOT NULL THEN
        RETURN (rate_limit._cal_window(l, t)).end_at;
    ELSIF l.open_until IS NOT NULL AND t < l.open_until THEN
        RETURN l.open_until;
    END IF;
    RETURN LEAST(t::numeric + l.per_us, 9223372036854775807)::bigint;
END
$$;

-- end_seconds << 31 | count, end_seconds rounded up and at most 2^32 - 1.
CREATE FUNCTION rate_limit._cal_pack(end_us bigint, count bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT (LEAST(GREATEST(rate_limit._div(end_us, 1000000)
                       + CASE WHEN rate_limit._mod(end_us, 1000000) <> 0 THEN 1 ELSE 0 END, 0), 4294967295) << 31)
       | LEAST(GREATEST(count, 0), 2147483647)
$$;

-- The count and window end of a calendar state at t: (0, NULL) once its window is over.
CREATE FUNCTION rate_limit._cal_open(level bigint, t bigint, OUT count bigint, OUT end_at bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    lvl bigint := GREATEST(level, 0);
BEGIN
    count := lvl & 2147483647;
    end_at := (lvl >> 31) * 1000000;
    IF NOT (t < end_at AND count > 0) THEN
        count := 0;
        end_at := NULL;
    END IF;
END
$$;

CREATE FUNCTION rate_limit._cal_outcome(l rate_limit._limit, allowed boolean, count bigint, end_at bigint,
                                        retry_after bigint, t bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    level bigint := 0;
    reset_after bigint := 0;
BEGIN
    IF count > 0 THEN
        level := rate_limit._cal_pack(COALESCE(end_at, rate_limit._cal_window_end(l, t)), count);
        -- the end as stored (whole seconds), so that every reading of the state agrees
        reset_after := rate_limit._until(((level >> 31) * 1000000)::numeric, t);
    END IF;
    RETURN ROW(allowed, level, t, GREATEST(l.burst - count, 0), retry_after, reset_after)::rate_limit._outcome;
END
$$;

CREATE FUNCTION rate_limit._take_calendar(l rate_limit._limit, level bigint, now bigint, cost bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    o record := rate_limit._cal_open(level, now);
BEGIN
    IF o.count::numeric + cost > l.burst THEN
        RETURN rate_limit._cal_outcome(l, false, o.count, o.end_at,
            CASE WHEN cost > l.burst OR o.end_at IS NULL THEN NULL
                 ELSE rate_limit._until(o.end_at::numeric, now) END, now);
    END IF;
    RETURN rate_limit._cal_outcome(l, true, o.count + cost, o.end_at, NULL, now);
END
$$;

------------------------------------------------------------------------------------------------------------
-- Concurrency leases (model/src/algorithm/lease.rs): a bucket is one lease slot, level its lease id.

CREATE FUNCTION rate_limit._slot_held(l rate_limit._limit, level bigint, at bigint, now bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT level <> 0 AND now::numeric < at::numeric + l.per_us $$;

CREATE FUNCTION rate_limit._lease_expiry(l rate_limit._limit, at bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT LEAST(at::numeric + l.per_us, 9223372036854775807)::bigint $$;

CREATE FUNCTION rate_limit._slot_outcome(l rate_limit._limit, level bigint, at bigint, now bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    held boolean := rate_limit._slot_held(l, level, at, now);
    expires bigint := rate_limit._until(rate_limit._lease_expiry(l, at)::numeric, now);
BEGIN
    IF held THEN
        RETURN ROW(false, level, at, 0, expires, expires)::rate_limit._outcome;
    END IF;
    RETURN ROW(true, 0, now, 1, NULL, 0)::rate_limit._outcome;
END
$$;

-- Lease `lease` in a slot at now: granted when the slot is free, else the slot as it is.
CREATE FUNCTION rate_limit._acquire_in(l rate_limit._limit, level bigint, at bigint, now bigint, lease bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    o rate_limit._outcome;
BEGIN
    IF lease <> 0 AND NOT rate_limit._slot_held(l, level, at, now) THEN
        RETURN ROW(true, lease, now, 0, NULL,
                   rate_limit._until(rate_limit._lease_expiry(l, now)::numeric, now))::rate_limit._outcome;
    END IF;
    o := rate_limit._slot_outcome(l, level, at, now);
    o.allowed := false;
    RETURN o;
END
$$;

-- Release `lease` from a slot at now: allowed (released) with the free slot, or denied with it as it is.
CREATE FUNCTION rate_limit._release_in(l rate_limit._limit, level bigint, at bigint, now bigint, lease bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    o rate_limit._outcome;
BEGIN
    IF lease <> 0 AND level = lease AND rate_limit._slot_held(l, level, at, now) THEN
        o := rate_limit._slot_outcome(l, 0, now, now);
        o.allowed := true;
        RETURN o;
    END IF;
    o := rate_limit._slot_outcome(l, level, at, now);
    o.allowed := false;
    RETURN o;
END
$$;

-- The id of a lease in slot `slot` from 52 random bits: never 0, its slot in its low 10 bits.
CREATE FUNCTION rate_limit._lease_id(random bigint, slot bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ((random + 1) << 10) | LEAST(GREATEST(slot, 0), 999) $$;

------------------------------------------------------------------------------------------------------------
-- Reservations (model/src/algorithm/reservation.rs): a bucket is one reservation, level the tokens it holds
-- (0 once settled), at when it was made; it is held until at + per_us (the hold).

CREATE FUNCTION rate_limit._reservation_held(l rate_limit._limit, level bigint, at bigint, now bigint)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT level > 0 AND GREATEST(now, at)::numeric < at::numeric + l.per_us $$;

-- A reservation's bucket reported: while held, remaining its tokens and reset_after until it expires; free,
-- a full bucket.
CREATE FUNCTION rate_limit._reservation_outcome(l rate_limit._limit, level bigint, at bigint, now bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF rate_limit._reservation_held(l, level, at, now) THEN
        RETURN ROW(true, level, at, level, NULL,
                   rate_limit._until(LEAST(at::numeric + l.per_us, 9223372036854775807), now))::rate_limit._outcome;
    END IF;
    RETURN ROW(true, 0, now, 0, NULL, 0)::rate_limit._outcome;
END
$$;

-- Reserves tokens in a reservation's bucket at now: granted unless it holds one already; 0 only reports.
CREATE FUNCTION rate_limit._take_reservation(l rate_limit._limit, level bigint, at bigint, now bigint,
                                             tokens bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    o rate_limit._outcome;
BEGIN
    IF tokens <= 0 OR rate_limit._reservation_held(l, level, at, now) THEN
        o := rate_limit._reservation_outcome(l, level, at, now);
        o.allowed := tokens <= 0;
        RETURN o;
    END IF;
    RETURN rate_limit._reservation_outcome(l, tokens, now, now);
END
$$;

------------------------------------------------------------------------------------------------------------
-- Booked slots (model/src/algorithm/booking.rs): a token bucket's tokens booked first come first served,
-- the level driven below zero; a booking for later is recorded as a reservation held until its time.

-- How deep below zero a booking may leave a token bucket, in ticks: the policy's debt, and what the refill
-- makes up within the caller's delay (max_delay_us).
CREATE FUNCTION rate_limit._booking_depth(l rate_limit._limit, max_debt bigint, max_delay_us bigint)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    RETURN LEAST(LEAST(GREATEST(max_debt, 0), GREATEST(rate_limit._most_debt(l), 0))::numeric * l.per_us,
                 GREATEST(max_delay_us, 0)::numeric * l.rate)::bigint;
END
$$;

-- Books cost tokens at now, down to depth ticks below zero: granted with the bucket in debt until the
-- booked tokens exist; denied with retry_after until a booking of cost fits (NULL: never).
CREATE FUNCTION rate_limit._book(l rate_limit._limit, level bigint, at bigint, now bigint, cost bigint,
                                 depth bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    current numeric := rate_limit._tb_level_at(level, at, l.rate, l.burst * l.per_us, now);
    asked numeric := GREATEST(cost, 1)::numeric * l.per_us;
    needed numeric := asked - depth;
BEGIN
    IF current - asked >= -depth THEN
        RETURN rate_limit._tb_outcome(l, true, (current - asked)::bigint, now, NULL, now);
    END IF;
    RETURN rate_limit._tb_outcome(l, false, current::bigint, now,
        CASE WHEN needed <= l.burst::numeric * l.per_us
             THEN LEAST(rate_limit._cdiv(needed - current, l.rate), 9223372036854775807)::bigint END, now);
END
$$;

-- Microseconds after at until a token bucket left at level by a booking is out of debt.
CREATE FUNCTION rate_limit._booked_wait(l rate_limit._limit, level bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN level >= 0 THEN 0 ELSE rate_limit._cdiv(-level::numeric, l.rate)::bigint END $$;

------------------------------------------------------------------------------------------------------------
-- Blocks (model/src/algorithm/block.rs): level < 0 blocked for -level us from at; level > 0 denials counted
-- in the window [at, at + per_us).

CREATE FUNCTION rate_limit._block_outcome(l rate_limit._limit, level bigint, at bigint, now bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    t bigint := GREATEST(now, at);
    until_at numeric;
BEGIN
    IF level < 0 THEN
        until_at := LEAST(at::numeric - level, 9223372036854775807);
        IF t < until_at THEN
            RETURN ROW(false, level, at, 0, rate_limit._until(until_at, t),
                       rate_limit._until(until_at, t))::rate_limit._outcome;
        END IF;
    ELSIF level > 0 THEN
        until_at := LEAST(at::numeric + l.per_us, 9223372036854775807);
        IF t < until_at THEN
            RETURN ROW(true, level, at, GREATEST(l.rate - level, 0), NULL,
                       rate_limit._until(until_at, t))::rate_limit._outcome;
        END IF;
    END IF;
    RETURN ROW(true, 0, now, l.rate, NULL, 0)::rate_limit._outcome;
END
$$;

-- The longest block: 100 years.
CREATE FUNCTION rate_limit._max_block_us() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 100::bigint * 366 * 86400 * 1000000 $$;

-- Counts one denial at now (the penalty box); the rate-th within a window blocks for block_for from now.
CREATE FUNCTION rate_limit._count_denial(l rate_limit._limit, level bigint, at bigint, now bigint,
                                         block_for bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    current rate_limit._outcome := rate_limit._block_outcome(l, level, at, now);
    count bigint;
    o rate_limit._outcome;
BEGIN
    IF NOT current.allowed THEN
        RETURN current; -- blocked: it stays as it is
    END IF;
    count := CASE WHEN current.reset_after > 0 THEN level + 1 ELSE 1 END;
    IF count >= l.rate THEN
        o := rate_limit._block_outcome(l, -LEAST(GREATEST(block_for, 1), rate_limit._max_block_us()), now,
                                       GREATEST(now, at));
    ELSIF count = 1 THEN
        o := rate_limit._block_outcome(l, 1, now, GREATEST(now, at));
    ELSE
        o := rate_limit._block_outcome(l, count, at, GREATEST(now, at));
    END IF;
    o.allowed := true;
    RETURN o;
END
$$;

CREATE FUNCTION rate_limit._block_for(l rate_limit._limit, now bigint, duration bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    o rate_limit._outcome := rate_limit._block_outcome(l, -LEAST(GREATEST(duration, 1), rate_limit._max_block_us()),
                                                       now, now);
BEGIN
    o.allowed := true;
    RETURN o;
END
$$;

------------------------------------------------------------------------------------------------------------
-- Adaptive limits (model/src/algorithm/adaptive.rs): a key's limit, level in thousandths of a lease, at its
-- last decrease; numbers: rate (and burst) the most leases, per_us the lease TTL. At its most, or one TTL
-- after its last decrease, it is full (a missing one).

CREATE FUNCTION rate_limit._limit_in_force(l rate_limit._limit, level bigint, at bigint, now bigint)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT level < l.rate * 1000 AND now::numeric < at::numeric + l.per_us $$;

-- A limit reported (Policy::limit_outcome): remaining the leases it allows.
CREATE FUNCTION rate_limit._limit_outcome(l rate_limit._limit, level bigint, at bigint, now bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF rate_limit._limit_in_force(l, level, at, now) THEN
        RETURN ROW(true, level, at, level / 1000, NULL, rate_limit._until(at::numeric + l.per_us, now))::rate_limit._outcome;
    END IF;
    RETURN ROW(true, l.rate * 1000, now, l.rate, NULL, 0)::rate_limit._outcome;
END
$$;

-- The leases a key may hold with limit state (level, at) at now, between min_leases and l.rate
-- (Adaptive::limit).
CREATE FUNCTION rate_limit._limit_leases(l rate_limit._limit, level bigint, at bigint, now bigint,
                                         min_leases bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE WHEN level IS NOT NULL AND rate_limit._limit_in_force(l, level, at, now)
            THEN LEAST(GREATEST(level / 1000, min_leases), l.rate) ELSE l.rate END
$$;

-- A release's report at now (Policy::adapt, Adaptive::after_release): allowed with the state to write
-- when the limit changed. A good call adds 1/limit lease; a bad one (not 'ok', or slower than target_us)
-- cuts it to 9/10, never below min_leases, unless its lease was acquired before the last decrease.
CREATE FUNCTION rate_limit._adapt(l rate_limit._limit, level bigint, at bigint, now bigint, min_leases bigint,
                                  target_us bigint, acquired_at bigint, latency_us bigint, outcome text)
RETURNS rate_limit._outcome LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    top bigint := l.rate * 1000;
    cur bigint := top;
    last_decrease bigint;  -- NULL: none in force
    o rate_limit._outcome;
BEGIN
    IF rate_limit._limit_in_force(l, level, at, now) THEN
        cur := LEAST(GREATEST(level, min_leases * 1000), top);
        last_decrease := at;
    END IF;
    IF outcome <> 'ok' OR latency_us > target_us THEN
        IF acquired_at < last_decrease THEN
            o := rate_limit._limit_outcome(l, level, at, now);
            o.allowed := false;
            RETURN o;
        END IF;
        o := rate_limit._limit_outcome(l, GREATEST(cur * 9 / 10, min_leases * 1000), now, now);
        o.allowed := true;
        RETURN o;
    END IF;
    IF cur >= top THEN
        o := rate_limit._limit_outcome(l, level, at, now);
        o.allowed := false;
        RETURN o;
    END IF;
    o := rate_limit._limit_outcome(l, LEAST(cur + GREATEST(1000000 / cur, 1), top), last_decrease, now);
    o.allowed := true;
    RETURN o;
END
$$;

------------------------------------------------------------------------------------------------------------
-- Every algorithm.

-- Asks for cost (>= 0) tokens at now (Policy::take); cost 0 grants nothing and reports.
CREATE FUNCTION rate_limit._take(l rate_limit._limit, level bigint, at bigint, now bigint, cost bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    CASE l.algorithm
    WHEN 'token_bucket' THEN
        RETURN rate_limit._take_tb(l, level, at, now, cost);
    WHEN 'fixed_window', 'sliding_window' THEN
        RETURN rate_limit._take_window(l, level, at, now, cost);
    WHEN 'calendar_window' THEN
        RETURN rate_limit._take_calendar(l, level, now, cost);
    WHEN 'concurrency' THEN
        RETURN rate_limit._slot_outcome(l, level, at, now);
    WHEN 'reservation' THEN
        RETURN rate_limit._take_reservation(l, level, at, now, cost);
    WHEN 'adaptive_limit' THEN
        RETURN rate_limit._limit_outcome(l, level, at, now);
    ELSE
        RETURN rate_limit._block_outcome(l, level, at, now);
    END CASE;
END
$$;

-- Whether the bucket is full at now (and so equal to a missing one).
CREATE FUNCTION rate_limit._is_full(l rate_limit._limit, level bigint, at bigint, now bigint) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT (rate_limit._take(l, level, at, now, 0)).reset_after = 0 $$;

-- The tokens at now as an exact fraction num / den.
CREATE FUNCTION rate_limit._tokens_exact(l rate_limit._limit, level bigint, at bigint, now bigint,
                                         OUT num numeric, OUT den numeric)
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    c record;
BEGIN
    den := 1;
    CASE l.algorithm
    WHEN 'token_bucket' THEN
        num := rate_limit._tb_level_at(level, at, l.rate, l.burst * l.per_us, now);
        den := l.per_us;
    WHEN 'fixed_window', 'sliding_window' THEN
        c := rate_limit._counts_at(l, level, at, now);
        num := l.burst::numeric * l.per_us - rate_limit._weighted_use(l, c.previous, c.current, now);
        den := l.per_us;
    WHEN 'calendar_window' THEN
        num := l.burst - (rate_limit._cal_open(level, now)).count;
    WHEN 'concurrency' THEN
        num := (rate_limit._slot_outcome(l, level, at, now)).remaining;
    WHEN 'reservation' THEN
        num := (rate_limit._reservation_outcome(l, level, at, now)).remaining;
    WHEN 'adaptive_limit' THEN
        -- the limit in force, in leases
        num := (rate_limit._limit_outcome(l, level, at, now)).level;
        den := 1000;
    ELSE
        num := (rate_limit._block_outcome(l, level, at, now)).remaining;
    END CASE;
END
$$;

-- The tokens at now in millionths, rounded down.
CREATE FUNCTION rate_limit._tokens_millionths(l rate_limit._limit, level bigint, at bigint, now bigint)
RETURNS bigint LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    e record := rate_limit._tokens_exact(l, level, at, now);
BEGIN
    RETURN LEAST(GREATEST(rate_limit._fdiv(e.num * 1000000, GREATEST(e.den, 1)), -9223372036854775808),
                 9223372036854775807)::bigint;
END
$$;

-- Puts up to tokens back, never above the capacity: the state to write.
CREATE FUNCTION rate_limit._refund(l rate_limit._limit, level bigint, at bigint, now bigint, tokens bigint,
                                   OUT new_level bigint, OUT new_at bigint)
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    t bigint := GREATEST(tokens, 0);
    c record;
    from_current bigint;
    from_previous bigint;
    o rate_limit._outcome;
BEGIN
    CASE l.algorithm
    WHEN 'token_bucket' THEN
        new_level := LEAST(rate_limit._tb_level_at(level, at, l.rate, l.burst * l.per_us, now)::numeric
                           + t::numeric * l.per_us, l.burst * l.per_us)::bigint;
        new_at := now;
    WHEN 'fixed_window', 'sliding_window' THEN
        c := rate_limit._counts_at(l, level, at, now);
        from_current := LEAST(t, c.current);
        from_previous := LEAST(t - from_current, c.previous);
        IF l.algorithm = 'sliding_window' THEN
            new_level := rate_limit._pack(c.previous - from_previous, c.current - from_current);
        ELSE
            new_level := c.current - from_current;
        END IF;
        new_at := now;
    WHEN 'calendar_window' THEN
        c := rate_limit._cal_open(level, now);
        o := rate_limit._cal_outcome(l, true, c.count - LEAST(t, c.count), c.end_at, NULL, now);
        new_level := o.level;
        new_at := o.at;
    ELSE
        -- a lease is given back by releasing it, a reservation by settling it; a block is lifted by
        -- deleting it
        new_level := level;
        new_at := at;
    END CASE;
END
$$;

-- The largest max_debt a limit can count exactly.
CREATE FUNCTION rate_limit._most_debt(l rate_limit._limit) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE l.algorithm
    WHEN 'token_bucket' THEN 9223372036854775807 / l.per_us
    WHEN 'concurrency' THEN 0
    WHEN 'block' THEN 0
    WHEN 'reservation' THEN 0
    WHEN 'adaptive_limit' THEN 0
    ELSE 2147483647 - l.burst END
$$;

-- Charges cost tokens at now, down to max_debt tokens below zero: always granted.
CREATE FUNCTION rate_limit._charge(l rate_limit._limit, level bigint, at bigint, now bigint, cost bigint,
                                   max_debt bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    c_cost bigint := GREATEST(cost, 0);
    debt bigint := LEAST(GREATEST(max_debt, 0), GREATEST(rate_limit._most_debt(l), 0));
    current numeric;
    floor_level numeric;
    c record;
    ceiling numeric;
    most bigint;
    after numeric;
BEGIN
    CASE l.algorithm
    WHEN 'token_bucket' THEN
        current := rate_limit._tb_level_at(level, at, l.rate, l.burst * l.per_us, now);
        floor_level := LEAST(-debt::numeric * l.per_us, current);
        after := GREATEST(current - c_cost::numeric * l.per_us, floor_level);
        RETURN rate_limit._tb_outcome(l, true, after::bigint, now, NULL, now);
    WHEN 'fixed_window', 'sliding_window' THEN
        c := rate_limit._counts_at(l, level, at, now);
        ceiling := (l.burst::numeric + debt) * l.per_us - rate_limit._weighted_use(l, c.previous, 0, now);
        most := LEAST(GREATEST(rate_limit._fdiv(ceiling, l.per_us), c.current), 2147483647)::bigint;
        after := GREATEST(LEAST(c.current::numeric + c_cost, most), c.current);
        RETURN rate_limit._window_outcome(l, true, c.previous, after::bigint, NULL, now);
    WHEN 'calendar_window' THEN
        c := rate_limit._cal_open(level, now);
        ceiling := LEAST(GREATEST(l.burst::numeric + debt, c.count), 2147483647);
        after := GREATEST(LEAST(c.count::numeric + c_cost, ceiling), c.count);
        RETURN rate_limit._cal_outcome(l, true, after::bigint, c.end_at, NULL, now);
    WHEN 'concurrency' THEN
        RETURN rate_limit._slot_outcome(l, level, at, now);
    WHEN 'reservation' THEN
        -- a reservation is settled, not charged: a charge reports it
        RETURN rate_limit._reservation_outcome(l, level, at, now);
    WHEN 'adaptive_limit' THEN
        RETURN rate_limit._limit_outcome(l, level, at, now);
    ELSE
        RETURN rate_limit._block_outcome(l, level, at, now);
    END CASE;
END
$$;

-- The state under l of a bucket stored under s (Policy::carry_over): its tokens at changed_at (clamped
-- between the state's instant and now), rounded down and capped at l's capacity; a bucket full then is
-- full under l.
CREATE FUNCTION rate_limit._carry_over(l rate_limit._limit, level bigint, at bigint, s rate_limit._limit,
                                       changed_at bigint, now bigint, OUT new_level bigint, OUT new_at bigint)
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    t bigint;
    e record;
    available bigint;
BEGIN
    IF rate_limit._same(l, s) THEN
        new_level := level;
        new_at := at;
        RETURN;
    END IF;
    t := GREATEST(LEAST(changed_at, now), at);
    new_at := t;
    IF rate_limit._is_full(s, level, at, t) THEN
        new_level := rate_limit._full_level(l);
        RETURN;
    END IF;
    e := rate_limit._tokens_exact(s, level, at, t);
    CASE l.algorithm
    WHEN 'token_bucket' THEN
        new_level := LEAST(GREATEST(rate_limit._fdiv(e.num * l.per_us, e.den), -9223372036854775808),
                           l.burst::numeric * l.per_us)::bigint;
    WHEN 'fixed_window', 'sliding_window' THEN
        -- a debt stays a count above the limit, within what a window holds
        available := LEAST(GREATEST(rate_limit._fdiv(e.num, e.den), l.burst - 2147483647), l.burst)::bigint;
        new_level := l.burst - available;
    WHEN 'concurrency' THEN
        IF s.algorithm = 'concurrency' THEN
            -- a slot keeps its lease, expiring when it did under the numbers it was acquired with
            new_level := level;
            new_at := GREATEST(rate_limit._lease_expiry(s, at)::numeric - l.per_us, -9223372036854775808)::bigint;
        ELSE
            new_level := 0;
        END IF;
    WHEN 'block' THEN
        IF s.algorithm = 'block' THEN
            new_level := level;
            new_at := at;
        ELSE
            new_level := 0;
        END IF;
    WHEN 'reservation' THEN
        IF s.algorithm = 'reservation' THEN
            -- a reservation keeps its tokens and expires when it did, whatever hold it is read with
            new_level := level;
            new_at := GREATEST(LEAST(at::numeric + s.per_us, 9223372036854775807) - l.per_us,
                               -9223372036854775808)::bigint;
        ELSE
            new_level := 0;
        END IF;
    WHEN 'adaptive_limit' THEN
        IF s.algorithm = 'adaptive_limit' THEN
            -- a limit keeps its level (within the new most leases) and its last decrease
            new_level := LEAST(level, l.rate * 1000);
            new_at := at;
        ELSE
            new_level := rate_limit._full_level(l);
        END IF;
    ELSE -- calendar_window
        available := LEAST(GREATEST(rate_limit._fdiv(e.num, e.den), l.burst - 2147483647), l.burst)::bigint;
        -- a count from a calendar window stays in the window it was counted in while it is open at t
        -- (Policy::calendar_carried), wherever the window open at the call ends
        new_level := (rate_limit._cal_outcome(l, true, l.burst - available,
                      CASE WHEN s.algorithm = 'calendar_window' THEN (rate_limit._cal_open(level, t)).end_at END,
                      NULL, t)).level;
    END CASE;
END
$$;

-- The state at now of a stored bucket (NULL level: missing, so full) under l in effect since changed_at.
CREATE FUNCTION rate_limit._current(l rate_limit._limit, level bigint, at bigint, s rate_limit._limit,
                                    changed_at bigint, now bigint, OUT new_level bigint, OUT new_at bigint)
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    c record;
BEGIN
    IF level IS NULL THEN
        new_level := rate_limit._full_level(l);
        new_at := now;
        RETURN;
    END IF;
    c := rate_limit._carry_over(l, level, at, s, changed_at, now);
    new_level := c.new_level;
    new_at := c.new_at;
END
$$;

-- Target::evaluate: cost tokens at now against a stored bucket (NULL level: missing).
CREATE FUNCTION rate_limit._evaluate(l rate_limit._limit, level bigint, at bigint, s rate_limit._limit,
                                     changed_at bigint, now bigint, cost bigint)
RETURNS rate_limit._outcome LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    c record := rate_limit._current(l, level, at, s, changed_at, now);
BEGIN
    RETURN rate_limit._take(l, c.new_level, c.new_at, now, cost);
END
$$;

-- How long a bucket of l can stay short after a call: emptied and charged to max_debt (a lease: per).
CREATE FUNCTION rate_limit._longest_short_us(l rate_limit._limit, max_debt bigint) RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    IF l.algorithm IN ('concurrency', 'block', 'reservation', 'adaptive_limit') THEN
        RETURN l.per_us;
    END IF;
    RETURN (rate_limit._charge(l, rate_limit._full_level(l), 0, 0,
                               LEAST(l.burst::numeric + max_debt, 9223372036854775807)::bigint,
                               max_debt)).reset_after;
END
$$;
