#!/usr/bin/python3
"""Metrics and the results table of the outboxd benchmark (stdlib only).

Used by bench/orchestrate.py after every run; also runs on its own to
rebuild the table from a kept raw directory (bench/run.sh --keep-raw):

    /usr/bin/python3 bench/analyze.py RAW_DIR [--out FILE.md]

Inputs of one run (all times CLOCK_MONOTONIC nanoseconds, one machine):
  producer file   p <TAB> n <TAB> event id <TAB> commit_ns [<TAB> key <TAB> begin_ns]
                  (one per commit; key "-" for none)
  receiver file   recv_ns <TAB> webhook-id <TAB> body         (one per request)
  meta            what the orchestrator measured around the run (run-N.json)

Definitions (also printed under the table):
  delivered    committed events received at least once
  lost         committed events never received before the drain deadline
  dup          requests beyond the first for an event
  order viol.  keyed scenarios: events that first arrived before an event of
               their key that must precede them (one whose COMMIT returned
               before their transaction began; in one bulk transaction: a
               lower id); "–" without keys
  latency      first receipt minus the producer's COMMIT return (js-*: the
               message stored in the JetStream stream reaching a consumer,
               i.e. commit to JetStream's ack); it can be
               slightly negative: the relay may deliver before the producer's
               thread is scheduled to read the clock
  insert/s     committed / (last commit - load start)
  delivered/s  delivered / (last receipt - load start); backlog: from relay start
  drain s      last receipt - end of load (backlog: - relay start)
  relay CPU    utime+stime of the relay process over the load window
  CPU % core   relay CPU / wall time of the window (idle: relay alone)
  peak RSS     VmHWM of the relay process at the end of the window
  lone commit  mean time of one durable commit by a single writer, measured
               for 0.5 s just before the run (the disk's flush time drifts on
               a shared machine, and every other figure moves with it)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import textwrap
from pathlib import Path

SCENARIO_ORDER = ["paced", "flat", "flat-k100", "backlog", "backlog-20k", "backlog-k100", "backlog-k10", "many", "idle",
                  "js-paced", "js-backlog"]
RELAYS = ["outboxd", "outboxd-windows", "baseline", "windows"]
# Scenarios that are another one with a different load: what their numbers mean.
KIND = {"js-paced": "paced", "js-backlog": "backlog", "flat-k100": "flat", "backlog-20k": "backlog",
        "backlog-k100": "backlog", "backlog-k10": "backlog"}


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def read_producer(path: Path) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], tuple[str, int, int]]]:
    """Commit times by (p, n), and for keyed events (key, event id, begin_ns)."""
    commits: dict[tuple[int, int], int] = {}
    keyed: dict[tuple[int, int], tuple[str, int, int]] = {}
    if not path.exists():
        return commits, keyed
    with path.open() as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            p, n, event_id, at = fields[:4]
            commits[(int(p), int(n))] = int(at)
            if len(fields) >= 6 and fields[4] != "-":
                keyed[(int(p), int(n))] = (fields[4], int(event_id), int(fields[5]))
    return commits, keyed


def order_violations(commits: dict, keyed: dict, first: dict) -> int:
    """Events received before an event of their key that had to precede
    them: one whose COMMIT returned before their transaction began, or, in
    the same transaction (same commit time), a lower id. Lost events are
    left out (they count as lost)."""
    by_key: dict[str, list[tuple[int, int, int, int]]] = {}
    for ev, (key, event_id, begin) in keyed.items():
        if ev in first:
            by_key.setdefault(key, []).append((commits[ev], begin, event_id, first[ev]))
    violations = 0
    for events in by_key.values():
        late: set[int] = set()
        # Across transactions: events in order of their begin; a pointer walks
        # the events by commit and keeps the latest receipt of those that
        # committed before the current one began.
        by_commit = sorted(events)
        i = 0
        latest = -1
        for commit, begin, event_id, recv in sorted(events, key=lambda e: e[1]):
            while i < len(by_commit) and by_commit[i][0] < begin:
                latest = max(latest, by_commit[i][3])
                i += 1
            if latest > recv:
                late.add(event_id)
        # Within one transaction (same commit time): id order.
        latest_in_txn: dict[int, int] = {}
        for commit, _begin, event_id, recv in sorted(events, key=lambda e: (e[0], e[2])):
            if latest_in_txn.get(commit, -1) > recv:
                late.add(event_id)
            latest_in_txn[commit] = max(latest_in_txn.get(commit, -1), recv)
        violations += len(late)
    return violations


def read_receiver(path: Path, tag: int) -> tuple[list[tuple[int, tuple[int, int]]], int]:
    """Receipts of this run as (recv_ns, (p, n)), and how many were strays
    (another run's events, or bodies that are not ours)."""
    mine: list[tuple[int, tuple[int, int]]] = []
    stray = 0
    if not path.exists():
        return mine, stray
    with path.open() as f:
        for line in f:
            parts = line.rstrip("\n").split("\t", 2)
            if len(parts) != 3:
                stray += 1
                continue
            try:
                body = json.loads(parts[2])
                if int(body["r"]) != tag:
                    stray += 1
                    continue
                mine.append((int(parts[0]), (int(body["p"]), int(body["n"]))))
            except (ValueError, KeyError, TypeError):
                stray += 1
    return mine, stray


def compute(meta: dict, raw_dir: Path) -> dict:
    """Metrics of one run from its raw files and the orchestrator's meta."""
    m: dict = {k: meta.get(k) for k in ("scenario", "relay", "run", "tag")}
    window_s = (meta["window_end_ns"] - meta["window_start_ns"]) / 1e9
    m["cpu_s"] = meta.get("cpu_s")
    m["cpu_pct"] = 100.0 * meta["cpu_s"] / window_s if meta.get("cpu_s") is not None and window_s > 0 else None
    m["rss_mb"] = meta.get("rss_kb", 0) / 1024.0 if meta.get("rss_kb") else None
    m["db_cpu_s"] = meta.get("db_cpu_s")
    m["relay_exit"] = meta.get("relay_exit")
    m["window_s"] = window_s
    m["probe_commit_ms"] = meta.get("probe_commit_ms")
    if meta["scenario"] == "idle":
        return m

    commits, keyed = read_producer(raw_dir / meta["producer_file"])
    receipts, stray = read_receiver(raw_dir / meta["receiver_file"], meta["tag"])
    first: dict[tuple[int, int], int] = {}
    dup = 0
    unexpected = 0
    for at, key in receipts:
        if key not in commits:
            unexpected += 1
            continue
        if key in first:
            dup += 1
            first[key] = min(first[key], at)
        else:
            first[key] = at
    committed = len(commits)
    delivered = len(first)
    m.update(committed=committed, delivered=delivered, lost=committed - delivered, dup=dup,
             unexpected=unexpected, stray=stray, producer_errors=meta.get("producer_errors", 0))
    m["order_violations"] = order_violations(commits, keyed, first) if keyed else None
    # CPU per delivered event of the relay, its PostgreSQL backends and the receiver.
    for key, out in (("cpu_s", "relay_us_event"), ("db_cpu_s", "db_us_event"), ("receiver_cpu_s", "recv_us_event")):
        if meta.get(key) is not None and delivered:
            m[out] = meta[key] / delivered * 1e6

    start = meta["load_start_ns"]
    last_commit = max(commits.values()) if commits else start
    last_recv = max(first.values()) if first else None
    m["insert_rate"] = committed / ((last_commit - start) / 1e9) if last_commit > start else None
    if KIND.get(meta["scenario"], meta["scenario"]) == "backlog":
        relay_start = meta["relay_start_ns"]
        m["delivered_rate"] = delivered / ((last_recv - relay_start) / 1e9) if last_recv else None
        m["drain_s"] = (last_recv - relay_start) / 1e9 if last_recv else None
        m["bulk_insert_s"] = (last_commit - start) / 1e9
        return m  # latency from one bulk commit says nothing about the relay
    m["delivered_rate"] = delivered / ((last_recv - start) / 1e9) if last_recv else None
    m["drain_s"] = (last_recv - last_commit) / 1e9 if last_recv else None
    lat = sorted((first[k] - commits[k]) / 1e6 for k in first)
    if lat:
        m.update(p50_ms=percentile(lat, 50), p90_ms=percentile(lat, 90), p99_ms=percentile(lat, 99),
                 max_ms=lat[-1], negative=sum(1 for v in lat if v < 0))
    return m


# ---- table ------------------------------------------------------------------

COLUMNS = [  # key, header, format
    ("delivered", "delivered", "{:.0f}"),
    ("lost", "lost", "{:.0f}"),
    ("dup", "dup", "{:.0f}"),
    ("order_violations", "order viol.", "{:.0f}"),
    ("p50_ms", "p50 ms", "{:.2f}"),
    ("p90_ms", "p90 ms", "{:.2f}"),
    ("p99_ms", "p99 ms", "{:.2f}"),
    ("max_ms", "max ms", "{:.1f}"),
    ("delivered_rate", "delivered/s", "{:.0f}"),
    ("insert_rate", "insert/s", "{:.0f}"),
    ("drain_s", "drain s", "{:.2f}"),
    ("cpu_s", "relay CPU s", "{:.2f}"),
    ("cpu_pct", "CPU % core", "{:.1f}"),
    ("rss_mb", "peak RSS MB", "{:.1f}"),
    ("probe_commit_ms", "lone commit ms", "{:.2f}"),
]

DETAIL_COLUMNS = COLUMNS + [
    ("committed", "committed", "{:.0f}"),
    ("db_cpu_s", "relay's PG backends CPU s", "{:.2f}"),
    ("relay_us_event", "relay µs/event", "{:.1f}"),
    ("db_us_event", "PG backends µs/event", "{:.1f}"),
    ("recv_us_event", "receiver µs/event", "{:.1f}"),
    ("negative", "latency < 0", "{:.0f}"),
    ("unexpected", "unexpected", "{:.0f}"),
    ("stray", "stray", "{:.0f}"),
    ("producer_errors", "producer errors", "{:.0f}"),
    ("relay_exit", "relay exit", "{:.0f}"),
    ("window_s", "window s", "{:.1f}"),
]


def fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return spec.format(value)


def median_of(runs: list[dict], key: str):
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def table(metrics: list[dict], columns=COLUMNS) -> str:
    by = {}
    for m in metrics:
        by.setdefault((m["scenario"], m["relay"]), []).append(m)
    head = "| scenario | relay | runs | " + " | ".join(h for _, h, _ in columns) + " |"
    sep = "|" + "---|" * (3 + len(columns))
    lines = [head, sep]
    for scenario in SCENARIO_ORDER:
        medians = {}
        for relay in RELAYS:
            runs = by.get((scenario, relay))
            if not runs:
                continue
            medians[relay] = {k: median_of(runs, k) for k, _, _ in columns}
            cells = [fmt(medians[relay][k], f) for k, _, f in columns]
            lines.append(f"| {scenario} | {relay} | {len(runs)} | " + " | ".join(cells) + " |")
        for a, b in (("outboxd", "baseline"), ("windows", "outboxd"), ("outboxd-windows", "outboxd")):
            if a in medians and b in medians:
                cells = [fmt(ratio(medians[a][k], medians[b][k]), "{:.3g}×") for k, _, _ in columns]
                lines.append(f"| {scenario} | **{a}/{b}** | | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_run_table(metrics: list[dict]) -> str:
    cols = DETAIL_COLUMNS
    head = "| scenario | relay | run | " + " | ".join(h for _, h, _ in cols) + " |"
    sep = "|" + "---|" * (3 + len(cols))
    lines = [head, sep]
    order = {s: i for i, s in enumerate(SCENARIO_ORDER)}
    for m in sorted(metrics, key=lambda m: (order.get(m["scenario"], 99), RELAYS.index(m["relay"]), m["run"])):
        cells = [fmt(m.get(k), f) for k, _, f in cols]
        lines.append(f"| {m['scenario']} | {m['relay']} | {m['run']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


DEFINITIONS = textwrap.dedent(__doc__.split("Definitions (also printed under the table):\n", 1)[1]).strip()


def report(metrics: list[dict], env: dict) -> str:
    out = ["## outboxd benchmark", ""]
    out.append(f"Machine: {env.get('machine', '?')}. ")
    out.append(f"PostgreSQL {env.get('pg_version', '?')}: fsync={env.get('fsync', '?')}, "
               f"synchronous_commit={env.get('synchronous_commit', '?')}, "
               f"wal_sync_method={env.get('wal_sync_method', '?')} (durable commits, as users run it). ")
    dsn_params = f", database URL parameters `{env['outboxd_dsn_params']}`" if env.get("outboxd_dsn_params") else ""
    if env.get("outboxd_wake"):
        dsn_params += f", `--wake {env['outboxd_wake']}`" + (" (no notify trigger)" if env["outboxd_wake"] in ("poll", "wal") else "")
    out.append(f"{env.get('outboxd', 'outboxd ?')}, `--concurrency {env.get('concurrency', 'default')}`{dsn_params}. "
               f"Scenarios: {env.get('scenarios', '?')}. Medians of {env.get('runs', '?')} run(s) per cell.")
    out.append("")
    out.append("**Shared machine:** PostgreSQL, the relay, the receiver and the producers all run on the same "
               f"{env.get('cores', '?')} cores, beside whatever else the machine runs "
               f"(load average {env.get('load_start', '?')} at start, {env.get('load_end', '?')} at end). "
               "Treat small differences as noise.")
    out.append("")
    out.append(table(metrics))
    out.append("")
    out.append("Ratios (outboxd/baseline, windows/outboxd) are of the medians: below 1 is better for latency, lost, dup, drain, CPU "
               "and RSS; above 1 is better for delivered/s.")
    out.append("")
    out.append("<details><summary>Definitions, scenario parameters and every run</summary>")
    out.append("")
    out.append("```")
    out.append(DEFINITIONS)
    out.append("```")
    out.append("")
    for line in env.get("scenario_lines", []):
        out.append(f"* {line}")
    out.append("")
    out.append(per_run_table(metrics))
    out.append("")
    out.append("</details>")
    return "\n".join(line.rstrip() for line in out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw_dir", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    metas = sorted(args.raw_dir.glob("run-*.json"))
    if not metas:
        print(f"analyze.py: no run-*.json in {args.raw_dir}", file=sys.stderr)
        return 1
    metrics = [compute(json.loads(p.read_text()), args.raw_dir) for p in metas]
    env_path = args.raw_dir / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    text = report(metrics, env)
    sys.stdout.write(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
