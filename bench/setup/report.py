#!/usr/bin/env python3
"""bench/out/raw.tsv (round, clients, scenario, store, tps: one line per pgbench round) into bench/results/every_call.md
(stdout), and the chart's data and gnuplot script in the output directory (bench/run.sh renders
bench/results/every_call.svg from them).

Every ratio is taken within one round (a scenario's TPS over `SELECT 1`'s TPS at the same client count in the
same round), then summarised over the rounds: the median, and the lowest and highest round."""
import os
import platform
import statistics
import subprocess
import sys
from collections import defaultdict
from datetime import datetime, timezone

raw_path, usage_path, command, head, out_dir, pages = sys.argv[1:7]
tps = {}
for line in open(raw_path):
    rnd, clients, scenario, store, t = line.rstrip("\n").split("\t")
    tps[(int(rnd), int(clients), scenario, store)] = float(t)
rounds = sorted({k[0] for k in tps})
CLIENTS = (8, 32)


def ratios(clients, num, den=("select1", "-")):
    values = []
    for r in rounds:
        a, b = tps.get((r, clients, *num)), tps.get((r, clients, *den))
        if a is not None and b:
            values.append(a / b)
    return values


def summary(values):
    if not values:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(values), min(values), max(values)


def fmt(values):
    m, lo, hi = summary(values)
    return f"{m:.2f}× ({lo:.2f}–{hi:.2f})"


def median_tps(clients, scenario, store):
    v = [tps[(r, clients, scenario, store)] for r in rounds if (r, clients, scenario, store) in tps]
    return statistics.median(v) if v else float("nan")


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gib():
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    return "?"


usage = open(usage_path).read().split()
max_buckets, slot_bytes, total_bytes, bytes_per_bucket = (int(x) for x in usage[:4])

ROWS = [
    ("memory", "request_hot", "`rate_limiting_request`, hot key"),
    ("memory", "request_random", "`rate_limiting_request`, 100 000 random keys"),
    ("memory", "take_hot", "`take(policy, key)` in `FROM`, hot key"),
    ("memory", "take_random", "`take(policy, key)` in `FROM`, random keys"),
    ("memory", "take_select_random", "`(take(policy, key)).allowed` in the select list, random keys"),
    ("memory", "multi3_random", "`take_many`, 3 policies, random keys"),
    ("memory", "charge_hot", "`charge(policy, key, 1)`, hot key (in debt at its floor)"),
    ("memory", "charge_random", "`charge(policy, key, 1)`, random keys"),
    ("memory", "calendar_hot", "`take` of a monthly calendar quota (Europe/Paris), hot key"),
    ("memory", "calendar_random", "`take` of a monthly calendar quota (Europe/Paris), random keys"),
    ("memory", "acquire_hot", "`acquire` of a concurrency policy (4 leases of 1 s), hot key"),
    ("memory", "acquire_random", "`acquire` of a concurrency policy (4 leases of 1 s), random keys"),
    ("memory", "acquire_release_random", "`acquire` then `release` in one statement, random keys"),
    ("memory", "penalty_hot", "`take` under a penalty box, hot key (every denial counted)"),
    ("memory", "penalty_random", "`take` under a penalty box, random keys (mostly granted)"),
    ("memory", "blocked_hot", "`take` of a key blocked by hand, hot key"),
    ("memory", "blocked_random", "`take` of keys blocked by hand, 10 000 random keys"),
    ("table", "request_hot", "`rate_limiting_request`, hot key"),
    ("table", "request_random", "`rate_limiting_request`, random keys"),
    ("table", "take_hot", "`take(policy, key)` in `FROM`, hot key"),
    ("table", "take_random", "`take(policy, key)` in `FROM`, random keys"),
    ("table", "multi3_random", "`take_many`, 3 policies, random keys"),
    ("table", "baseline_hot", "PL/pgSQL baseline, hot key"),
    ("table", "baseline_random", "PL/pgSQL baseline, random keys"),
]

