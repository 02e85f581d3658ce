"""Formats the load benchmark's runs (stdin: 'target conns rps p50_us p99_us' per line) as a
Markdown table of medians, with the ratios."""
import os
import platform
import statistics
import sys
from collections import defaultdict

duration, threads, rss_kb, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
pipeline = sys.argv[5] if len(sys.argv) > 5 else "full"
runs = defaultdict(list)
for line in sys.stdin:
    target, conns, rps, p50, p99 = line.split()
    runs[(target, int(conns))].append((float(rps), float(p50), float(p99)))


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
print("| concurrency | target | requests/s | p50 (us) | p99 (us) |")
print("|---|---|---|---|---|")
for c in (1, 64):
    for t in ("direct", "bare", "gateway"):
        print(f"| {c} | {names[t]} | {median(t, c, 0):,.0f} | {median(t, c, 1):,.0f} | {median(t, c, 2):,.0f} |")
print()
print(f"- gateway / bare Pingora requests/s at concurrency 64: {median('gateway', 64, 0) / median('bare', 64, 0):.2f}")
print(f"- gateway / direct requests/s at concurrency 64: {median('gateway', 64, 0) / median('direct', 64, 0):.2f}")
print(f"- gateway p50 minus bare Pingora p50 at concurrency 1: {median('gateway', 1, 1) - median('bare', 1, 1):+.0f} us")
print(f"- gateway p50 minus direct p50 at concurrency 1: {median('gateway', 1, 1) - median('direct', 1, 1):+.0f} us")
print(f"- gateway peak RSS: {rss_kb / 1024:.1f} MiB")
