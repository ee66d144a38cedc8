-- The fast paths of rate_limiting_request and take: the common call (a token bucket under its own
-- numbers, nothing else applying) decided in one PL/pgSQL function with bigint arithmetic that cannot
-- overflow, in one statement for a denial (the read) and two for a grant (the read, then an UPDATE of the
-- very row version read, by ctid and xmin). Every other case (arguments to refuse, bounds to check, a
-- read-only transaction's grant, blocks, shadow mode, overrides, a row under other numbers or in debt, a
-- clock that stepped back, a concurrent change) goes to the generic path (rate_limit._request,
-- rate_limit._take_policy), which decides every case as the compiled edition does; the fast path is one
-- of them, computed the same way (the differential test runs both).
--
-- Their cost is almost all in starting expressions: PostgreSQL looks up and checks the privilege of every
-- function and operator of an expression once per transaction (a PL/pgSQL expression) or per execution (a
-- statement), so a fast path is written for few of them and few statements (bench/results/portable.md):
--   - arguments are checked where they matter: a stored row whose rate and burst equal the call's proves
--     them (its creator checked them; the namespace '#request' holds only rate_limiting_request's token
--     buckets of per_us 1 000 000), so only a call that creates its bucket checks them here;
--     max_refill_time, which the owner may lower, is a constant the planner folds;
--   - rate_limiting_request decides a denial in its read as a comparison of instants (denied while now is
--     before the instant its bucket holds one token again), and computes the refill only to grant, in the
--     UPDATE;
--   - a read-only transaction is checked only before a write: a denial in it is answered as anywhere.
--
-- Every OPERATOR(...) has one precedence and associates to the left: expressions that mix them are
-- parenthesized in full.
--
-- Why no SET search_path here (the other entry points have one): a SET clause makes PostgreSQL save and
-- restore the setting around every call, about a quarter of a fast call. Instead, as the compiled edition
-- does, every operator, function and type these two functions and the SQL helpers they inline name is
-- qualified with its schema (or is SQL syntax: bigint, integer, interval, LEAST, EXTRACT), so no caller's
-- search_path can redirect them. The generic path they call sets its own search_path.
--
-- Their one SET, enable_seqscan = off (as on every entry point that reaches buckets by key): PL/pgSQL keeps
-- each statement's plan for the session's life, costed with the state table's size when it was planned.
-- Planned while the table was empty (a new installation, or after a purge deleted every bucket and VACUUM
-- truncated it), a read by key and an UPDATE by ctid are sequential scans, and every later call of that
-- session read the whole table as it grew back (tests/integration/tests/plans.rs). With sequential scans
-- off the planner takes the primary key or the ctid whatever the size (and the overrides' primary key:
-- planned on rate_limit.key_overrides vacuumed empty, take's subquery read every override too). Its price is not
-- the clause (SET enable_seqscan = on measured as fast as no clause) but the plans: index scans of the
-- tiny rate_limit._fast_policies and key_overrides instead of reading their one page, 0.86-0.90 of the
-- fast paths' throughput in bench/results/portable.md's run (0.94-0.99 by hand), against whole-table reads
-- for as long as a session lives.
--
-- Concurrency: a grant writes the row version it read; under READ COMMITTED a concurrent writer makes that
-- UPDATE wait and then write nothing (the call then takes the generic path, which reads the newest version
-- and holds it); under REPEATABLE READ and SERIALIZABLE PostgreSQL raises 40001, as for the compiled
-- edition's TAKE.

-- The level at now (>= at) of a token bucket of level 0 <= level <= full_level refilled at rate ticks per
-- microsecond (full_level + rate < 2^63: nothing overflows), never above full: the model's level_at.
CREATE FUNCTION rate_limit._tb_refilled(level bigint, at bigint, rate bigint, full_level bigint, now bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT LEAST(level OPERATOR(pg_catalog.+)
                 (rate OPERATOR(pg_catalog.*)
                  LEAST(now OPERATOR(pg_catalog.-) at,
                        ((full_level OPERATOR(pg_catalog.-) level) OPERATOR(pg_catalog./) rate) OPERATOR(pg_catalog.+) 1)),
             full_level)
$$;

-- The microseconds from since to now (an interval of hours and days only: exact).
CREATE FUNCTION rate_limit._elapsed_us(since pg_catalog.timestamptz, now pg_catalog.timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (EXTRACT(EPOCH FROM now OPERATOR(pg_catalog.-) since) OPERATOR(pg_catalog.*) 1000000)::bigint $$;

-- A bucket the fast path wrote at now_ts that the clock has since passed backwards: rebased on the clock
-- (its level unchanged: no time elapsed), as the compiled edition's TAKE does after the statement.
CREATE FUNCTION rate_limit._rebase_written(ns text, key text, clock timestamptz) RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
UPDATE rate_limit.bucket_state AS s SET updated_at = clock
 WHERE s.namespace OPERATOR(pg_catalog.=) ns AND s.key OPERATOR(pg_catalog.=) key
   AND s.updated_at OPERATOR(pg_catalog.>) clock
$$;

CREATE FUNCTION rate_limiting_request(id pg_catalog.text, refill_per_sec integer DEFAULT 2,
                                      window_seconds integer DEFAULT 60)
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET enable_seqscan = off
AS $$
DECLARE
    now_ts pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    denied boolean;
    row_ctid pg_catalog.tid;
    row_xmin pg_catalog.xid;
    remaining bigint;
BEGIN
    IF (window_seconds OPERATOR(pg_catalog.<=) LEAST(GREATEST(pg_catalog.floor(EXTRACT(EPOCH FROM rate_limit.max_refill_time())), 0), 2147483647)::integer
        AND (pg_catalog.current_setting('rate_limit.store', true) OPERATOR(pg_catalog.=) 'memory') IS NOT TRUE) IS NOT TRUE THEN
        RETURN rate_limit._request(id, refill_per_sec, window_seconds);
    END IF;
    SELECT CASE WHEN s.rate OPERATOR(pg_catalog.=) refill_per_sec
                 AND s.burst OPERATOR(pg_catalog.=) (s.rate OPERATOR(pg_catalog.*) window_seconds)
                 AND s.level OPERATOR(pg_catalog.>=) 0 AND now_ts OPERATOR(pg_catalog.>=) s.updated_at
            THEN now_ts OPERATOR(pg_catalog.<) (s.updated_at OPERATOR(pg_catalog.+)
                   ((((999999 OPERATOR(pg_catalog.+) s.rate) OPERATOR(pg_catalog.-) s.level) OPERATOR(pg_catalog./) s.rate)::double precision
                    OPERATOR(pg_catalog.*) interval '1 microsecond')) END,
           s.ctid, s.xmin
      INTO denied, row_ctid, row_xmin
      FROM rate_limit.bucket_state AS s
     WHERE s.namespace OPERATOR(pg_catalog.=) '#request' AND s.key OPERATOR(pg_catalog.=) id;
    IF denied THEN
        RETURN -1; -- denied: nothing written
    END IF;
    IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'off' THEN
        IF NOT denied THEN
            UPDATE rate_limit.bucket_state AS s
               SET level = rate_limit._tb_refilled(s.level, 0, s.rate, s.burst OPERATOR(pg_catalog.*) 1000000,
                                                   rate_limit._elapsed_us(s.updated_at, now_ts)) OPERATOR(pg_catalog.-) 1000000,
                   updated_at = now_ts
             WHERE s.ctid OPERATOR(pg_catalog.=) row_ctid AND s.xmin OPERATOR(pg_catalog.=) row_xmin
               AND s.level OPERATOR(pg_catalog.<=) (s.burst OPERATOR(pg_catalog.*) 1000000)
            RETURNING s.level INTO remaining;
        ELSIF row_ctid IS NULL AND refill_per_sec OPERATOR(pg_catalog.>=) 1 AND window_seconds OPERATOR(pg_catalog.>=) 1
              AND (refill_per_sec::bigint OPERATOR(pg_catalog.*) window_seconds) OPERATOR(pg_catalog.<=) 2147483648
              AND pg_catalog.octet_length(id) OPERATOR(pg_catalog.<=) 2048 THEN
            -- a missing bucket is full: the call takes one token of it
            INSERT INTO rate_limit.bucket_state AS s (namespace, key, level, updated_at, algorithm, rate, per_us, burst)
            VALUES ('#request', id, ((refill_per_sec::bigint OPERATOR(pg_catalog.*) window_seconds) OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) 1000000,
                    now_ts, 'token_bucket', refill_per_sec, 1000000, refill_per_sec::bigint OPERATOR(pg_catalog.*) window_seconds)
            ON CONFLICT ON CONSTRAINT bucket_state_pkey DO NOTHING
            RETURNING s.level INTO remaining;
        END IF;
        IF remaining IS NOT NULL THEN
            IF pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) now_ts THEN
                PERFORM rate_limit._rebase_written('#request', id, pg_catalog.clock_timestamp());
            END IF;
            RETURN (remaining OPERATOR(pg_catalog./) 1000000)::integer;
        END IF;
    END IF;
    RETURN rate_limit._request(id, refill_per_sec, window_seconds);
END
$$;

-- The policies take's fast path may decide alone (a token bucket, not in shadow mode, blocking no key, per
-- without months and short enough that a full bucket counts below 2^62 ticks) with per in microseconds,
-- kept by a trigger on rate_limit.policies: a call reads three numbers instead of deriving them from an
-- interval, which took a quarter of a fast call. A policy missing here takes the generic path.
CREATE TABLE rate_limit._fast_policies (
    name       text COLLATE "C" PRIMARY KEY,
    rate       bigint      NOT NULL,
    per_us     bigint      NOT NULL,
    burst      bigint      NOT NULL,
    store      text,
    created_at timestamptz NOT NULL
);
COMMENT ON TABLE rate_limit._fast_policies IS
    'rate_limit internal: the policies rate_limit.take may decide in its fast path, per in microseconds';

-- Keeps rate_limit._fast_policies equal to what it derives from rate_limit.policies, in the transaction
-- that changes them (an AFTER trigger for each row, and for TRUNCATE).
CREATE FUNCTION rate_limit._keep_fast_policies() RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    per_us bigint;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM rate_limit._fast_policies;
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM rate_limit._fast_policies AS f WHERE f.name = OLD.name;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.algorithm = 'token_bucket' AND NOT NEW.shadow AND NEW.parent IS NULL
       AND NEW.block_after IS NULL AND NOT NEW.blocks_by_hand AND rate_limit._interval_months(NEW.per) = 0 THEN
        per_us := rate_limit._interval_us(NEW.per);
        IF per_us >= 1 AND per_us <= 4611686018427387903 / NEW.burst AND NEW.rate <= 4611686018427387903 THEN
            INSERT INTO rate_limit._fast_policies (name, rate, per_us, burst, store, created_at)
            VALUES (NEW.name, NEW.rate, per_us, NEW.burst, NEW.store, NEW.created_at);
        END IF;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER keep_fast_policies AFTER INSERT OR UPDATE OR DELETE ON rate_limit.policies
    FOR EACH ROW EXECUTE FUNCTION rate_limit._keep_fast_policies();
CREATE TRIGGER keep_fast_policies_truncate AFTER TRUNCATE ON rate_limit.policies
    FOR EACH STATEMENT EXECUTE FUNCTION rate_limit._keep_fast_policies();

CREATE FUNCTION rate_limit.take(policy pg_catalog.text, key pg_catalog.text, cost integer DEFAULT 1)
RETURNS rate_limit.decision LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET enable_seqscan = off
AS $$
DECLARE
    now_ts pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    simple boolean;
    rate bigint;
    per_us bigint;
    burst bigint;
    row_ctid pg_catalog.tid;
    row_xmin pg_catalog.xid;
    current bigint;
    after bigint;
BEGIN
    -- the policy if the fast path may decide it, whether nothing but its bucket applies to the key, and
    -- the bucket's level now (full when it has no row; NULL when the fast path may not decide it)
    SELECT f.rate, f.per_us, f.burst,
           COALESCE(f.store, pg_catalog.current_setting('rate_limit.store', true), 'table') OPERATOR(pg_catalog.=) 'table'
           AND NOT EXISTS (SELECT FROM rate_limit.key_overrides AS o
                            WHERE o.policy OPERATOR(pg_catalog.=) f.name AND o.key OPERATOR(pg_catalog.=) take.key
                              AND o.set_at OPERATOR(pg_catalog.>=) f.created_at),
           CASE WHEN s.namespace IS NULL THEN f.burst OPERATOR(pg_catalog.*) f.per_us
                WHEN s.algorithm OPERATOR(pg_catalog.=) 'token_bucket' AND s.rate OPERATOR(pg_catalog.=) f.rate
                 AND s.per_us OPERATOR(pg_catalog.=) f.per_us AND s.burst OPERATOR(pg_catalog.=) f.burst
                 AND s.level OPERATOR(pg_catalog.>=) 0 AND s.level OPERATOR(pg_catalog.<=) (f.burst OPERATOR(pg_catalog.*) f.per_us)
                 AND now_ts OPERATOR(pg_catalog.>=) s.updated_at
                THEN rate_limit._tb_refilled(s.level, 0, f.rate, f.burst OPERATOR(pg_catalog.*) f.per_us,
                                             rate_limit._elapsed_us(s.updated_at, now_ts)) END,
           s.ctid, s.xmin
      INTO rate, per_us, burst, simple, current, row_ctid, row_xmin
      FROM rate_limit._fast_policies AS f
      LEFT JOIN rate_limit.bucket_state AS s
        ON s.namespace OPERATOR(pg_catalog.=) f.name AND s.key OPERATOR(pg_catalog.=) take.key
     WHERE f.name OPERATOR(pg_catalog.=) take.policy;
    IF (simple AND current IS NOT NULL AND key IS NOT NULL AND cost OPERATOR(pg_catalog.>=) 1
        AND cost OPERATOR(pg_catalog.<=) burst) IS NOT TRUE THEN
        RETURN rate_limit._take_policy(policy, key, cost);
    END IF;
    after := current OPERATOR(pg_catalog.-) (cost::bigint OPERATOR(pg_catalog.*) per_us);
    IF after OPERATOR(pg_catalog.<) 0 THEN
        -- denied: nothing written
        RETURN ROW(false, current OPERATOR(pg_catalog./) per_us, burst,
                   ((((rate OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.-) after) OPERATOR(pg_catalog./) rate)::double precision
                    OPERATOR(pg_catalog.*) interval '1 microsecond'),
                   (((((burst OPERATOR(pg_catalog.*) per_us) OPERATOR(pg_catalog.-) current) OPERATOR(pg_catalog.+) (rate OPERATOR(pg_catalog.-) 1))
                     OPERATOR(pg_catalog./) rate)::double precision OPERATOR(pg_catalog.*) interval '1 microsecond'),
                   policy, false, NULL)::rate_limit.decision;
    END IF;
    IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'off' THEN
        IF row_ctid IS NOT NULL THEN
            UPDATE rate_limit.bucket_state AS s SET level = after, updated_at = now_ts
             WHERE s.ctid OPERATOR(pg_catalog.=) row_ctid AND s.xmin OPERATOR(pg_catalog.=) row_xmin;
        ELSIF pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 2048 THEN
            INSERT INTO rate_limit.bucket_state AS s (namespace, key, level, updated_at, algorithm, rate, per_us, burst)
            VALUES (policy, key, after, now_ts, 'token_bucket', rate, per_us, burst)
            ON CONFLICT ON CONSTRAINT bucket_state_pkey DO NOTHING;
        END IF;
        IF FOUND THEN
            IF pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) now_ts THEN
                PERFORM rate_limit._rebase_written(policy, key, pg_catalog.clock_timestamp());
            END IF;
            RETURN ROW(true, after OPERATOR(pg_catalog./) per_us, burst, NULL,
                       (((((burst OPERATOR(pg_catalog.*) per_us) OPERATOR(pg_catalog.-) after) OPERATOR(pg_catalog.+) (rate OPERATOR(pg_catalog.-) 1))
                         OPERATOR(pg_catalog./) rate)::double precision OPERATOR(pg_catalog.*) interval '1 microsecond'),
                       policy, false, NULL)::rate_limit.decision;
        END IF;
    END IF;
    RETURN rate_limit._take_policy(policy, key, cost);
END
$$;

-- take's answer as a boolean (docs/reference.md#rate_limitallow). Plain SQL and not SECURITY DEFINER, so
-- that the planner inlines it into the caller's statement: take, which it calls once, runs as the owner.
-- Every name in it is qualified, as the caller's search_path parses it.
CREATE FUNCTION rate_limit.allow(policy pg_catalog.text, key pg_catalog.text, cost integer DEFAULT 1)
RETURNS boolean LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$ SELECT (rate_limit.take(policy, key, cost)).allowed $$;
