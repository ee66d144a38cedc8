-- Adaptive concurrency (create_policy / alter_policy options latency_target and adaptive_min): a
-- concurrency policy with a latency target adapts each key's limit between adaptive_min and its rate.
-- Before 003-metrics.sql, whose rate_limit.adaptive_limits_rows reads the new columns.
ALTER TABLE rate_limit.policies
    ADD COLUMN adaptive_min bigint CHECK (adaptive_min >= 1),
    ADD COLUMN latency_target interval CHECK (latency_target > interval '0');
