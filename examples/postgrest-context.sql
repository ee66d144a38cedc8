-- Limits chosen from the request's context, for PostgREST's db-pre-request hook (see docs/reference.md,
-- "Limits chosen from the request's context"). Run it as the extension's owner, then set
--   db-pre-request = "api.check_rate_limit"
-- in postgrest.conf. tests/clients/context.test.js runs this very file and calls the hook the way PostgREST
-- does: one transaction per request, the settings set for it alone (set_config(..., true)), then the hook.
--
-- Anonymous requests (no "sub" claim) share the policy 'anonymous', keyed by the client's address; a
-- signed-in user gets the policy of the plan in the JWT's "tier" claim, keyed by the user ("sub"). A user
-- with a deal of their own gets a per-key override of their plan's policy, kept as data:
--   SELECT rate_limit.set_override('tier_pro', 'user-42', rate => 6000, burst => 200);
-- GET and HEAD run in read-only transactions in PostgREST: the policies use the memory store.
SELECT rate_limit.create_policy('anonymous', 30, '1 minute', store => 'memory');
SELECT rate_limit.create_policy('tier_free', 60, '1 minute', store => 'memory');
SELECT rate_limit.create_policy('tier_pro', 600, '1 minute', store => 'memory');

CREATE SCHEMA IF NOT EXISTS api;

CREATE OR REPLACE FUNCTION api.check_rate_limit() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  claims jsonb := nullif(current_setting('request.jwt.claims', true), '')::jsonb;
  policy text;
  key text;
  d rate_limit.decision;
BEGIN
  IF claims ->> 'sub' IS NULL THEN
    policy := 'anonymous';
    -- trust this header only if your proxy overwrites it
    key := coalesce(nullif(current_setting('request.headers', true), '')::jsonb ->> 'x-forwarded-for',
                    'unknown');
  ELSE
    -- a known plan's policy, never a name taken from the request as it is
    policy := CASE claims ->> 'tier' WHEN 'pro' THEN 'tier_pro' ELSE 'tier_free' END;
    key := claims ->> 'sub';
  END IF;
  SELECT * INTO d FROM rate_limit.take(policy, key);
  IF NOT d.allowed THEN
    -- PostgREST answers with the status and headers in DETAIL, and the error in MESSAGE
    RAISE SQLSTATE 'PGRST' USING
      MESSAGE = json_build_object('code', 'RL429', 'message', 'Too Many Requests',
                                  'hint', format('Retry in %s seconds.', ceil(extract(epoch FROM d.retry_after))))::text,
      DETAIL = json_build_object('status', 429, 'headers', rate_limit.headers(d, policy))::text;
  END IF;
END $$;
