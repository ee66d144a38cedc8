-- Time: every instant is microseconds since 2000-01-01 00:00 UTC (PostgreSQL's own epoch, as the compiled
-- edition's model counts), read from clock_timestamp(), the server's wall clock (never the frozen now()).
-- Conversions are exact: EXTRACT(EPOCH) is numeric from PostgreSQL 14 on, and on 13 a double whose error
-- (under 0.3 us for any instant of this century) the cast to bigint rounds away; an interval of
-- microseconds multiplied by a bigint below 2^53 (285 years) is exact.

-- The instant t in microseconds.
CREATE FUNCTION rate_limit._us(t timestamptz) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT ((EXTRACT(EPOCH FROM t) - 946684800) * 1000000)::bigint $$;

-- The instant of us microseconds.
CREATE FUNCTION rate_limit._ts(us bigint) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT timestamptz '2000-01-01 00:00:00+00' + us * interval '1 microsecond' $$;

-- Now on the table store's clock, in microseconds.
CREATE FUNCTION rate_limit._now() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT ((EXTRACT(EPOCH FROM clock_timestamp()) - 946684800) * 1000000)::bigint $$;

-- A wall-clock time (timestamp without time zone) in microseconds since 2000-01-01 00:00 on its clocks.
CREATE FUNCTION rate_limit._wall_us(t timestamp) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ((EXTRACT(EPOCH FROM t) - 946684800) * 1000000)::bigint $$;

-- The wall-clock time of us microseconds.
CREATE FUNCTION rate_limit._wall(us bigint) RETURNS timestamp
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT timestamp '2000-01-01 00:00:00' + us * interval '1 microsecond' $$;

-- Microseconds as an interval, all in its time field ('00:00:06'), as decisions report them.
CREATE FUNCTION rate_limit._interval(us bigint) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT us * interval '1 microsecond' $$;

-- An interval's microseconds, months apart (days are 24 hours, as the compiled edition counts them);
-- NULL when it does not fit in a bigint.
CREATE FUNCTION rate_limit._interval_us(i interval) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE STRICT
AS $$
DECLARE
    us numeric := EXTRACT(DAY FROM i)::numeric * 86400000000 + EXTRACT(HOUR FROM i)::numeric * 3600000000
                  + EXTRACT(MINUTE FROM i)::numeric * 60000000 + EXTRACT(MICROSECONDS FROM i)::numeric;
BEGIN
    IF us > 9223372036854775807 OR us < -9223372036854775808 THEN
        RETURN NULL;
    END IF;
    RETURN us::bigint;
END
$$;

-- An interval's months (years included).
CREATE FUNCTION rate_limit._interval_months(i interval) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT EXTRACT(YEAR FROM i)::bigint * 12 + EXTRACT(MONTH FROM i)::bigint $$;

-- instant - now, never negative, at most the largest bigint: the model's `until` (NULL for NULL).
CREATE FUNCTION rate_limit._until(instant numeric, now bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN instant IS NULL THEN NULL
                 ELSE LEAST(GREATEST(instant - now, 0), 9223372036854775807)::bigint END $$;

-- a.div_euclid(b) and a.rem_euclid(b) for b > 0.
CREATE FUNCTION rate_limit._div(a bigint, b bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT a / b - CASE WHEN a % b < 0 THEN 1 ELSE 0 END $$;
CREATE FUNCTION rate_limit._mod(a bigint, b bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT a % b + CASE WHEN a % b < 0 THEN b ELSE 0 END $$;

-- Exact integer division of numerics for b > 0 (numeric's / rounds to a scale): floor(a / b), and
-- ceil(a / b) for a >= 0.
CREATE FUNCTION rate_limit._fdiv(a numeric, b numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.div(a, b) - CASE WHEN pg_catalog.mod(a, b) < 0 THEN 1 ELSE 0 END $$;
CREATE FUNCTION rate_limit._cdiv(a numeric, b numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.div(a + b - 1, b) $$;
