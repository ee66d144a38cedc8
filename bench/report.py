#!/usr/bin/env python3
"""Turns bench/out/raw.tsv (one line per pgbench round) into bench/RESULTS.md on stdout."""
import platform
import statistics
import subprocess
import sys
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

raw_path, usage_path, command = sys.argv[1], sys.argv[2], sys.argv[3]
tps = defaultdict(list)
retries = defaultdict(int)
committed = defaultdict(int)
for line in open(raw_path):
    scenario, clients, sync, iso, t, r, c = line.rstrip("\n").split("\t")
    key = (scenario, int(clients), sync, iso)
    tps[key].append(float(t))
    retries[key] += int(r)
    committed[key] += int(c)

RC, SER = "read committed", "serializable"


def med(scenario, clients, sync="on", iso=RC):
    values = tps.get((scenario, clients, sync, iso))
    return statistics.median(values) if values else float("nan")


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def pg_version():
    try:
        return subprocess.run(["/usr/lib/postgresql/15/bin/postgres", "--version"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return "PostgreSQL 15"


clients_list = sorted({k[1] for k in tps})
out = []
w = out.append
w("# Benchmark results\n")
w(f"- command: `{command}` (pgbench -M prepared, median TPS of 3 rounds per figure)")
w(f"- machine: {cpu_model()}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores; "
  f"{pg_version()}; fsync on, shared_buffers 256MB, data on local disk")
w(f"- date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
w("- baseline: `bench/baseline.sql`, the PL/pgSQL function written from the reference contract")
w("- ratios compare figures measured in this same run; this 2-core machine is noisy, so read them as ±10%\n")

w("## Goals\n")
w("| goal | figure | met |")
w("| --- | --- | --- |")
if 8 in clients_list:
    hot = med("extension_hot", 8) / med("select1", 8)
    w(f"| table store, hot-key flood, 8 clients: ≥ 0.5× `SELECT 1` | {hot:.2f}× | {'yes' if hot >= 0.5 else 'no'} |")
    r_off = med("extension_random", 8, "off") / med("baseline_random", 8, "off")
    w(f"| table store, 100 000 random keys, 8 clients, synchronous_commit=off: ≥ 1.5× baseline | {r_off:.2f}× | "
      f"{'yes' if r_off >= 1.5 else 'no'} |")
    r_on = med("extension_random", 8, "on") / med("baseline_random", 8, "on")
    w(f"| table store, 100 000 random keys, 8 clients, synchronous_commit=on: ≥ 1× baseline | {r_on:.2f}× | "
      f"{'yes' if r_on >= 1.0 else 'no'} |")
    ser = med("extension_hot", 8, "on", SER) / med("baseline_hot", 8, "on", SER)
    key = ("extension_hot", 8, "on", SER)
    rpc = retries[key] / committed[key] if committed[key] else float("nan")
    w(f"| table store, SERIALIZABLE hot key, 8 clients: committed TPS ≥ 10× baseline | {ser:.1f}× | "
      f"{'yes' if ser >= 10 else 'no'} |")
    w(f"| table store, SERIALIZABLE hot key, 8 clients: ≤ 0.1 retries per committed call | {rpc:.4f} | "
      f"{'yes' if rpc <= 0.1 else 'no'} |")
for c in (8, 32):
    if c in clients_list:
        for scenario, label in (("memory_hot", "hot key"), ("memory_random", "100 000 random keys")):
            r = med(scenario, c) / med("select1", c)
            w(f"| memory store, {label}, {c} clients: ≥ 0.9× `SELECT 1` | {r:.2f}× | {'yes' if r >= 0.9 else 'no'} |")
try:
    max_b, used, slot_bytes, total, per_bucket = open(usage_path).read().split()
    w(f"| memory store: ≤ 128 bytes of shared memory per bucket (ids up to 32 bytes; any length, ids are hashed) | "
      f"{per_bucket} bytes ({slot_bytes}-byte slots; {int(total):,} bytes for {int(max_b):,} buckets) | "
      f"{'yes' if int(per_bucket) <= 128 else 'no'} |")
except (OSError, ValueError):
    pass
w("")

w("## READ COMMITTED (TPS, and × `SELECT 1` at the same client count)\n")
w("| clients | synchronous_commit | SELECT 1 | table store hot | baseline hot | memory store hot | "
  "table store random | baseline random | memory store random | random: table store / baseline |")
w("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for c in clients_list:
    s1 = med("select1", c)
    for sync in ("on", "off"):
        cells = []
        for scenario in ("extension_hot", "baseline_hot", "memory_hot", "extension_random", "baseline_random",
                         "memory_random"):
            v = med(scenario, c, sync)
            cells.append(f"{v:,.0f} ({v / s1:.2f}×)")
        ratio = med("extension_random", c, sync) / med("baseline_random", c, sync)
        w(f"| {c} | {sync} | {s1:,.0f} | " + " | ".join(cells) + f" | {ratio:.2f}× |")
w("")

w("## SERIALIZABLE hot key (committed TPS; pgbench --max-tries=1000 retries 40001)\n")
w("| clients | table store | retries per commit | baseline | retries per commit | memory store | "
  "retries per commit | table store / baseline |")
w("| --- | --- | --- | --- | --- | --- | --- | --- |")
for c in clients_list:
    cells = []
    for scenario in ("extension_hot", "baseline_hot", "memory_hot"):
        key = (scenario, c, "on", SER)
        rpc = retries[key] / committed[key] if committed[key] else float("nan")
        cells.append(f"{med(scenario, c, 'on', SER):,.0f} | {rpc:.4f}")
    ratio = med("extension_hot", c, "on", SER) / med("baseline_hot", c, "on", SER)
    w(f"| {c} | " + " | ".join(cells) + f" | {ratio:.1f}× |")
w("")
notes = Path(__file__).with_name("NOTES.md")
if notes.exists():
    out.append(notes.read_text().rstrip())
take = Path(__file__).with_name("CORE_RESULTS.md")
if take.exists():  # written by bench/run_core.sh, kept with the other results
    out.append("")
    out.append("#" + take.read_text().rstrip())
print("\n".join(out))