print("# Benchmarks: every call against `SELECT 1`\n")
print(f"Produced by `{command}` at `{head}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.\n")
print(f"- Machine: {os.cpu_count()} vCPU ({cpu_model()}), {memory_gib()} RAM, {platform.system()} "
      f"{platform.release()} (Debian 12 VM); pgbench runs on the same cores as the server.")
try:
    version = subprocess.run(["bash", "-c", "source scripts/cluster.sh; \"$(pg_bindir 15)/postgres\" --version"],
                             capture_output=True, text=True).stdout.strip()
except OSError:
    version = "PostgreSQL 15"
print(f"- Server: {version} (built from Debian's source package), release build of rate_limit preloaded, "
      f"`rate_limit.max_buckets = {max_buckets:,}`, shared memory on {pages}, 100 000 keys in every namespace of "
      "both stores beforehand.")
print(f"- Client: `pgbench -M prepared -j 2`, {len(rounds)} rounds; each round runs every scenario once at 8 "
      "and 32 clients; `synchronous_commit = off`.")
print("- Figures: median TPS, and the ratio to `SELECT 1` taken within each round, as median (lowest–highest "
      "round). The spread of the `SELECT 1` rounds themselves: "
      + ", ".join(f"{c} clients {summary([tps[(r, c, 'select1', '-')] for r in rounds])[1]:,.0f}–"
                  f"{summary([tps[(r, c, 'select1', '-')] for r in rounds])[2]:,.0f} TPS" for c in CLIENTS) + ".\n")
