#!/usr/bin/env python3
"""The control plane at scale, driven through its API (used by benches/load/keys).

  keys.py create PORT ADMIN_KEY N PID OUT.json
      Creates N workspace service keys one after another on the gateway at PORT, timing each
      call; records the latency around each checkpoint (10, 100, 1k, 10k, 100k keys existing),
      the total time, and the gateway's RSS (PID) before and after.
  keys.py fill PORT ADMIN_KEY N
      Creates N keys 1000 at a time (POST /v1/api-keys/workspace/service/bulk); prints the time.
  keys.py propagate ADMIN_KEY ROUNDS OUT.json PORT1 PORT2 PORT3
      Creates a key on one instance and polls the two others with it until their data plane
      accepts it (anything but a 401): the time from the write's answer to its effect.
"""
import http.client
import json
import statistics
import sys
import time

CHECKPOINTS = [10, 100, 1_000, 10_000, 100_000, 1_000_000]
WINDOW = 1000


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def workspace(conn, admin):
    conn.request("GET", "/v1/admin/workspaces", headers={"x-gw-api-key": admin})
    r = conn.getresponse()
    return json.loads(r.read())["data"][0]["id"]


def key_body(ws, name):
    """One workspace service key as the create routes take it."""
    return {"name": name, "workspace_id": ws, "scopes": ["completions.write"],
            "rate_limits": [{"type": "requests", "unit": "rpm", "value": 1000}]}


def post(conn, admin, path, body, what):
    """POSTs JSON with the admin key; the answer's JSON, or exits naming `what`."""
    conn.request("POST", path, body=json.dumps(body),
                 headers={"x-gw-api-key": admin, "content-type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise SystemExit(f"{what}: {r.status} {data[:300]!r}")
    return json.loads(data)


def create_key(conn, admin, ws, n):
    return post(conn, admin, "/v1/api-keys/workspace/service", key_body(ws, f"k{n}"),
                f"key {n}")["key"]


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def create(port, admin, n, pid, out):
    conn = http.client.HTTPConnection("127.0.0.1", int(port))
    ws = workspace(conn, admin)
    rss_before = rss_kib(pid)
    latencies = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        create_key(conn, admin, ws, i)
        latencies.append((time.perf_counter() - t) * 1000)
        if (i + 1) % 10_000 == 0:
            print(f"keys: {i + 1} made, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    total = time.perf_counter() - start
    time.sleep(2)
    rss_after = rss_kib(pid)
    rows = []
    for c in CHECKPOINTS:
        if c > n:
            break
        # The calls made while about c keys existed (the window ending at the c-th).
        window = latencies[max(0, c - WINDOW):c]
        rows.append({"existing": c, "calls": len(window), "p50_ms": statistics.median(window),
                     "p99_ms": pct(window, 0.99)})
    buckets = []
    step = max(1, n // 10)
    for start in range(0, n, step):
        b = latencies[start:start + step]
        buckets.append({"keys": f"{start}-{start + len(b)}", "mean_ms": statistics.mean(b),
                        "p50_ms": statistics.median(b), "p99_ms": pct(b, 0.99)})
    result = {"keys": n, "total_s": total, "per_key_ms": total * 1000 / n,
              "all": {"p50_ms": statistics.median(latencies), "p90_ms": pct(latencies, 0.9),
                      "p99_ms": pct(latencies, 0.99), "p999_ms": pct(latencies, 0.999),
                      "max_ms": max(latencies)},
              "buckets": buckets,
              "rss_before_kib": rss_before, "rss_after_kib": rss_after,
              "rss_per_key_bytes": (rss_after - rss_before) * 1024 / n, "checkpoints": rows}
    json.dump(result, open(out, "w"), indent=1)
    print(json.dumps(result, indent=1))


def fill(port, admin, n):
    conn = http.client.HTTPConnection("127.0.0.1", int(port))
    ws = workspace(conn, admin)
    start = time.perf_counter()
    made = 0
    while made < n:
        batch = min(1000, n - made)
        keys = [key_body(ws, f"b{made + i}") for i in range(batch)]
        post(conn, admin, "/v1/api-keys/workspace/service/bulk", {"keys": keys},
             f"bulk at {made}")
        made += batch
    print(f"{time.perf_counter() - start:.1f}")


def accepted(port, key):
    conn = http.client.HTTPConnection("127.0.0.1", int(port))
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"x-gw-api-key": key, "x-gw-provider": "@mock",
                          "content-type": "application/json"})
    r = conn.getresponse()
    r.read()
    conn.close()
    return r.status != 401


def propagate(admin, rounds, out, ports):
    conns = [http.client.HTTPConnection("127.0.0.1", int(p)) for p in ports]
    ws = workspace(conns[0], admin)
    delays = []
    for i in range(rounds):
        writer = i % len(ports)
        key = create_key(conns[writer], admin, ws, f"p{i}")
        written = time.perf_counter()
        # The other instances are polled in turn within one loop, each until it accepts.
        waiting = [p for j, p in enumerate(ports) if j != writer]
        while waiting:
            for port in list(waiting):
                if accepted(port, key):
                    delays.append((time.perf_counter() - written) * 1000)
                    waiting.remove(port)
            if time.perf_counter() - written > 10:
                raise SystemExit(f"round {i}: instances {waiting} did not accept the key in 10 s")
            if waiting:
                time.sleep(0.001)
    result = {"rounds": rounds, "instances": len(ports), "p50_ms": statistics.median(delays),
              "p99_ms": pct(delays, 0.99), "max_ms": max(delays)}
    json.dump(result, open(out, "w"), indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "create":
        create(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])
    elif sys.argv[1] == "fill":
        fill(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "propagate":
        propagate(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:])
    else:
        raise SystemExit(__doc__)
