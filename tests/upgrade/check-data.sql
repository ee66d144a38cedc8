-- After ALTER EXTENSION rate_limit UPDATE: every policy and every table-store bucket is still there, with
-- the same numbers, and the API reports the same tokens; policies get 0.4.0's settings at their defaults
-- (enforced, no debt, no calendar). Fails (ON_ERROR_STOP) on the first difference.
DO $$
DECLARE
    missing bigint;
    extra bigint;
    r record;
BEGIN
    SELECT count(*) INTO missing FROM (SELECT * FROM public.expected_policies
                                       EXCEPT SELECT name, algorithm, rate, per, burst, store, created_at,
                                                     changed_at FROM rate_limit.policies) AS d;
    SELECT count(*) INTO extra FROM (SELECT name, algorithm, rate, per, burst, store, created_at, changed_at
                                     FROM rate_limit.policies
                                     EXCEPT SELECT * FROM public.expected_policies) AS d;
    IF missing <> 0 OR extra <> 0 THEN
        RAISE EXCEPTION 'policies changed by the upgrade: % missing, % unexpected', missing, extra;
    END IF;
    IF EXISTS (SELECT FROM rate_limit.policies WHERE shadow OR max_debt <> 0) THEN
        RAISE EXCEPTION 'an upgraded policy is in shadow mode or allows debt';
    END IF;
    IF EXISTS (SELECT FROM rate_limit.policies WHERE time_zone IS NOT NULL OR anchor IS NOT NULL) THEN
        RAISE EXCEPTION 'an upgraded policy has a calendar';
    END IF;
    SELECT count(*) INTO missing FROM (SELECT * FROM public.expected_buckets
                                       EXCEPT SELECT * FROM rate_limit.bucket_state) AS d;
    SELECT count(*) INTO extra FROM (SELECT * FROM rate_limit.bucket_state
                                     EXCEPT SELECT * FROM public.expected_buckets) AS d;
    IF missing <> 0 OR extra <> 0 OR (SELECT count(*) FROM public.expected_buckets) <> 4 THEN
        RAISE EXCEPTION 'buckets changed by the upgrade: % missing, % unexpected', missing, extra;
    END IF;
    FOR r IN SELECT e.policy, e.key, e.remaining, (rate_limit.peek(e.policy, e.key)).remaining AS now
             FROM public.expected_remaining AS e LOOP
        IF r.now IS DISTINCT FROM r.remaining THEN
            RAISE EXCEPTION 'peek(%, %) = % after the upgrade, expected %', r.policy, r.key, r.now, r.remaining;
        END IF;
    END LOOP;
    IF (SELECT floor(tokens) FROM rate_limit.buckets WHERE kind = 'ad_hoc' AND key = 'adhoc-key') <> 4 THEN
        RAISE EXCEPTION 'the ad-hoc bucket lost its level in the upgrade';
    END IF;
END
$$;
SELECT 'data kept' AS upgrade;
