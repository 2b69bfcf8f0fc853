#!/usr/bin/python3
"""Fault scripts (issue 12): what a failing destination costs the others, and
how fast everything recovers. Medians of --runs runs of each scenario.

    bench/destination_faults.py DATABASE_URL [--runs 3] [--scenario stalled|outage|all] [--binary PATH]

stalled  Destinations a and b, `--concurrency 4`, lease 8 s. a stalls: every
         request hangs past its 2 s timeout; events to a arrive at 10/s.
         100 events to b at 10/s. Reported: b's commit-to-delivery p50, p99
         and max, next to the same run with a healthy (the goal: p99 within
         2x); attempts charged at a against the requests a received.
outage   One destination, 300 events/s for 20 s; it answers 500 from 5 s to
         15 s. Reported: the time from its recovery to the last delivery of
         what waited (the goal: <= 1 s), relay CPU seconds during the outage
         (goal: <= 0.5), dead letters (goal: 0), lost events.

Uses build/outboxd and a fresh schema per run; needs python3-psycopg2. Not a
test: timings on a shared machine are for the closing note, by hand.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from receiver import Receiver  # noqa: E402

BINARY = str(ROOT / "build" / "outboxd")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list, p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


class Producer:
    """Commits events at a steady rate on its own connection; remembers when
    each commit returned."""

    def __init__(self, url: str, schema: str, topic: str, rate: float, count: int):
        self.committed: dict[int, float] = {}
        self._args = (url, schema, topic, rate, count)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Producer":
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        url, schema, topic, rate, count = self._args
        conn = psycopg2.connect(url)
        conn.autocommit = True
        cur = conn.cursor()
        t0 = time.monotonic()
        for n in range(count):
            wait = t0 + n / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            cur.execute(f'SELECT "{schema}".enqueue(%s, %s::jsonb)', (topic, f'{{"n": {n}}}'))
            self.committed[cur.fetchone()[0]] = time.monotonic()
        conn.close()


def start_relay(url: str, schema: str, config: str, tmp: Path, *args: str) -> subprocess.Popen:
    path = tmp / f"{schema}.toml"
    path.write_text(config)
    return subprocess.Popen([BINARY, "run", "--database-url", url, "--schema", schema, "--config", str(path), *args],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / f"{schema}.log", "w"))


def migrate(url: str, schema: str) -> None:
    subprocess.run([BINARY, "migrate", "--database-url", url, "--schema", schema], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stalled_run(url: str, tmp: Path, run: int, stall: bool) -> dict:
    schema = f"bench_stall_{os.getpid()}_{run}_{int(stall)}"
    migrate(url, schema)
    b_first: dict[int, float] = {}
    lock = threading.Lock()

    def slow(req):
        if stall:
            time.sleep(2.5)  # past the 2 s request timeout
        return 200, {}, b"ok"

    def fast(req):
        with lock:
            b_first.setdefault(req.event_id, time.monotonic())
        return 200, {}, b"ok"

    with Receiver(slow) as a, Receiver(fast) as b:
        config = (f'[destinations.a]\nurl = "{a.url}"\nrequest_timeout = "2s"\n\n'
                  f'[destinations.b]\nurl = "{b.url}"\n\n'
                  '[[routes]]\ntopics = ["slow.>"]\ndestinations = ["a"]\n\n'
                  '[[routes]]\ntopics = ["fast.>"]\ndestinations = ["b"]\n')
        relay = start_relay(url, schema, config, tmp, "--concurrency", "4", "--lease", "20s")
        try:
            to_a = Producer(url, schema, "slow.thing", 10, 100).start()
            time.sleep(1)
            to_b = Producer(url, schema, "fast.thing", 10, 100).start()
            to_b.join()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(b_first) < len(to_b.committed):
                time.sleep(0.05)
            to_a.join()
        finally:
            relay.terminate()
            relay.wait(30)
        latencies = [(b_first[i] - t) * 1000 for i, t in to_b.committed.items() if i in b_first]
        received_at_a = len(a.snapshot())
    conn = psycopg2.connect(url)
    cur = conn.cursor()
    cur.execute(f'SELECT coalesce(sum(attempts), 0) FROM "{schema}".deliveries')
    charged = cur.fetchone()[0]
    cur.execute(f'SELECT coalesce(sum(attempts), 0) FROM "{schema}".events WHERE NOT fanned_out')
    charged += cur.fetchone()[0]
    cur.execute(f'SELECT coalesce(sum(attempts), 0) FROM "{schema}".dead_letters')
    charged += cur.fetchone()[0]
    conn.close()
    return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99), "max": max(latencies),
            "missing": len(to_b.committed) - len(latencies), "charged_a": charged, "requests_a": received_at_a}


def outage_run(url: str, tmp: Path, run: int) -> dict:
    schema = f"bench_outage_{os.getpid()}_{run}"
    migrate(url, schema)
    down = threading.Event()
    first_ok: dict[int, float] = {}
    lock = threading.Lock()

    def respond(req):
        if down.is_set():
            return 500, {}, b"down"
        with lock:
            first_ok.setdefault(req.event_id, time.monotonic())
        return 200, {}, b"ok"

    with Receiver(respond) as rx:
        config = f'[destinations.a]\nurl = "{rx.url}"\n\n[[routes]]\ntopics = [">"]\ndestinations = ["a"]\n'
        relay = start_relay(url, schema, config, tmp)
        try:
            producer = Producer(url, schema, "orders.created", 300, 6000).start()
            time.sleep(5)
            down.set()
            cpu_before = cpu_seconds(relay.pid)
            time.sleep(10)
            cpu_during = cpu_seconds(relay.pid) - cpu_before
            recovered = time.monotonic()
            down.clear()
            producer.join()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(first_ok) < len(producer.committed):
                time.sleep(0.05)
            # What committed before the recovery waited for it: when was the last of it delivered?
            waited = [i for i, t in producer.committed.items() if t < recovered]
            done = [first_ok[i] for i in waited if i in first_ok]
            drain = (max(done) - recovered) if done else float("nan")
        finally:
            relay.terminate()
            relay.wait(30)
    conn = psycopg2.connect(url)
    cur = conn.cursor()
    cur.execute(f'SELECT count(*) FROM "{schema}".dead_letters')
    dead = cur.fetchone()[0]
    conn.close()
    return {"drain_s": drain, "cpu_during_s": cpu_during, "dead": dead,
            "lost": len(producer.committed) - len(first_ok)}


def median(runs: list, key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("database_url")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scenario", choices=["stalled", "outage", "all"], default="all")
    parser.add_argument("--binary", default=BINARY, help="the outboxd to measure (default: build/outboxd)")
    args = parser.parse_args()
    globals()["BINARY"] = args.binary
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"destination_faults_{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}, binary {args.binary}, {args.runs} runs, medians")
    if args.scenario in ("stalled", "all"):
        healthy, stalled = [], []
        for run in range(args.runs):
            healthy.append(stalled_run(args.database_url, tmp, run, stall=False))
            stalled.append(stalled_run(args.database_url, tmp, run, stall=True))
            print(f"  run {run + 1}: healthy {healthy[-1]}  stalled {stalled[-1]}", flush=True)
        print("| b's latency, ms | p50 | p99 | max | missing |\n|---|---|---|---|---|")
        for name, runs in (("a healthy", healthy), ("a stalled", stalled)):
            print(f"| {name} | {median(runs, 'p50'):.1f} | {median(runs, 'p99'):.1f} | {median(runs, 'max'):.1f} "
                  f"| {median(runs, 'missing'):.0f} |")
        print(f"p99 ratio stalled/healthy: {median(stalled, 'p99') / median(healthy, 'p99'):.2f}; "
              f"attempts charged at a {median(stalled, 'charged_a'):.0f} for {median(stalled, 'requests_a'):.0f} "
              "requests it received (events still in the outbox at the end)")
    if args.scenario in ("outage", "all"):
        runs = []
        for run in range(args.runs):
            runs.append(outage_run(args.database_url, tmp, run))
            print(f"  run {run + 1}: {runs[-1]}", flush=True)
        print("| outage 10 s at 300/s | drain after recovery s | relay CPU during outage s | dead letters | lost |\n"
              "|---|---|---|---|---|")
        print(f"| medians | {median(runs, 'drain_s'):.2f} | {median(runs, 'cpu_during_s'):.2f} | "
              f"{median(runs, 'dead'):.0f} | {median(runs, 'lost'):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
