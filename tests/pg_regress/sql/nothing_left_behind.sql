-- Every example before this one leaves nothing behind: what it writes in the table store is rolled back
-- (or dropped), and what it takes in the memory store, which is not transactional, is reset by hand. So
-- an example may use any policy or key name, and run in any order.
SELECT count(*) AS policies FROM rate_limit.policies;
SELECT count(*) FILTER (WHERE store = 'table') AS table_buckets,
       count(*) FILTER (WHERE store = 'memory') AS memory_buckets
FROM rate_limit.buckets;
