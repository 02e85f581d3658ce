"""Formats the load benchmark's runs (stdin: 'target conns rps p50_us p99_us cpu_us round' per
line, cpu_us being the target process's CPU time per request) as a Markdown table of medians,
with the ratios. With a variant (BENCH_VARIANT: a second gateway with one thing turned on), a
fourth row and the variant against the plain gateway, also per round.

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
variant = os.environ.get("BENCH_VARIANT") or None
variant_rss_kb = int(os.environ.get("BENCH_VARIANT_RSS_KB") or 0)
prompt_kb = os.environ.get("BENCH_PROMPT_KB") or "1"
redis_calls = os.environ.get("BENCH_REDIS_CALLS", "").strip()
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

names = {"direct": "direct", "bare": "bare Pingora", "gateway": "gateway", "variant": f"gateway, {variant}"}
targets = ("direct", "bare", "gateway", "variant") if variant else ("direct", "bare", "gateway")
print(f"Machine: {os.cpu_count()} cores, {cpu}, {platform.system()} {platform.release()}.")
print(f"wrk, 1 thread, {duration} s per run after a 2 s warm-up; proxies with {threads} worker thread(s);")
print(f"a chat completion POST with a ~{prompt_kb} KB prompt; medians of {reps} interleaved runs; gateway pipeline: {pipeline}.\n")
print("| concurrency | target | requests/s | p50 (us) | p99 (us) | CPU per request (us) |")
print("|---|---|---|---|---|---|")
for c in (1, 64):
    for t in targets:
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

if variant:
    def per_round(conns, f):
        return sorted(f(r) for (c, _), r in by_round.items() if c == conns and "gateway" in r and "variant" in r)

    ratio = per_round(64, lambda r: r["variant"][0] / r["gateway"][0])
    p50 = per_round(1, lambda r: r["variant"][1] - r["gateway"][1])
    cpu_64 = per_round(64, lambda r: r["variant"][2] - r["gateway"][2])
    print()
    print(f"**{variant} against the same gateway without it**")
    print()
    print(f"- requests/s at concurrency 64: {median('variant', 64, 0) / median('gateway', 64, 0):.2f}x "
          f"(per round: median {statistics.median(ratio):.2f}, range {ratio[0]:.2f} to {ratio[-1]:.2f})")
    print(f"- p50 at concurrency 1: {median('variant', 1, 1) - median('gateway', 1, 1):+.0f} us "
          f"(per round: median {statistics.median(p50):+.0f}, range {p50[0]:+.0f} to {p50[-1]:+.0f} us)")
    print(f"- CPU per request at concurrency 64: {median('variant', 64, 3) - median('gateway', 64, 3):+.1f} us "
          f"(per round: median {statistics.median(cpu_64):+.1f})")
    print(f"- peak RSS: {variant_rss_kb / 1024:.1f} MiB against {rss_kb / 1024:.1f} MiB "
          f"({(variant_rss_kb - rss_kb) / 1024:+.1f} MiB)")
    if redis_calls:
        print(f"- Redis commands per request (INFO commandstats over a 2 s run at concurrency 1): {redis_calls}")
