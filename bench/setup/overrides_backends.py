"""What per-key overrides cost backends, measured against a running bench server (bench/run.sh overrides).

  backends.py memory CONNINFO POLICY N KEYS
      N backends each take KEYS random keys of POLICY and stay connected; prints the sum of their private
      memory (Private_Clean + Private_Dirty of /proc/PID/smaps_rollup, in kB: what each backend holds for
      itself, not the shared buffers it touched) and each one's.
  backends.py change CONNINFO POLICY N ROUNDS
      N backends warmed on POLICY; each round: every backend takes once (its usual cost), the owner commits
      one override change, every backend takes once more; prints, per round, the sum over the backends of
      the second take's time less the first's (µs): what one change cost the others.

Debian's Python with psycopg2 (python3-psycopg2), run as root (it reads the backends' /proc entries).
"""
import random
import statistics
import sys
import time

import psycopg2


def connect(conninfo, n):
    conns = [psycopg2.connect(conninfo) for _ in range(n)]
    for c in conns:
        c.autocommit = True
    return conns


def pid_of(c):
    with c.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return cur.fetchone()[0]


def take(c, policy, key):
    with c.cursor() as cur:
        cur.execute("SELECT allowed FROM rate_limit.take(%s, %s)", (policy, key))
        cur.fetchone()


def private_kb(pid):
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


def memory(conninfo, policy, n, keys):
    conns = connect(conninfo, n)
    rng = random.Random(7)
    for c in conns:
        for _ in range(keys):
            take(c, policy, f"key{rng.randint(1, 1_000_000)}")
    per = [private_kb(pid_of(c)) for c in conns]
    print(sum(per), statistics.median(per), min(per), max(per))


def change(conninfo, policy, n, rounds):
    conns = connect(conninfo, n)
    owner = psycopg2.connect(conninfo)
    owner.autocommit = True
    rng = random.Random(11)
    for c in conns:
        for _ in range(10):
            take(c, policy, f"key{rng.randint(1, 1_000_000)}")

    def timed(c):
        key = f"key{rng.randint(1, 1_000_000)}"
        started = time.perf_counter()
        take(c, policy, key)
        return time.perf_counter() - started

    for r in range(rounds):
        before = [timed(c) for c in conns]
        with owner.cursor() as cur:
            cur.execute(
                "SELECT rate_limit.set_override(%s, %s, burst => 2000000)",
                (policy, f"changed{r}"),
            )
        after = [timed(c) for c in conns]
        print(round(sum(a - b for a, b in zip(after, before)) * 1e6))


if __name__ == "__main__":
    what, conninfo, policy, n, m = sys.argv[1:6]
    {"memory": memory, "change": change}[what](conninfo, policy, int(n), int(m))
