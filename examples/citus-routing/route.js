// Send each rate_limit call straight to the Citus node that holds its key (Node, node-postgres).
//
//     node route.js "postgresql://app@coordinator:5432/app"     (node-postgres and pg-connection-string)
//
// A KeyRouter asks any node for rate_limit.nodes_of(keys), keeps the answer for MAP_TTL_MS, and runs
// rate_limit.take through a pool of the key's node, where the call runs without Citus's hop. A stale answer
// only costs that hop (the node it reached delegates the call), and a call that waited there for a shard
// move fails with 40001: the router then forgets its map and retries once.
//
// Run as a script, it routes a few keys of a policy it creates and checks that every call reached the node
// that holds its key (the test suite runs it against its Citus cluster).
'use strict';
const { Pool } = require('pg');
const { parse } = require('pg-connection-string');

const MAP_TTL_MS = 30000; // how long an answer of nodes_of is used before it is asked again

class KeyRouter {
  constructor(connectionString) {
    this.config = parse(connectionString); // of any node; host and port are replaced by the key's node's
    this.anyNode = new Pool(this.config);
    this.nodes = new Map(); // key -> { host, port }
    this.askedAt = 0;
    this.pools = new Map(); // "host:port" -> Pool
  }

  // The node of each key, asked in one call for the keys not known yet (or all, when stale).
  async locate(keys) {
    if (Date.now() - this.askedAt > MAP_TTL_MS) {
      this.nodes.clear();
      this.askedAt = Date.now();
    }
    const unknown = keys.filter((k) => !this.nodes.has(k));
    if (unknown.length > 0) {
      const { rows } = await this.anyNode.query('SELECT key, host, port FROM rate_limit.nodes_of($1)', [unknown]);
      for (const r of rows) this.nodes.set(r.key, { host: r.host, port: r.port });
    }
    return keys.map((k) => this.nodes.get(k));
  }

  pool(node) {
    const name = `${node.host}:${node.port}`;
    if (!this.pools.has(name)) {
      this.pools.set(name, new Pool({ ...this.config, host: node.host, port: node.port }));
    }
    return this.pools.get(name);
  }

  // rate_limit.take on the key's node: { allowed, remaining }.
  async take(policy, key, cost = 1) {
    for (let attempt = 0; ; attempt++) {
      const [node] = await this.locate([key]);
      try {
        const { rows } = await this.pool(node).query(
          'SELECT allowed, remaining FROM rate_limit.take($1, $2, $3)', [policy, key, cost]);
        return rows[0];
      } catch (e) {
        if (e.code !== '40001' || attempt === 1) throw e;
        this.nodes.clear(); // the key's shard moved: ask again, and retry once
      }
    }
  }

  async end() {
    await this.anyNode.end();
    for (const p of this.pools.values()) await p.end();
  }
}

async function selfCheck(connectionString) {
  const router = new KeyRouter(connectionString);
  const assert = require('node:assert/strict');
  const policy = `routed_js_${Date.now()}`;
  try {
    await router.anyNode.query("SELECT rate_limit.create_policy($1, 5, '1 minute')", [policy]);
    const keys = Array.from({ length: 40 }, (_, i) => `user${i}`);
    const nodes = await router.locate(keys);
    for (let i = 0; i < keys.length; i++) {
      const d = await router.take(policy, keys[i]);
      assert.equal(d.allowed, true);
      assert.equal(d.remaining, '4');
      // the pool reached the node nodes_of named: the one whose group holds the key's shard
      const { rows } = await router.pool(nodes[i]).query(
        'SELECT n.nodename AS host, n.nodeport AS port FROM pg_dist_node n JOIN pg_dist_local_group l USING (groupid)');
      assert.deepEqual(rows[0], nodes[i]);
    }
    await router.anyNode.query('SELECT rate_limit.drop_policy($1)', [policy]);
    console.log(`routed ${keys.length} keys to ${router.pools.size} nodes`);
  } finally {
    await router.end();
  }
}

module.exports = { KeyRouter };
if (require.main === module) {
  selfCheck(process.argv[2]).catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
