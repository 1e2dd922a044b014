#!/usr/bin/env python3
"""Summarize results.jsonl of run.sh into markdown tables: per case and server the values of
every round (min-max, median), and the ratio distlimit/limitador paired by round (and, with the
floor side, distlimit/floor and limitador/floor). Adapted from ../shared/peers/rls-bench.
usage: summarize.py RESULTS_DIR [CAP]"""
import json
import os
import statistics
import sys

out_dir = sys.argv[1]
CAP = int(sys.argv[2]) if len(sys.argv) > 2 else int(os.environ.get("CAP", "100000"))
rows = []
with open(os.path.join(out_dir, "results.jsonl"), encoding="utf-8") as f:
    for line in f:
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass


for r in rows:  # derived: server CPU time per answered request (CPU over the whole run incl. warm-up / measured req/s)
    if isinstance(r.get("server_cpu_util"), (int, float)) and r.get("rps"):
        r["cpu_us_per_req"] = r["server_cpu_util"] / r["rps"] * 1e6


def by_round(phase, server, case, key):
    out = {}
    for r in rows:
        if r.get("phase") == phase and r.get("server") == server and r.get("case") == case and key in r:
            v = r[key]
            if isinstance(v, (int, float)):
                out.setdefault(r.get("round", 0), []).append(v)
    return {k: statistics.fmean(v) for k, v in out.items()}


def fmt(v, kind):
    if v is None:
        return "–"
    if kind == "rps":
        return f"{v:,.0f}".replace(",", " ")
    if kind == "us":
        return f"{v:,.0f}".replace(",", " ")
    if kind == "ms":
        return f"{v:.0f}"
    if kind == "mb":
        return f"{v / 1024:.1f}"
    if kind == "x":
        return f"{v:.2f}×"
    if kind == "pct":
        return f"{100 * v:.0f}%"
    return f"{v}"


def span(vals, kind):
    if not vals:
        return "–"
    lo, hi, med = min(vals), max(vals), statistics.median(vals)
    if len(vals) == 1:
        return fmt(lo, kind)
    return f"{fmt(lo, kind)}–{fmt(hi, kind)} (med {fmt(med, kind)})"


def ratio(phase, a, b, case, key):
    ra, rb = by_round(phase, a, case, key), by_round(phase, b, case, key)
    return [ra[k] / rb[k] for k in sorted(set(ra) & set(rb)) if rb[k]]


METRICS = [
    ("hot_allowed", "rps", "rps", "hot key, allowed, 64 in flight (h2load -c4 -m16): req/s"),
    ("hot_allowed", "mean_us", "us", "  … its mean latency, µs (h2load)"),
    ("hot_allowed", "server_cpu_util", "pct", "  … server CPU (pinned core)"),
    ("hot_allowed", "cpu_us_per_req", "us", "  … server CPU µs per request (approx.)"),
    ("hot_denied", "rps", "rps", "hot key, all denied, 64 in flight (h2load): req/s"),
    ("hot_denied", "mean_us", "us", "  … its mean latency, µs (h2load)"),
    ("latency_1", "log_mean_us", "us", "1 in flight (h2load -c1 -m1): mean µs"),
    ("latency_1", "p50_us", "us", "  … median µs"),
    ("latency_1", "p99_us", "us", "  … p99 µs"),
    ("latency_1", "rps", "rps", "  … req/s"),
    ("many_keys", "rps", "rps", "100 000 keys round-robin, 64 in flight (rlsload): req/s"),
    ("many_keys", "p50_us", "us", "  … median µs"),
    ("many_keys", "p99_us", "us", "  … p99 µs"),
    ("many_keys", "cpu_us_per_req", "us", "  … server CPU µs per request (approx.)"),
    ("startup", "startup_ms", "ms", "startup: exec to first answered RPC, ms"),
    ("rss_after_allowed", "rss_kb", "mb", "RSS after the allowed suite (incl. 100 000 keys), MiB"),
    ("rss_after_allowed", "hwm_kb", "mb", "peak RSS (VmHWM), MiB"),
]


def table(phase, servers, pairs, title):
    present = [s for s in servers if any(r.get("phase") == phase and r.get("server") == s for r in rows)]
    if not present:
        return
    print(f"\n### {title}\n")
    head = "| metric | " + " | ".join(present) + " | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |"
    print(head)
    print("|" + "---|" * (1 + len(present) + len(pairs)))
    for case, key, kind, label in METRICS:
        cells = [span(list(by_round(phase, s, case, key).values()), kind) for s in present]
        if all(c == "–" for c in cells):
            continue
        rcells = []
        for a, b in pairs:
            rv = ratio(phase, a, b, case, key)
            rcells.append(span(rv, "x") if kind in ("rps", "us", "ms", "mb") else "")
        print(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(rcells) + " |")
    loads = [r["load1"] for r in rows if r.get("phase") == phase and isinstance(r.get("load1"), (int, float))]
    if loads:
        print(f"\nload average (1 min) at the start of each run in this phase: {min(loads):.2f}–{max(loads):.2f}")
    rcpu = {}
    for r in rows:
        if r.get("phase") == phase and r.get("case") in ("hot_allowed", "many_keys") and "redis_cpu_util" in r and phase != "memory":
            rcpu.setdefault((r["server"], r["case"]), []).append(r["redis_cpu_util"])
    if rcpu:
        print("\nredis-server CPU during the run (unpinned, 1.00 = one core): " + "; ".join(
            f"{s} {c} {span(v, 'pct')}" for (s, c), v in sorted(rcpu.items())))


