\set id random(1, 100000)
SELECT name FROM bench_accounts WHERE id = :id;
