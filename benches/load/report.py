"""Formats the load benchmark's numbers as a Markdown table with the ratios."""
import os
import platform
import sys

duration, threads, rss_kb = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = [tuple(float(x) for x in arg.split()) for arg in sys.argv[4:10]]
names = ["direct", "bare Pingora", "gateway"]
by = {1: dict(zip(names, runs[0:3])), 64: dict(zip(names, runs[3:6]))}

cpu = "unknown CPU"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
except OSError:
    pass

print(f"Machine: {os.cpu_count()} cores, {cpu}, {platform.system()} {platform.release()}.")
print(f"wrk, 1 thread, {duration} s per run after a 2 s warm-up; proxies with {threads} worker thread(s);")
print("a ~1 KB chat completion POST; the mock provider answers in-process.\n")
print("| concurrency | target | requests/s | p50 (us) | p99 (us) |")
print("|---|---|---|---|---|")
for c in (1, 64):
    for n in names:
        rps, p50, p99 = by[c][n]
        print(f"| {c} | {n} | {rps:,.0f} | {p50:,.0f} | {p99:,.0f} |")
print()
g1, b1, d1 = by[1]["gateway"], by[1]["bare Pingora"], by[1]["direct"]
g64, b64, d64 = by[64]["gateway"], by[64]["bare Pingora"], by[64]["direct"]
print(f"- gateway / bare Pingora requests/s at concurrency 64: {g64[0] / b64[0]:.2f}")
print(f"- gateway / direct requests/s at concurrency 64: {g64[0] / d64[0]:.2f}")
print(f"- gateway p50 minus bare Pingora p50 at concurrency 1: {g1[1] - b1[1]:+.0f} us")
print(f"- gateway p50 minus direct p50 at concurrency 1: {g1[1] - d1[1]:+.0f} us")
print(f"- gateway peak RSS: {rss_kb / 1024:.1f} MiB")