def checks():
    bad = []
    for r in rows:
        c = r.get("case", "")
        if c == "check_allowed" and (r.get("over_limit", 0) or r.get("grpc_err", 0) or r.get("transport_err", 0) or r.get("unknown", 0) or not r.get("ok")):
            bad.append(r)
        if c == "check_denied" and (r.get("ok", 0) or r.get("grpc_err", 0) or r.get("transport_err", 0) or not r.get("over_limit")):
            bad.append(r)
        if c in ("hot_allowed", "hot_denied", "latency_1") and (r.get("failed", 0) or r.get("errored", 0) or r.get("s_non2xx", 0) or "parse_error" in r):
            bad.append(r)
        if c == "many_keys" and (r.get("over_limit", 0) or r.get("grpc_err", 0) or r.get("transport_err", 0)):
            bad.append(r)
    n_checks = sum(1 for r in rows if r.get("case") in ("check_allowed", "check_denied"))
    verify = [r for r in rows if r.get("case") == "five_then_over"]
    print("\n### Checks\n")
    for r in verify:
        print(f"- grpcio, limit 5 per hour on {r['server']}: 5 OK then OVER_LIMIT: {'yes' if r['pass'] else 'NO'}")
    okc = [r for r in rows if r.get("case") == "check_allowed"]
    dnc = [r for r in rows if r.get("case") == "check_denied"]
    print(f"- {n_checks} rlsload checks after the h2load runs (same key, 64 in flight): "
          f"allowed config {sum(r.get('ok', 0) for r in okc)} OK / {sum(r.get('over_limit', 0) for r in okc)} OVER_LIMIT / "
          f"{sum(r.get('grpc_err', 0) + r.get('transport_err', 0) for r in okc)} errors; "
          f"denied config {sum(r.get('ok', 0) for r in dnc)} OK / {sum(r.get('over_limit', 0) for r in dnc)} OVER_LIMIT / "
          f"{sum(r.get('grpc_err', 0) + r.get('transport_err', 0) for r in dnc)} errors")
    mk = [r for r in rows if r.get("case") == "many_keys"]
    if mk:
        print(f"- many_keys runs: {sum(r.get('ok', 0) for r in mk)} OK, {sum(r.get('over_limit', 0) for r in mk)} OVER_LIMIT, "
              f"{sum(r.get('grpc_err', 0) + r.get('transport_err', 0) for r in mk)} errors")
    if bad:
        print(f"- **{len(bad)} runs with unexpected answers or errors:**")
        for r in bad[:20]:
            print("  - " + json.dumps({k: r.get(k) for k in ("phase", "round", "server", "case", "ok", "over_limit", "grpc_err", "transport_err", "failed", "errored", "s_non2xx", "first_error") if k in r}))
    else:
        print("- no unexpected answer, gRPC error or HTTP error in any run")


def exact():
    ex = [r for r in rows if r.get("phase") == "exact" and r.get("case") in ("exact_rust", "exact_python")]
    if not ex:
        return
    print(f"\n### Exactness: two instances on one Redis, limit {CAP} per day on one key\n")
    print("| server mode | client | round | sent | OK (admitted) | over-admission (OK − limit) | OVER_LIMIT | errors | req/s | load1 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(ex, key=lambda r: (r["server"], r["case"], r.get("round", 0))):
        errs = r.get("grpc_err", 0) + r.get("transport_err", 0) + r.get("error", 0) + r.get("unknown", 0)
        print(f"| {r['server']} | {'rlsload 8×32' if r['case'] == 'exact_rust' else 'grpcio asyncio 2×32'} | {r.get('round')} | {r.get('sent')} | {r.get('ok')} | "
              f"{r.get('ok', 0) - CAP:+d} | {r.get('over_limit')} | {errs} | {fmt(r.get('rps'), 'rps')} | {r.get('load1', '')} |")
    mets = [r for r in rows if r.get("phase") == "exact" and r.get("case") == "exact_metrics"]
    if mets:
        print("\nServer-side counters scraped from both instances' /metrics (cumulative since start, "
              "probe calls included; after_rust_and_python also counts the rlsload run):\n")
        for r in sorted(mets, key=lambda r: (r["server"], r.get("round", 0), r.get("after", ""))):
            kv = {k: v for k, v in r.items() if k.startswith(("dl_", "lim_"))}
            print(f"- {r['server']} round {r.get('round')} {r.get('after')}: " + ", ".join(f"{k}={v}" for k, v in sorted(kv.items())))


print(f"## Results ({os.path.basename(out_dir.rstrip('/'))})")
table("memory", ["dl-mem", "lim-mem", "floor"],
      [("dl-mem", "lim-mem"), ("dl-mem", "floor"), ("lim-mem", "floor")], "Memory storage (one instance)")
table("redis", ["dl-redis", "dl-lease", "lim-redis", "lim-cached"],
      [("dl-redis", "lim-redis"), ("dl-redis", "lim-cached"), ("dl-lease", "lim-cached")], "Redis storage (one instance)")
exact()
checks()
