// Limits chosen from the request's context: examples/postgrest-context.sql installed as it is shipped, then
// its pre-request hook called the way PostgREST calls it, from node-postgres: one transaction per request,
// the request's role and settings set for that transaction alone (set_config(..., true), as a pooler in
// transaction mode needs), then the hook, whose PGRST error carries the 429 status and the RateLimit
// headers. Each plan's policy grants exactly its burst, a user's override applies, anonymous clients are
// limited by address, and a denial is answered with Retry-After.
//
// Run: RATE_LIMIT_TEST_CONNINFO='host=... port=... user=postgres' node --test tests/clients/
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { Client } = require('pg');

function config(database) {
  const conninfo = process.env.RATE_LIMIT_TEST_CONNINFO;
  if (!conninfo) throw new Error('RATE_LIMIT_TEST_CONNINFO is not set: run through scripts/test.sh');
  const c = Object.fromEntries(conninfo.split(/\s+/).filter(Boolean).map((kv) => kv.split('=')));
  return { host: c.host, port: Number(c.port), user: c.user, database };
}

// One request as PostgREST makes it: its role and settings for this transaction only, then the hook.
// Resolves to null when the request may proceed, or to the error PostgREST would turn into a response.
async function request(db, { role, claims, headers, method }) {
  await db.query(method === 'GET' ? 'BEGIN READ ONLY' : 'BEGIN');
  try {
    await db.query(
      `SELECT set_config('role', $1, true), set_config('request.jwt.claims', $2, true),
              set_config('request.headers', $3, true), set_config('request.method', $4, true)`,
      [role, JSON.stringify(claims || {}), JSON.stringify(headers || {}), method]);
    await db.query('SELECT api.check_rate_limit()');
    await db.query('COMMIT');
    return null;
  } catch (e) {
    await db.query('ROLLBACK');
    return e;
  }
}

test('the pre-request hook picks the policy from the request and answers 429 with its headers', async () => {
  const admin = new Client(config('postgres'));
  await admin.connect();
  await admin.query('DROP DATABASE IF EXISTS rl_js_context WITH (FORCE)');
  await admin.query('CREATE DATABASE rl_js_context');
  for (const role of ['rl_js_anon', 'rl_js_authenticated']) {
    await admin.query(`DO $$ BEGIN CREATE ROLE ${role} NOLOGIN; EXCEPTION WHEN duplicate_object THEN END $$`);
  }
  const db = new Client(config('rl_js_context'));
  await db.connect();
  try {
    await db.query('CREATE EXTENSION rate_limit');
    // the example as shipped, then numbers small enough to count
    await db.query(fs.readFileSync(path.join(__dirname, '..', '..', 'examples', 'postgrest-context.sql'), 'utf8'));
    await db.query(`SELECT rate_limit.alter_policy('anonymous', rate => 2, burst => 2);
                    SELECT rate_limit.alter_policy('tier_free', rate => 3, burst => 3);
                    SELECT rate_limit.alter_policy('tier_pro', rate => 5, burst => 5);
                    SELECT rate_limit.set_override('tier_pro', 'user-partner', burst => 8);
                    GRANT USAGE ON SCHEMA api TO rl_js_anon, rl_js_authenticated`);

    const allowed = async (req, n) => {
      let granted = 0;
      let last = null;
      for (let i = 0; i < n; i++) {
        const e = await request(db, req);
        if (e === null) granted++;
        else last = e;
      }
      return { granted, last };
    };
    const user = (sub, tier) => ({ role: 'rl_js_authenticated', claims: { sub, tier, role: 'rl_js_authenticated' } });

    assert.equal((await allowed({ ...user('user-1', 'free'), method: 'GET' }, 6)).granted, 3);
    assert.equal((await allowed({ ...user('user-2', 'pro'), method: 'POST' }, 8)).granted, 5);
    // no tier claim: the free plan; an unknown one: the free plan too, never a policy named by the client
    assert.equal((await allowed({ ...user('user-3'), method: 'GET' }, 5)).granted, 3);
    assert.equal((await allowed({ ...user('user-4', 'platinum'), method: 'GET' }, 5)).granted, 3);
    // a user with a deal of their own: an override of their plan's policy
    assert.equal((await allowed({ ...user('user-partner', 'pro'), method: 'GET' }, 10)).granted, 8);
    // anonymous requests: limited per address
    const anon = (ip) => ({ role: 'rl_js_anon', headers: { 'x-forwarded-for': ip }, method: 'GET' });
    assert.equal((await allowed(anon('203.0.113.7'), 4)).granted, 2);
    const { granted, last } = await allowed(anon('198.51.100.2'), 3);
    assert.equal(granted, 2);

    // the denial as PostgREST reads it: SQLSTATE PGRST, the body in MESSAGE, status and headers in DETAIL
    assert.equal(last.code, 'PGRST');
    const body = JSON.parse(last.message);
    assert.equal(body.code, 'RL429');
    assert.match(body.hint, /^Retry in \d+ seconds\.$/);
    const detail = JSON.parse(last.detail);
    assert.equal(detail.status, 429);
    assert.match(detail.headers['Retry-After'], /^\d+$/);
    assert.match(detail.headers.RateLimit, /^"anonymous";r=0;t=\d+$/);
    assert.equal(detail.headers['RateLimit-Policy'], '"anonymous";q=2;w=60');

    // the settings were the transaction's own: nothing is left for the pooler's next client
    const left = await db.query(`SELECT current_user AS who, current_setting('request.jwt.claims', true) AS claims`);
    assert.equal(left.rows[0].who, 'postgres');
    assert.ok(!left.rows[0].claims);
  } finally {
    await db.end();
    await admin.query('DROP DATABASE IF EXISTS rl_js_context WITH (FORCE)');
    await admin.end();
  }
});
