"""Reads wrk --latency output on stdin; prints 'requests_per_sec p50_us p99_us requests'."""
import re
import sys

text = sys.stdin.read()
units = {"us": 1.0, "ms": 1000.0, "s": 1_000_000.0}


def latency(pct):
    m = re.search(rf"^\s*{pct}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    if not m:
        sys.exit(f"no {pct}% latency in wrk output:\n{text}")
    return float(m.group(1)) * units[m.group(2)]


rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
count = re.search(r"^\s*(\d+) requests in", text, re.M)
errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
if not rps or not count:
    sys.exit(f"no Requests/sec or request count in wrk output:\n{text}")
if errors:
    sys.exit(f"{errors.group(1)} failed responses:\n{text}")
print(f"{float(rps.group(1)):.0f} {latency(50):.0f} {latency(99):.0f} {count.group(1)}")
