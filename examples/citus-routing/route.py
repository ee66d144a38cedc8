#!/usr/bin/env python3
"""Send each rate_limit call straight to the Citus node that holds its key (Python, psycopg2).

    python3 route.py "host=coordinator port=5432 dbname=app user=app"

A KeyRouter asks any node for rate_limit.nodes_of(keys), keeps the answer for MAP_TTL seconds, and runs
rate_limit.take on a connection to the key's node, where the call runs without Citus's hop. A stale
answer only costs that hop (the node it reached delegates the call), and a call that waited there for a
shard move fails with 40001: the router then forgets its map and retries once.

Run as a script, it routes a few keys of a policy it creates and checks that every call reached the node
that holds its key (the test suite runs it against its Citus cluster).
"""
import sys
import time

import psycopg2
import psycopg2.errors

MAP_TTL = 30.0  # seconds an answer of nodes_of is used before it is asked again


class KeyRouter:
    def __init__(self, conninfo):
        self.conninfo = conninfo  # of any node; host and port are replaced by the key's node's
        self.any_node = psycopg2.connect(conninfo)
        self.any_node.autocommit = True
        self.nodes = {}  # key -> (host, port)
        self.asked_at = 0.0
        self.connections = {}  # (host, port) -> connection

    def locate(self, keys):
        """The node of each key, asked in one call for the keys not known yet (or all, when stale)."""
        if time.monotonic() - self.asked_at > MAP_TTL:
            self.nodes.clear()
            self.asked_at = time.monotonic()
        unknown = [k for k in keys if k not in self.nodes]
        if unknown:
            with self.any_node.cursor() as c:
                c.execute("SELECT key, host, port FROM rate_limit.nodes_of(%s)", (unknown,))
                for key, host, port in c.fetchall():
                    self.nodes[key] = (host, port)
        return [self.nodes[k] for k in keys]

    def connection(self, node):
        if node not in self.connections:
            host, port = node
            conn = psycopg2.connect(self.conninfo, host=host, port=port)
            conn.autocommit = True
            self.connections[node] = conn
        return self.connections[node]

    def take(self, policy, key, cost=1):
        """rate_limit.take on the key's node: (allowed, remaining)."""
        for attempt in range(2):
            (node,) = self.locate([key])
            try:
                with self.connection(node).cursor() as c:
                    c.execute("SELECT allowed, remaining FROM rate_limit.take(%s, %s, %s)",
                              (policy, key, cost))
                    return c.fetchone()
            except psycopg2.errors.SerializationFailure:
                if attempt == 1:
                    raise
                self.nodes.clear()  # the key's shard moved: ask again, and retry once


def self_check(conninfo):
    router = KeyRouter(conninfo)
    policy = "routed_py_%d" % int(time.time() * 1000)
    with router.any_node.cursor() as c:
        c.execute("SELECT rate_limit.create_policy(%s, 5, '1 minute')", (policy,))
    keys = ["user%d" % i for i in range(40)]
    for key, node in zip(keys, router.locate(keys)):
        allowed, remaining = router.take(policy, key)
        assert allowed and remaining == 4, (key, allowed, remaining)
        # the connection reached the node nodes_of named: the one whose group holds the key's shard
        with router.connection(node).cursor() as c:
            c.execute("SELECT n.nodename, n.nodeport FROM pg_dist_node n "
                      "JOIN pg_dist_local_group l USING (groupid)")
            assert c.fetchone() == node, (key, node)
    with router.any_node.cursor() as c:
        c.execute("SELECT rate_limit.drop_policy(%s)", (policy,))
    print("routed %d keys to %d nodes" % (len(keys), len(router.connections)))


if __name__ == "__main__":
    self_check(sys.argv[1])
