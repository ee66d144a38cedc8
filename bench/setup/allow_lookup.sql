-- The application's table that rate_limit.allow and take are joined into (a primary-key lookup), and
-- bench_lookup_us(kind, n): n lookups of one backend in a PL/pgSQL loop, each statement its own executor
-- run as a client's is; returns the microseconds per lookup. Every kind builds the key text the same way
-- before its statement (an application has its key already: building 'key' || k inside the statement,
-- an integer's output function and a concatenation set up again for every statement, would be counted
-- as the limit's), so the difference between two kinds is the limiter's call alone.
CREATE TABLE bench_docs (id integer PRIMARY KEY, owner text NOT NULL, body text NOT NULL);
INSERT INTO bench_docs SELECT g, 'key' || g, repeat('x', 200) FROM generate_series(1, 100000) AS g;
VACUUM ANALYZE bench_docs;

CREATE FUNCTION bench_lookup_us(kind text, n int) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
  b text;
  k int;
  key text;
BEGIN
  FOR i IN 1..n LOOP
    k := (i * 7919) % 100000 + 1;
    key := 'key' || k;
    IF kind = 'lookup' THEN
      SELECT d.body INTO b FROM bench_docs AS d WHERE d.id = k;
    ELSIF kind = 'lookup_allow' THEN
      SELECT d.body INTO b FROM bench_docs AS d WHERE d.id = k AND rate_limit.allow('bench', key);
    ELSE
      SELECT d.body INTO b FROM bench_docs AS d, rate_limit.take('bench', key) AS t
      WHERE d.id = k AND t.allowed;
    END IF;
  END LOOP;
  RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;

-- a role with a login and nothing else, as an application's: allowed to read the table only
CREATE ROLE bench_app LOGIN;
GRANT SELECT ON bench_docs TO bench_app;
