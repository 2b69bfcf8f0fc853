#!/usr/bin/python3
"""Database cost of draining a backlog by commit-ordered windows (issue 14
prototype): the counterpart of bench/keyed_drain.py, which measures today's
claim + complete on the same data. No HTTP, one connection, zero writes per
event: the window is read once (its ids and keys), the payloads in pages by
id, and each page is acknowledged by moving the cursor (one UPDATE per page).
Per-key order is kept in memory: every page's events go to per-key queues and
are "sent" head by head, up to --in-flight keys at a time, and the driver
checks that each key's ids come out ascending.

    bench/windows/window_drain.py DSN [--events 20000] [--keys 100] [--runs 3]
                                      [--page 1000] [--per-txn 0]

--keys 0: no key. --per-txn N: commit the backlog N events per transaction
(0: all in one, as keyed_drain.py does). Prints each run's drain time, rate
and the PostgreSQL backend's CPU per event, and the medians.
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import statistics
import subprocess
import sys
import time

import psycopg2

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from keyed_drain import backend_cpu, named_blocks  # noqa: E402


def install(dsn: str, schema: str) -> None:
    subprocess.run(["psql", "-q", "-X", "-v", "ON_ERROR_STOP=1", "-v", f"schema={schema}", "-1",
                    "-d", dsn, "-f", str(HERE / "schema.sql")], check=True, stdout=subprocess.DEVNULL)


def prepare(cur, schema: str) -> None:
    q = named_blocks(HERE / "window.sql")
    # The claiming session's settings (bench/NOTES.md, "Database").
    for setting in ("SET synchronous_commit = off", "SET plan_cache_mode = force_generic_plan",
                    "SET enable_seqscan = off", "SET enable_bitmapscan = off"):
        cur.execute(setting)
    for name in ("open_window", "read_window", "fetch_page", "advance_within", "finish_window"):
        cur.execute(f"PREPARE {name} AS " + q[name].replace(':"schema"', f'"{schema}"'))


class Sequencer:
    """In-memory per-key order: one queue per key, one event per key in
    flight; unkeyed events go out at once. Checks the order it produces."""

    def __init__(self, in_flight: int):
        self.in_flight = in_flight
        self.queues: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.last: dict[str, int] = {}
        self.sent = 0

    def deliver(self, rows) -> None:
        for row in rows:
            key = row[2]
            if key is None:
                self.sent += 1
            else:
                self.queues[key].append(row[0])
        # Rounds of up to in_flight keys, each sending its head: what a relay
        # with that many connections does when every request succeeds.
        while self.queues:
            for key in list(self.queues)[: self.in_flight]:
                q = self.queues[key]
                i = q.popleft()
                if self.last.get(key, 0) >= i:
                    raise SystemExit(f"key {key}: {i} after {self.last[key]}")
                self.last[key] = i
                self.sent += 1
                if not q:
                    del self.queues[key]


def drain(cur, page: int, in_flight: int, expect: int) -> int:
    seq = Sequencer(in_flight)
    while seq.sent < expect:
        cur.execute("EXECUTE open_window('d', 0, 0)")
        rows = cur.fetchall()
        snap_b = rows[0][2]
        ids = [r[0] for r in rows if r[0] is not None]
        for start in range(0, len(ids), page):
            chunk = ids[start:start + page]
            cur.execute("EXECUTE fetch_page(%s)", (chunk,))
            seq.deliver(cur.fetchall())
            if start + page < len(ids):
                cur.execute("EXECUTE advance_within('d', 0, 0, %s, %s)", (snap_b, ids[start + page]))
                assert cur.fetchall(), "cursor lost"
        cur.execute("EXECUTE finish_window('d', 0, 0, %s)", (snap_b,))
        assert cur.fetchall(), "cursor lost"
    return seq.sent


def run_once(dsn: str, schema: str, events: int, keys: int, page: int, per_txn: int,
             in_flight: int) -> tuple[float, float, int]:
    install(dsn, schema)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute(f"""INSERT INTO "{schema}".cursors (destination, slot, snap_a)
                    VALUES ('d', 0, pg_current_snapshot())""")
    key = "NULL" if keys == 0 else f"'k' || (g % {keys})"
    step = per_txn or events
    for lo in range(1, events + 1, step):
        cur.execute(f"""INSERT INTO "{schema}".events (topic, payload, ordering_key)
                        SELECT 't', '{{}}', {key} FROM generate_series({lo}, {min(lo + step - 1, events)}) g""")
    cur.execute(f'VACUUM ANALYZE "{schema}".events')
    prepare(cur, schema)
    cur.execute("SELECT pg_backend_pid()")
    backend = cur.fetchone()[0]
    cpu_start = backend_cpu(backend)
    start = time.monotonic()
    sent = drain(cur, page, in_flight, events)
    elapsed = time.monotonic() - start
    cpu = backend_cpu(backend) - cpu_start
    if sent != events:
        raise SystemExit(f"drained {sent} of {events} events")
    cur.execute(f'DROP SCHEMA "{schema}" CASCADE')
    conn.close()
    return elapsed, cpu, sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dsn")
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--page", type=int, default=1000)
    ap.add_argument("--per-txn", type=int, default=0)
    ap.add_argument("--in-flight", type=int, default=64)
    args = ap.parse_args()
    times, cpus = [], []
    for run in range(args.runs):
        t, cpu, _ = run_once(args.dsn, f"window_drain_{run}", args.events, args.keys, args.page,
                             args.per_txn, args.in_flight)
        times.append(t)
        cpus.append(cpu)
        print(f"run {run + 1}: {args.events} events, {args.keys} keys: {t:.2f} s, "
              f"{args.events / t:,.0f} events/s; PostgreSQL CPU {cpu / args.events * 1e6:.1f} us/event")
    med, med_cpu = statistics.median(times), statistics.median(cpus)
    print(f"median: {med:.2f} s, {args.events / med:,.0f} events/s; "
          f"PostgreSQL CPU {med_cpu / args.events * 1e6:.1f} us/event")


if __name__ == "__main__":
    main()
