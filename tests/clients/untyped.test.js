// Every public function of rate_limit called from node-postgres, which sends every $n parameter as text
// with type "unknown" and arrays as '{...}' literals, as asyncpg-style and many other drivers do too.
// PostgreSQL must resolve each call to exactly one function (no 42725 "function is not unique"), and the
// results must be right, arrays included.
//
// Run: RATE_LIMIT_TEST_CONNINFO='host=... port=... user=postgres' node --test tests/clients/
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { Client } = require('pg');

function config(database) {
  const conninfo = process.env.RATE_LIMIT_TEST_CONNINFO;
  if (!conninfo) throw new Error('RATE_LIMIT_TEST_CONNINFO is not set: run through scripts/test.sh');
  const c = Object.fromEntries(conninfo.split(/\s+/).filter(Boolean).map((kv) => kv.split('=')));
  return { host: c.host, port: Number(c.port), user: c.user, database };
}

test('every public function accepts untyped parameters', async () => {
  const admin = new Client(config('postgres'));
  await admin.connect();
  await admin.query('DROP DATABASE IF EXISTS rl_js_untyped WITH (FORCE)');
  await admin.query('CREATE DATABASE rl_js_untyped');
  const db = new Client(config('rl_js_untyped'));
  await db.connect();
  try {
    await db.query('CREATE EXTENSION rate_limit');
    const one = async (sql, params) => (await db.query(sql, params)).rows[0];

    await one('SELECT rate_limit.create_policy($1, $2, $3, $4)', ['api', 10, '1 minute', 5]);
    await one('SELECT rate_limit.create_policy($1, $2, $3, $4, $5, $6)',
      ['org', 100, '1 minute', 100, 'token_bucket', null]);
    await one('SELECT rate_limit.alter_policy($1, $2)', ['org', 50]);
    // policy options: an untyped text parameter read as jsonb, by name
    await one('SELECT rate_limit.alter_policy($1, options => $2)',
      ['org', JSON.stringify({ description: 'per organisation' })]);
    assert.equal((await one('SELECT description FROM rate_limit.policies WHERE name = $1', ['org'])).description,
      'per organisation');

    assert.equal((await one('SELECT rate_limiting_request($1, $2, $3) AS r', ['u', 1, 10])).r, 9);
    assert.equal((await one('SELECT rate_limiting_request($1, $2) AS r', ['u2', 1])).r, 59);
    assert.equal((await one('SELECT rate_limiting_request($1) AS r', ['u3'])).r, 119);
    assert.equal((await one('SELECT rate_limit.peek_request($1, $2, $3) AS r', ['u', 1, 10])).r, '9');
    assert.equal((await one('SELECT rate_limit.tokens($1, $2, $3) >= 9 AS r', ['u', 1, 10])).r, true);

    let d = await one('SELECT * FROM rate_limit.take($1, $2, $3)', ['api', 'alice', 2]);
    assert.deepEqual([d.allowed, d.remaining, d.limit, d.policy], [true, '3', '5', 'api']);
    d = await one('SELECT * FROM rate_limit.take($1, $2)', ['api', 'alice']);
    assert.deepEqual([d.allowed, d.remaining], [true, '2']);
    d = await one('SELECT * FROM rate_limit.peek($1, $2)', ['api', 'alice']);
    assert.deepEqual([d.allowed, d.remaining], [true, '2']);

    // the boolean answer, as an application's WHERE uses it: 5 tokens, then one call in three rows
    assert.equal((await one('SELECT rate_limit.allow($1, $2, $3) AS r', ['api', 'frank', 4])).r, true);
    assert.equal((await one(
      'SELECT count(*)::int AS n FROM (VALUES (1), (2), (3)) AS v(i) WHERE rate_limit.allow($1, $2)',
      ['api', 'frank'])).n, 1);
    assert.equal((await one('SELECT rate_limit.allow($1, $2) AS r', ['api', 'frank'])).r, false);

    // arrays as parameters: one key for every policy, or one key per policy
    d = await one('SELECT * FROM rate_limit.take_many($1, $2)', [['api', 'org'], ['alice']]);
    assert.deepEqual([d.allowed, d.remaining, d.policy], [true, '1', 'api']);
    d = await one('SELECT * FROM rate_limit.take_many($1, $2, $3)', [['api', 'org'], ['bob', 'acme'], 3]);
    assert.deepEqual([d.allowed, d.remaining, d.policy], [true, '2', 'api']);
    d = await one('SELECT * FROM rate_limit.take_many($1, $2, $3)', [['api', 'org'], ['alice'], 5]);
    assert.deepEqual([d.allowed, d.policy], [false, 'api']);

    // a batch: untyped arrays of keys and costs, one row per key in the order given
    let rows = (await db.query('SELECT ordinality, key, allowed, remaining FROM rate_limit.take_batch($1, $2, $3)',
      ['api', ['dora', 'erin', 'dora'], [2, 1, 4]])).rows;
    assert.deepEqual(rows.map((r) => [r.ordinality, r.key, r.allowed, r.remaining]),
      [[1, 'dora', true, '3'], [2, 'erin', true, '4'], [3, 'dora', false, '3']]);
    rows = (await db.query('SELECT allowed, remaining FROM rate_limit.take_batch($1, $2, $3, $4)',
      ['api', ['fay', 'gil'], null, true])).rows;
    assert.deepEqual(rows.map((r) => [r.allowed, r.remaining]), [[true, '4'], [true, '4']]);

    d = await one('SELECT * FROM rate_limit.take_ad_hoc($1, $2, $3)', ['k', 3, '1 hour']);
    assert.deepEqual([d.allowed, d.remaining, d.limit, d.policy], [true, '2', '3', null]);
    d = await one('SELECT * FROM rate_limit.take_ad_hoc($1, $2, $3, $4, $5)', ['k2', 3, '1 hour', 10, 4]);
    assert.deepEqual([d.allowed, d.remaining, d.limit], [true, '6', '10']);

    d = await one('SELECT * FROM rate_limit.wait($1, $2, $3, $4)', ['api', 'carol', 1, '1 second']);
    assert.equal(d.allowed, true);
    d = await one('SELECT * FROM rate_limit.wait($1, $2)', ['api', 'carol']);
    assert.equal(d.allowed, true);
    d = await one('SELECT * FROM rate_limit.refund($1, $2, $3)', ['api', 'carol', 1]);
    assert.deepEqual([d.allowed, d.remaining], [true, '4']);

    const h = await one('SELECT rate_limit.headers(d) AS h FROM rate_limit.take($1, $2) AS d', ['api', 'dave']);
    assert.equal(h.h.RateLimit, '"api";r=4;t=6');
    const h2 = await one('SELECT rate_limit.headers(d, $1) AS h FROM rate_limit.take($1, $2) AS d',
      ['api', 'erin']);
    assert.match(h2.h['RateLimit-Policy'], /^"api";q=5;w=30$/);

    assert.equal((await one('SELECT rate_limit.reset($1, $2) AS r', ['api', 'alice'])).r, true);
    assert.equal((await one('SELECT rate_limit.reset_ad_hoc($1) AS r', ['k'])).r, true);
    assert.equal((await one('SELECT rate_limit.reset_request($1) AS r', ['u'])).r, true);
    assert.equal(typeof (await one('SELECT rate_limit.purge() AS r', [])).r, 'string');
    // a procedure that commits between its transactions, through the extended protocol
    assert.equal((await db.query('CALL rate_limit.purge_idle($1)', ['1 second'])).command, 'CALL');
    assert.equal((await one('SELECT slot_bytes FROM rate_limit.memory_usage()', [])).slot_bytes, '96');
    await one('SET rate_limit.store = memory', []);
    assert.equal((await one('SELECT rate_limiting_request($1, $2, $3) AS r', ['m', 1, 10])).r, 9);
    d = await one('SELECT * FROM rate_limit.take_ad_hoc($1, $2, $3)', ['mk', 2, '1 hour']);
    assert.deepEqual([d.allowed, d.remaining], [true, '1']);
    await one('RESET rate_limit.store', []);

    // charges, leases, blocks and the clock shift, with untyped parameters too (named ones included)
    await one('SELECT rate_limit.create_policy($1, $2, $3, max_debt => $4)', ['llm', 10, '1 minute', 100]);
    d = await one('SELECT * FROM rate_limit.charge($1, $2, $3)', ['llm', 'alice', 25]);
    assert.deepEqual([d.allowed, d.remaining], [true, '0']);
    await one('SELECT rate_limit.create_policy($1, $2, $3, algorithm => $4)',
      ['jobs', 2, '1 minute', 'concurrency']);
    d = await one('SELECT * FROM rate_limit.acquire($1, $2)', ['jobs', 'alice']);
    assert.deepEqual([d.allowed, d.remaining], [true, '1']);
    assert.equal((await one('SELECT rate_limit.release($1, $2, $3) AS r', ['jobs', 'alice', d.lease])).r, true);
    assert.equal((await one('SELECT rate_limit.release($1, $2, $3) AS r', ['jobs', 'alice', d.lease])).r, false);
    // an adaptive policy: the options and the release's report, all untyped
    await one('SELECT rate_limit.create_policy($1, $2, $3, algorithm => $4, options => $5)',
      ['calls', 4, '1 minute', 'concurrency', '{"latency_target": "100 ms", "adaptive_min": 2}']);
    d = await one('SELECT * FROM rate_limit.acquire($1, $2)', ['calls', 'alice']);
    assert.equal((await one('SELECT rate_limit.release($1, $2, $3, $4, $5) AS r',
      ['calls', 'alice', d.lease, 'dropped', '250 ms'])).r, true);
    d = await one('SELECT * FROM rate_limit.acquire($1, $2)', ['calls', 'alice']);
    assert.deepEqual([d.allowed, d.remaining], [true, '2']);
    assert.equal((await one('SELECT rate_limit.release($1, $2, $3, outcome => $4, latency => $5) AS r',
      ['calls', 'alice', d.lease, 'ok', null])).r, true);
    // a reservation: its id comes back as a string (bigint), and goes back untyped
    d = await one('SELECT * FROM rate_limit.reserve($1, $2, $3, $4)', ['llm', 'bob', 8, '1 minute']);
    assert.deepEqual([d.allowed, d.remaining], [true, '2']);
    let s = await one('SELECT * FROM rate_limit.settle($1, $2, $3, $4)', ['llm', 'bob', d.lease, 3]);
    assert.deepEqual([s.allowed, s.remaining, s.lease], [true, '7', d.lease]);
    s = await one('SELECT * FROM rate_limit.settle($1, $2, $3, $4)', ['llm', 'bob', d.lease, 3]);
    assert.deepEqual([s.allowed, s.remaining], [false, '7']);
    // weighted meters: the options, the amounts of a reserve and a settle, all untyped JSON text
    await one('SELECT rate_limit.create_policy($1, $2, $3, options => $4)',
      ['gateway', 1000, '1 day', '{"meters": {"input": 0.2, "output": 1}}']);
    d = await one('SELECT * FROM rate_limit.reserve($1, $2, amounts => $3)',
      ['gateway', 'bob', '{"input": 1000, "output": 300}']);
    assert.deepEqual([d.allowed, d.remaining], [true, '500']);
    s = await one('SELECT * FROM rate_limit.settle($1, $2, $3, amounts => $4)',
      ['gateway', 'bob', d.lease, JSON.stringify({input: 7, output: 10})]);
    assert.deepEqual([s.allowed, s.remaining], [true, '988']);
    d = await one('SELECT * FROM rate_limit.reserve($1, $2, $3, $4, $5)', ['gateway', 'bob', null, '1 minute', '{"output": 8}']);
    assert.deepEqual([d.allowed, d.remaining], [true, '980']);
    // a reservation over two policies: arrays of names and estimates untyped, one id for both
    d = await one('SELECT * FROM rate_limit.reserve_many($1, $2, $3)', [['llm', 'gateway'], 'dave', [2, 50]]);
    assert.deepEqual([d.allowed, d.policy, d.remaining], [true, 'llm', '8']);
    s = await one('SELECT * FROM rate_limit.settle_many($1, $2, $3, $4)', [['llm', 'gateway'], 'dave', d.lease, [1, 20]]);
    assert.deepEqual([s.allowed, s.policy, s.remaining, s.lease], [true, 'llm', '9', d.lease]);
    assert.equal((await one('SELECT remaining FROM rate_limit.peek($1, $2)', ['gateway', 'dave'])).remaining, '980');
    s = await one('SELECT * FROM rate_limit.settle_many($1, $2, $3, actuals => $4)', [['llm', 'gateway'], 'dave', d.lease, [0]]);
    assert.equal(s.allowed, false);
    // a booking: the burst now (no id), then one a minute apart with its id, cancelled untyped
    await one('SELECT rate_limit.create_policy($1, $2, $3, burst => $4, max_debt => $5)',
      ['exports', 1, '1 minute', 1, 5]);
    d = await one('SELECT *, retry_after = $3 AS at_once FROM rate_limit.book($1, $2)', ['exports', 'carol', '0']);
    assert.deepEqual([d.allowed, d.at_once, d.lease], [true, true, null]);
    d = await one('SELECT *, retry_after > $3 AS later FROM rate_limit.book($1, $2, max_delay => $4)',
      ['exports', 'carol', '55 seconds', '1 hour']);
    assert.deepEqual([d.allowed, d.later, d.lease !== null], [true, true, true]);
    s = await one('SELECT * FROM rate_limit.cancel_booking($1, $2, $3)', ['exports', 'carol', d.lease]);
    assert.deepEqual([s.allowed, s.lease], [true, d.lease]);
    s = await one('SELECT * FROM rate_limit.cancel_booking($1, $2, $3)', ['exports', 'carol', d.lease]);
    assert.equal(s.allowed, false);
    d = await one('SELECT * FROM rate_limit.block($1, $2, $3)', ['api', 'mallory', '1 hour']);
    assert.equal(d.allowed, false);
    d = await one('SELECT * FROM rate_limit.take($1, $2)', ['api', 'mallory']);
    assert.deepEqual([d.allowed, d.remaining], [false, '0']);
    assert.equal((await one('SELECT rate_limit.unblock($1, $2) AS r', ['api', 'mallory'])).r, true);
    d = await one('SELECT * FROM rate_limit.take($1, $2)', ['api', 'mallory']);
    assert.equal(d.allowed, true);
    assert.equal((await one('SELECT rate_limit.clock_shift() = $1 AS r', ['0 seconds'])).r, true);

    // per-key overrides, with untyped parameters (named ones included)
    await one('SELECT rate_limit.set_override($1, $2, burst => $3)', ['api', 'partner', 7]);
    d = await one('SELECT * FROM rate_limit.take($1, $2)', ['api', 'partner']);
    assert.deepEqual([d.allowed, d.limit], [true, '7']);
    await one('SELECT rate_limit.set_override($1, $2, action => $3, until => $4, note => $5)',
      ['api', 'abuser', 'deny', '2999-01-01 00:00:00+00', 'ticket 42']);
    d = await one('SELECT * FROM rate_limit.take($1, $2)', ['api', 'abuser']);
    assert.equal(d.allowed, false);
    assert.equal((await one('SELECT rate_limit.clear_override($1, $2) AS r', ['api', 'abuser'])).r, true);
    d = await one('SELECT * FROM rate_limit.take($1, $2)', ['api', 'abuser']);
    assert.equal(d.allowed, true);

    // the operator's functions: shares, statistics and this node's own rows (no Citus here)
    const shares = await one('SELECT buckets FROM rate_limit.memory_shares() WHERE database = $1',
      ['rl_js_untyped']);
    assert.equal(shares.buckets, '2');
    const stats = await one('SELECT count(*) AS n FROM rate_limit.node_stats_rows() WHERE policy = $1', ['api']);
    assert.equal(stats.n, '1');
    const top = await one('SELECT count(*) AS n FROM rate_limit.node_top_limited_rows() WHERE key = $1',
      ['mallory']);
    assert.equal(top.n, '1');
    const mine = await one('SELECT count(*) AS n FROM rate_limit.node_memory_buckets() WHERE key = $1', ['mk']);
    assert.equal(mine.n, '1');
    await one('SELECT rate_limit.reset_stats($1)', ['api']);
    assert.equal((await one('SELECT coalesce(sum(calls), 0) AS n FROM rate_limit.stats WHERE policy = $1',
      ['api'])).n, '0');
    await one('SELECT rate_limit.reset_stats()', []);
    // distribute resolves with an untyped shard count, and says there is no Citus here
    await assert.rejects(one('SELECT * FROM rate_limit.distribute($1)', [4]), { code: '0A000' });
    // nodes_of resolves with an untyped array of keys, and says there is nothing distributed to locate
    await assert.rejects(one('SELECT * FROM rate_limit.nodes_of($1)', [['k1', 'k2']]), { code: '0A000' });
    assert.equal((await one('SELECT rate_limit.drop_policy($1) AS r', ['org'])).r, true);
  } finally {
    await db.end();
    await admin.query('DROP DATABASE IF EXISTS rl_js_untyped WITH (FORCE)');
    await admin.end();
  }
});
