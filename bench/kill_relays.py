#!/usr/bin/python3
"""Fault script (issue 12, goal "kill -9 x10 in a 30 s run"): two relays
deliver a steady stream of events while one of them, in turn, is killed
with -9 every 3 s and started again at once (as a supervisor would).
Reports the longest gap between deliveries, the longest commit-to-delivery
latency, lost and duplicate events.

    bench/kill_relays.py DATABASE_URL [--runs 3] [--rate 200] [--kills 10] [--receiver-delay 0.05]

The receiver takes --receiver-delay per request, so that the relay killed
holds leases in flight.

Uses build/outboxd and a fresh schema per run; needs python3-psycopg2.
"""

from __future__ import annotations

import argparse
import os
import signal
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


def one_run(url: str, binary: str, rate: float, kills: int, period: float, delay: float, run: int) -> dict:
    schema = f"bench_kill_{os.getpid()}_{run}"
    subprocess.run([binary, "migrate", "--database-url", url, "--schema", schema], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first_ok: dict[int, float] = {}
    arrivals: dict[int, int] = {}
    lock = threading.Lock()

    def respond(req):
        time.sleep(delay)  # so that a killed relay holds requests in flight
        with lock:
            arrivals[req.event_id] = arrivals.get(req.event_id, 0) + 1
            first_ok.setdefault(req.event_id, time.monotonic())
        return 200, {}, b"ok"

    committed: dict[int, float] = {}
    stop = threading.Event()

    def produce():
        conn = psycopg2.connect(url)
        conn.autocommit = True
        cur = conn.cursor()
        n = 0
        t0 = time.monotonic()
        while not stop.is_set():
            cur.execute(f'SELECT "{schema}".enqueue(%s, %s::jsonb)', ("bench.kill", f'{{"n": {n}}}'))
            committed[cur.fetchone()[0]] = time.monotonic()
            n += 1
            delay = t0 + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        conn.close()

    logs = []

    def start_relay(rx):
        log = open(f"/tmp/{schema}_{len(logs)}.log", "w")
        logs.append(log)
        return subprocess.Popen([binary, "run", "--database-url", url, "--schema", schema, "--url", rx.url,
                                 "--concurrency", "16"], stdout=subprocess.DEVNULL, stderr=log)

    with Receiver(respond) as rx:
        relays = [start_relay(rx), start_relay(rx)]
        time.sleep(0.5)
        producer = threading.Thread(target=produce)
        producer.start()
        t_start = time.monotonic()
        for k in range(kills):
            time.sleep(max(0.0, t_start + (k + 1) * period - time.monotonic()))
            victim = relays[k % 2]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            relays[k % 2] = start_relay(rx)
        time.sleep(max(0.0, t_start + (kills + 1) * period - time.monotonic()))
        stop.set()
        producer.join()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if committed.keys() <= first_ok.keys():
                    break
            time.sleep(0.1)
        for r in relays:
            r.send_signal(signal.SIGTERM)
            r.wait(timeout=15)
    for log in logs:
        log.close()
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT count(*) FROM "{schema}".events')
        left = cur.fetchone()[0]
        cur.execute(f'DROP SCHEMA "{schema}" CASCADE')
    times = sorted(first_ok[i] for i in committed if i in first_ok)
    gaps = [b - a for a, b in zip(times, times[1:])]
    latencies = [first_ok[i] - committed[i] for i in committed if i in first_ok]
    return {
        "events": len(committed),
        "lost": len(set(committed) - set(first_ok)),
        "left_in_outbox": left,
        "duplicates": sum(1 for i in committed if arrivals.get(i, 0) > 1),
        "longest_gap_s": max(gaps),
        "max_latency_s": max(latencies),
        "p99_latency_s": sorted(latencies)[int(len(latencies) * 0.99)],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("database_url")
    p.add_argument("--binary", default=str(ROOT / "build" / "outboxd"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--period", type=float, default=3.0)
    p.add_argument("--receiver-delay", type=float, default=0.05, help="seconds each request takes")
    a = p.parse_args()
    results = []
    for run in range(a.runs):
        r = one_run(a.database_url, a.binary, a.rate, a.kills, a.period, a.receiver_delay, run)
        print(f"run {run + 1}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                            for k, v in r.items()), flush=True)
        results.append(r)
    print("median: " + ", ".join(f"{k}={statistics.median(r[k] for r in results):.3f}"
                                 for k in ("longest_gap_s", "max_latency_s", "p99_latency_s", "lost", "duplicates")))


if __name__ == "__main__":
    main()
