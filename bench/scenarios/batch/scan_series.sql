SELECT count(*) FILTER (WHERE k IS NOT NULL) FROM generate_series(1, 100000) g, LATERAL (SELECT 'key' || g AS k) s;
