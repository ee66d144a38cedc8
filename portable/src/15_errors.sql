-- The errors a caller can meet, with the compiled edition's SQLSTATEs, messages, details and hints
-- (src/error.rs): one helper raises them all. Every function that may raise is VOLATILE: PostgreSQL
-- evaluates an IMMUTABLE function of constant arguments while it plans a statement, which would raise the
-- error where the statement is planned, not where it would run.

-- Raises an error: its SQLSTATE, message, hint and (when given) detail.
CREATE FUNCTION rate_limit._raise(code text, message text, hint text, detail text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF detail IS NOT NULL AND hint IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, DETAIL = detail, HINT = hint;
    ELSIF hint IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, HINT = hint;
    ELSIF detail IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, DETAIL = detail;
    END IF;
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
END
$$;

-- A caller's text as a message quotes it: in double quotes, cut to its first 64 characters with its length
-- in bytes said when it is longer.
CREATE FUNCTION rate_limit._quoted(t text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE WHEN pg_catalog.length(t) <= 64 THEN '"' || t || '"'
            ELSE '"' || pg_catalog.left(t, 64) || '…" (' || pg_catalog.octet_length(t) || ' bytes)' END
$$;

-- 22004: a required argument was NULL.
CREATE FUNCTION rate_limit._null_argument(argument text, hint text) RETURNS void
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT rate_limit._raise('22004', argument || ' must not be NULL', hint) $$;

-- 22023: a number outside its valid range.
CREATE FUNCTION rate_limit._out_of_range(argument text, got numeric, min_value numeric, max_value numeric)
RETURNS void LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
SELECT rate_limit._raise('22023', argument || ' must be between ' || min_value || ' and ' || max_value
                                   || ', got ' || got,
                         'Pass a whole number from ' || min_value || ' to ' || max_value || ' for ' || argument || '.')
$$;

-- A key argument: not NULL, at most 2048 bytes (22004, 22023).
CREATE FUNCTION rate_limit._key_arg(argument text, key text) RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF key IS NULL THEN
        PERFORM rate_limit._null_argument(argument,
            'Pass the key to limit, such as a user id, an API key or an IP address.');
    ELSIF pg_catalog.octet_length(key) > 2048 THEN
        PERFORM rate_limit._raise('22023', argument || ' is ' || pg_catalog.octet_length(key)
            || ' bytes long; the longest ' || argument || ' accepted is 2048 bytes',
            'Use a shorter key, or a digest of a long one, e.g. md5(key).');
    END IF;
    RETURN key;
END
$$;

-- A cost argument of the limiter calls: 0 or more (22004, 22023).
CREATE FUNCTION rate_limit._cost_arg(cost integer) RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    IF cost IS NULL THEN
        PERFORM rate_limit._null_argument('cost', 'Pass the tokens to take (0 only reports), or omit cost for 1.');
    ELSIF cost < 0 THEN
        PERFORM rate_limit._out_of_range('cost', cost, 0, 2147483647);
    END IF;
    RETURN cost;
END
$$;

-- 25006: the table store cannot record a grant in a read-only transaction.
CREATE FUNCTION rate_limit._read_only(action text) RETURNS void
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
SELECT rate_limit._raise('25006', 'cannot ' || action || ' in a read-only transaction',
    'Call it in a read-write transaction on the primary, or use the memory store, which works in read-only transactions and on standbys: SET rate_limit.store = ''memory'' (needs shared_preload_libraries = ''rate_limit'').',
    'The table store records every granted call in a table of schema rate_limit.')
$$;

-- Whether the current transaction is read-only (a standby's always is).
CREATE FUNCTION rate_limit._in_read_only() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.current_setting('transaction_read_only') = 'on' $$;

-- 40001: a call kept meeting changed rows.
CREATE FUNCTION rate_limit._gave_up() RETURNS void
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT rate_limit._raise('40001', 'could not take tokens: the buckets kept changing under this call', 'Retry the call.') $$;

-- XX001: a stored row this edition could not have written.
CREATE FUNCTION rate_limit._corrupt_row(what text) RETURNS void
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
SELECT rate_limit._raise('XX001', 'a rate_limit table holds an invalid row: ' || what,
    'Delete the bucket with rate_limit.reset, rate_limit.reset_ad_hoc or rate_limit.reset_request.')
$$;
