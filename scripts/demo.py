#!/usr/bin/python3
"""outboxd demo: enqueue events in transactions, watch them arrive as webhooks.

Run it through scripts/demo.sh, which builds outboxd, provides a database
(DATABASE_URL, or a throwaway cluster) and runs `outboxd migrate` first.

What happens:
  1. a webhook receiver starts in this process (tests/e2e/receiver.py);
  2. `outboxd run --url <receiver>` starts as a child process; its log goes to
     build/demo-outboxd.log and is shown here if it dies;
  3. one warm-up event proves the relay is up (no sleep-and-hope);
  4. N events are enqueued, one transaction each, ~50 ms apart, with
     `SELECT <schema>.enqueue(topic, payload, ordering_key)`;
  5. each delivery is printed as it arrives with its commit-to-delivery
     latency: time.monotonic() right after COMMIT returned, to
     time.monotonic() when the receiver read the request (CLOCK_MONOTONIC is
     system-wide, so the two processes' clocks agree);
  6. a summary (delivered, lost, duplicates, latency min/median/p90/max), then
     SIGTERM to outboxd, which must shut down gracefully with exit status 0.

Exit status: 0 if every event arrived intact and outboxd exited 0, else 1.
Needs Debian's python3 (python3-psycopg2): run with /usr/bin/python3.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

try:
    import psycopg2
    from psycopg2 import sql
except ImportError:  # pragma: no cover - environment problem, say how to fix it
    sys.exit("demo.py: psycopg2 missing; run with /usr/bin/python3 "
             "(Debian's python3-psycopg2, installed by scripts/deps.sh)")

from receiver import Receiver  # noqa: E402  (path set up above)

WARMUP_TIMEOUT_S = 20.0
ORDER_STEPS = ("order.created", "order.paid", "order.shipped")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=20, help="events to enqueue (default 20)")
    p.add_argument("--interval-ms", type=float, default=50.0,
                   help="pause between enqueues in ms (default 50)")
    p.add_argument("--timeout", type=float, default=15.0,
                   help="seconds to wait for outstanding deliveries after the last enqueue (default 15)")
    p.add_argument("--outboxd", default=str(ROOT / "build" / "outboxd"),
                   help="outboxd binary (default build/outboxd)")
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL"),
                   help="database (default $DATABASE_URL)")
    p.add_argument("--schema", default=os.environ.get("OUTBOXD_SCHEMA", "outbox"),
                   help="outbox schema (default $OUTBOXD_SCHEMA or 'outbox')")
    p.add_argument("--log", default=str(ROOT / "build" / "demo-outboxd.log"),
                   help="where outboxd's output goes (default build/demo-outboxd.log)")
    args = p.parse_args()
    if not args.database_url:
        p.error("no database: set DATABASE_URL or pass --database-url (scripts/demo.sh does it for you)")
    if args.events < 1:
        p.error("--events must be at least 1")
    return args


class Relay:
    """outboxd run, as a child process with its output in a log file."""

    def __init__(self, binary: str, url: str, database_url: str, schema: str, log_path: str):
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        env = dict(os.environ, DATABASE_URL=database_url, OUTBOXD_SCHEMA=schema)
        # The URL travels in the environment, not argv, so a password in it
        # never shows up in `ps`.
        self.proc = subprocess.Popen([binary, "run", "--url", url], env=env,
                                     stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        # The child writes to the file directly; nothing of ours is buffered.
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def report_death(self) -> None:
        print(f"\noutboxd exited with status {self.proc.returncode}; last lines of {self.log_path}:",
              file=sys.stderr)
        print(self.log_tail(), file=sys.stderr)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (graceful shutdown), wait; SIGKILL only if it hangs."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                print(f"outboxd did not exit {timeout:.0f} s after SIGTERM; killing it", file=sys.stderr)
                self.proc.kill()
                self.proc.wait()
                self._log.close()
                return None
        self._log.close()
        return self.proc.returncode


def enqueue(conn, schema: str, topic: str, payload: dict, key: str | None) -> tuple[int, float]:
    """One event in its own transaction; returns (id, monotonic time right after COMMIT)."""
    with conn.cursor() as cur:
        cur.execute(
            sql.SQL("SELECT {}.enqueue(%s, %s::jsonb, %s)").format(sql.Identifier(schema)),
            (topic, json.dumps(payload), key),
        )
        event_id = cur.fetchone()[0]
    conn.commit()
    return event_id, time.monotonic()


def p90(sorted_values: list[float]) -> float:
    """Nearest-rank 90th percentile."""
    return sorted_values[max(0, math.ceil(0.9 * len(sorted_values)) - 1)]


def main() -> int:
    args = parse_args()
    # Lines in order with stderr, also when piped into a file or CI log.
    sys.stdout.reconfigure(line_buffering=True)
    if not os.access(args.outboxd, os.X_OK):
        sys.exit(f"demo.py: {args.outboxd} not found or not executable; run scripts/build.sh")

    arrivals: "queue.Queue" = queue.Queue()
    rx = Receiver()
    rx.on_request = arrivals.put  # called in the receiver's thread
    rx.start()

    conn = psycopg2.connect(args.database_url)
    relay = Relay(args.outboxd, rx.url, args.database_url, args.schema, args.log)
    ok = True
    try:
        print(f"receiver   {rx.url}")
        print(f"outboxd    pid {relay.proc.pid}, schema {args.schema!r}, log {args.log}")

        # 1. Warm-up: proves LISTEN + claim + HTTP work end to end.
        warm_id, _ = enqueue(conn, args.schema, "demo.warmup", {"warmup": True}, None)
        deadline = time.monotonic() + WARMUP_TIMEOUT_S
        while True:
            if not relay.alive():
                relay.report_death()
                return 1
            if any(r.event_id == warm_id for r in rx.snapshot()):
                break
            if time.monotonic() > deadline:
                print(f"warm-up event {warm_id} not delivered within {WARMUP_TIMEOUT_S:.0f} s; "
                      f"last lines of {args.log}:", file=sys.stderr)
                print(relay.log_tail(), file=sys.stderr)
                return 1
            time.sleep(0.02)
        # Drop the warm-up (and anything older) from the arrival queue.
        while not arrivals.empty():
            arrivals.get_nowait()
        print(f"relay is up (warm-up event {warm_id} delivered)\n")

        # 2. The events: orders going created -> paid -> shipped, one ordering
        #    key per order, so per-key order is visible in the output.
        sent: dict[int, dict] = {}      # id -> {topic, key, payload, t_commit}
        first_seen: dict[int, float] = {}
        duplicates = 0
        foreign = 0                      # ids we did not enqueue (e.g. an older backlog)
        mismatched: list[str] = []
        pending = []                     # arrivals whose commit time is not recorded yet
        printed = 0

        print(f"{'#':>4}  {'event id':>8}  {'topic':<14} {'ordering key':<13} {'latency':>10}")

        def settle(req) -> None:
            nonlocal duplicates, foreign, printed
            eid = req.event_id
            if eid is None or eid == warm_id:
                return
            if eid not in sent:
                pending.append(req)
                return
            if eid in first_seen:
                duplicates += 1
                print(f"{'':>4}  {eid:>8}  (duplicate delivery, attempt {req.headers.get('outbox-attempt', '?')})")
                return
            first_seen[eid] = req.t_monotonic
            ev = sent[eid]
            latency_ms = (req.t_monotonic - ev["t_commit"]) * 1000.0
            ev["latency_ms"] = latency_ms
            printed += 1
            print(f"{printed:>4}  {eid:>8}  {ev['topic']:<14} {ev['key'] or '-':<13} {latency_ms:>7.1f} ms",
                  flush=True)
            try:
                body = json.loads(req.body)
            except ValueError:
                body = None
            if body != ev["payload"]:
                mismatched.append(f"event {eid}: body {req.body[:200]!r} != payload {ev['payload']!r}")
            if req.headers.get("outbox-topic") != ev["topic"]:
                mismatched.append(f"event {eid}: outbox-topic {req.headers.get('outbox-topic')!r} "
                                  f"!= {ev['topic']!r}")

        def drain(until: float) -> None:
            """Print arrivals until the monotonic time `until`."""
            while True:
                # Arrivals that raced ahead of our bookkeeping, now known.
                for req in [r for r in pending if r.event_id in sent]:
                    pending.remove(req)
                    settle(req)
                remaining = until - time.monotonic()
                if remaining <= 0:
                    return
                try:
                    req = arrivals.get(timeout=remaining)
                except queue.Empty:
                    return
                settle(req)

        interval = args.interval_ms / 1000.0
        for i in range(args.events):
            order = i // len(ORDER_STEPS) + 1
            topic = ORDER_STEPS[i % len(ORDER_STEPS)]
            key = f"order-{order}"
            payload = {"order_id": order, "status": topic.split(".", 1)[1], "seq": i}
            eid, t_commit = enqueue(conn, args.schema, topic, payload, key)
            sent[eid] = {"topic": topic, "key": key, "payload": payload, "t_commit": t_commit}
            drain(t_commit + interval)
            if not relay.alive():
                relay.report_death()
                return 1

        # 3. Wait for stragglers.
        deadline = time.monotonic() + args.timeout
        while len(first_seen) < len(sent) and time.monotonic() < deadline and relay.alive():
            drain(min(deadline, time.monotonic() + 0.1))
        drain(time.monotonic() + 0.2)  # catch immediate duplicates, too
        for req in pending:
            if req.event_id not in sent:
                foreign += 1

        # 4. Summary.
        lost = sorted(set(sent) - set(first_seen))
        lat = sorted(ev["latency_ms"] for ev in sent.values() if "latency_ms" in ev)
        print()
        print(f"delivered  {len(first_seen)}/{len(sent)}   lost {len(lost)}   duplicates {duplicates}"
              + (f"   other events {foreign}" if foreign else ""))
        if lat:
            print(f"latency    min {lat[0]:.1f} ms   median {statistics.median(lat):.1f} ms   "
                  f"p90 {p90(lat):.1f} ms   max {lat[-1]:.1f} ms   (commit -> webhook received)")
            if lat[0] < 0:
                print("           (below zero: the webhook arrived before COMMIT returned to this client;"
                      " the commit is visible to the relay a moment before the client hears of it)")
        if lost:
            ok = False
            print(f"LOST: {', '.join(map(str, lost))}", file=sys.stderr)
        if mismatched:
            ok = False
            print("WRONG CONTENT:\n  " + "\n  ".join(mismatched), file=sys.stderr)
        if not relay.alive():
            ok = False
            relay.report_death()
    except KeyboardInterrupt:
        ok = False
        print("\ninterrupted", file=sys.stderr)
    finally:
        # 5. Graceful shutdown must exit 0.
        was_alive = relay.alive()
        status = relay.stop()
        if was_alive:
            if status == 0:
                print("outboxd    SIGTERM -> exited 0 (graceful shutdown)")
            else:
                ok = False
                print(f"outboxd    SIGTERM -> exit status {status} (expected 0); last lines of {args.log}:",
                      file=sys.stderr)
                print(relay.log_tail(), file=sys.stderr)
        conn.close()
        rx.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