print("![Ratio to SELECT 1 per call, 8 and 32 clients](every_call.svg)\n")
print("| store | call | 8 clients TPS | × `SELECT 1` | 32 clients TPS | × `SELECT 1` |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
print(f"| – | `SELECT 1` | {median_tps(8, 'select1', '-'):,.0f} | 1 | {median_tps(32, 'select1', '-'):,.0f} | 1 |")
for store, scenario, label in ROWS:
    cells = []
    for c in CLIENTS:
        cells += [f"{median_tps(c, scenario, store):,.0f}", fmt(ratios(c, (scenario, store)))]
    print(f"| {store} | {label} | " + " | ".join(cells) + " |")

print("\n## Goals (issue 9)\n")
print("| goal | 8 clients | 32 clients | met |")
print("| --- | ---: | ---: | --- |")


def goal(label, values8, values32, threshold8, threshold32=None):
    threshold32 = threshold8 if threshold32 is None else threshold32
    m8, m32 = summary(values8)[0], summary(values32)[0]
    ok8 = "" if threshold8 is None else ("yes" if m8 >= threshold8 else "no")
    ok32 = "yes" if m32 >= threshold32 else "no"
    met = ok32 if threshold8 is None else ("yes" if ok8 == ok32 == "yes" else f"8: {ok8}, 32: {ok32}")
    print(f"| {label} | {fmt(values8) if values8 else '–'} | {fmt(values32)} | {met} |")


for scenario, label in (("request", "`rate_limiting_request`"), ("take", "`take(policy, key)`")):
    for shape, keys in (("hot", "hot key"), ("random", "random keys")):
        goal(f"memory, {label}, {keys} ≥ 0.9× (8) / 0.85× (32) `SELECT 1`",
             ratios(8, (f"{scenario}_{shape}", "memory")), ratios(32, (f"{scenario}_{shape}", "memory")), 0.9, 0.85)
goal("memory, 3-policy take ≥ 0.75× `SELECT 1`", ratios(8, ("multi3_random", "memory")),
     ratios(32, ("multi3_random", "memory")), 0.75)
for scenario, label in (("request", "`rate_limiting_request`"), ("take", "`take(policy, key)`")):
    goal(f"table, {label}, hot key ≥ 0.75× `SELECT 1`", ratios(8, (f"{scenario}_hot", "table")),
         ratios(32, (f"{scenario}_hot", "table")), 0.75)
goal("table, grants (`rate_limiting_request`, random keys) ≥ 1.25× the PL/pgSQL baseline",
     ratios(8, ("request_random", "table"), ("baseline_random", "table")),
     ratios(32, ("request_random", "table"), ("baseline_random", "table")), 1.25)
goal("table, 3-policy take ≥ 0.5× a single take (32 clients)", [],
     ratios(32, ("multi3_random", "table"), ("take_random", "table")), None, 0.5)
print("\n## Goals (issue 18: the new calls, memory store)\n")
print("| goal | 8 clients | 32 clients | met |")
print("| --- | ---: | ---: | --- |")
for scenario, label in (("charge", "`charge`"), ("calendar", "calendar-window `take`"), ("acquire", "`acquire`"),
                        ("penalty", "penalty-box `take`"), ("blocked", "`take` of a blocked key")):
    for shape, keys in (("hot", "hot key"), ("random", "random keys")):
        v8, v32 = ratios(8, (f"{scenario}_{shape}", "memory")), ratios(32, (f"{scenario}_{shape}", "memory"))
        met = "yes" if summary(v8)[0] >= 0.85 else "no"
        print(f"| memory, {label}, {keys} ≥ 0.85× `SELECT 1` at 8 clients | {fmt(v8)} | {fmt(v32)} | {met} |")
        t8 = ratios(8, (f"{scenario}_{shape}", "memory"), (f"take_{shape}", "memory"))
        t32 = ratios(32, (f"{scenario}_{shape}", "memory"), (f"take_{shape}", "memory"))
        print(f"| the same, as a ratio to `take(policy, key)`, {keys} (no goal) | {fmt(t8)} | {fmt(t32)} | – |")
print()
print("| goal (issue 9) | 8 clients | 32 clients | met |")
print("| --- | ---: | ---: | --- |")
# issue 9 asked for 128 bytes; issue 28's per-role shares count every bucket for its role and database in
# 16 more bytes per bucket (tables that no number of databases or roles can fill)
print(f"| memory per bucket ≤ 144 bytes (128 + 16 for the shares' counts) | {bytes_per_bucket} bytes ({slot_bytes}-byte slots, "
      f"{total_bytes / 2**20:.0f} MiB for {max_buckets:,} buckets) | | {'yes' if bytes_per_bucket <= 144 else 'no'} |")

# the chart: median ratio per call with the lowest and highest round as error bars
CHART = [(s, sc, lab) for s, sc, lab in ROWS if not sc.startswith("baseline")] + [("table", "baseline_random", "")]
with open(os.path.join(out_dir, "chart.dat"), "w") as f:
    f.write("# label\tm8\tlo8\thi8\tm32\tlo32\thi32\n")
    for store, scenario, _ in CHART:
        short = {"request": "request", "take": "take", "take_select": "take (select list)", "multi3": "3 policies",
                 "baseline": "PL/pgSQL", "charge": "charge", "calendar": "monthly quota", "acquire": "acquire",
                 "acquire_release": "acquire + release", "penalty": "penalty box",
                 "blocked": "blocked key"}
        name, shape = scenario.rsplit("_", 1)
        label = f"{store}: {short[name]}, {'hot' if shape == 'hot' else 'random'}"
        row = [label]
        for c in CLIENTS:
            row += [f"{x:.3f}" for x in summary(ratios(c, (scenario, store)))]
        f.write('"' + row[0] + '"\t' + "\t".join(row[1:]) + "\n")
with open(os.path.join(out_dir, "chart.gp"), "w") as f:
    f.write(f"""set terminal svg size 1200,640 dynamic font "sans,12" background rgb "white" noenhanced
set output "bench/results/every_call.svg"
set title "rate_limit {head}: throughput as a ratio to SELECT 1 in the same round (median of {len(rounds)} rounds; bars: lowest and highest round)"
set style data histograms
set style histogram errorbars gap 1 lw 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set ylabel "× SELECT 1"
set yrange [0:*]
set bmargin 11
set rmargin 12
set grid ytics
set xtics rotate by -35 left
set key top right
set datafile separator "\\t"
set arrow from graph 0, first 0.9 to graph 1, first 0.9 nohead dt 2 lc rgb "#555555"
set label "0.9" at graph 1.005, first 0.9 left
plot "{out_dir}/chart.dat" using 2:3:4:xtic(1) title "8 clients" lc rgb "#4477aa", \\
     "" using 5:6:7 title "32 clients" lc rgb "#ee7733"
""")
