"""Formats the load benchmark's runs (stdin: 'target conns rps p50_us p99_us cpu_us round' per
line, cpu_us being the target process's CPU time per request) as a Markdown table of medians,
with the ratios.

The gateway/bare ratio is also given per round (the two measured one after the other), as the
median of those ratios and their range: this shared machine's speed drifts between rounds, and
a ratio of two runs made minutes apart mixes that drift into the result."""
import os
import platform
import statistics
import sys
from collections import defaultdict

duration, threads, rss_kb, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
pipeline = sys.argv[5] if len(sys.argv) > 5 else "full"
runs = defaultdict(list)
by_round = defaultdict(dict)
for line in sys.stdin:
    target, conns, rps, p50, p99, cpu_us, rnd = line.split()
    runs[(target, int(conns))].append((float(rps), float(p50), float(p99), float(cpu_us)))
    by_round[(int(conns), rnd)][target] = (float(rps), float(p50), float(cpu_us))


def median(target, conns, i):
    return statistics.median(r[i] for r in runs[(target, conns)])


cpu = "unknown CPU"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
except OSError:
    pass

names = {"direct": "direct", "bare": "bare Pingora", "gateway": "gateway"}
print(f"Machine: {os.cpu_count()} cores, {cpu}, {platform.system()} {platform.release()}.")
print(f"wrk, 1 thread, {duration} s per run after a 2 s warm-up; proxies with {threads} worker thread(s);")
print(f"a ~1 KB chat completion POST; medians of {reps} interleaved runs; gateway pipeline: {pipeline}.\n")
print("| concurrency | target | requests/s | p50 (us) | p99 (us) | CPU per request (us) |")
print("|---|---|---|---|---|---|")
for c in (1, 64):
    for t in ("direct", "bare", "gateway"):
        print(f"| {c} | {names[t]} | {median(t, c, 0):,.0f} | {median(t, c, 1):,.0f} | {median(t, c, 2):,.0f} "
              f"| {median(t, c, 3):,.1f} |")
print("\nCPU per request: the target process's user + system time (all its threads) over the run,")
print("divided by the requests answered; for direct, the mock's.")
print()
rounds_64 = [r for (c, _), r in by_round.items() if c == 64 and "gateway" in r and "bare" in r]
paired = sorted(r["gateway"][0] / r["bare"][0] for r in rounds_64)
paired_cpu = sorted(r["bare"][2] / r["gateway"][2] for r in rounds_64)
paired_p50 = sorted(
    r["gateway"][1] - r["bare"][1]
    for (c, _), r in by_round.items()
    if c == 1 and "gateway" in r and "bare" in r
)
print(f"- gateway / bare Pingora requests/s at concurrency 64: {median('gateway', 64, 0) / median('bare', 64, 0):.2f}")
print(f"  - per round (gateway and bare measured one after the other): median {statistics.median(paired):.2f}, "
      f"range {paired[0]:.2f} to {paired[-1]:.2f} over {len(paired)} rounds")
print(f"- bare Pingora / gateway CPU per request at concurrency 64: {median('bare', 64, 3) / median('gateway', 64, 3):.2f}")
print(f"  - per round: median {statistics.median(paired_cpu):.2f}, "
      f"range {paired_cpu[0]:.2f} to {paired_cpu[-1]:.2f}")
print(f"- gateway / direct requests/s at concurrency 64: {median('gateway', 64, 0) / median('direct', 64, 0):.2f}")
print(f"- gateway p50 minus bare Pingora p50 at concurrency 1: {median('gateway', 1, 1) - median('bare', 1, 1):+.0f} us")
print(f"  - per round: median {statistics.median(paired_p50):+.0f} us, "
      f"range {paired_p50[0]:+.0f} to {paired_p50[-1]:+.0f} us")
print(f"- gateway p50 minus direct p50 at concurrency 1: {median('gateway', 1, 1) - median('direct', 1, 1):+.0f} us")
print(f"- gateway peak RSS: {rss_kb / 1024:.1f} MiB")
