#!/usr/bin/python3
"""Window read cost while a long transaction elsewhere holds back vacuum:
the prototype's counterpart of bench/long_transaction.sh (which measures
today's claim in the real relay).

    bench/windows/long_transaction.py DSN [--hold 300] [--rate 300] [--poll-ms 10]

A paced producer commits --rate events/s (a transaction every 10 ms); a
consumer reads a window every --poll-ms (open_window, fetch_page,
finish_window, as bench/windows/window_drain.py does). After 10 s of load a
REPEATABLE READ transaction takes an xid and a snapshot and holds them for
--hold seconds. Prints the open_window round trip and the whole window's
database time per 15 s from the start of the hold (median and p90), and
checks that every event produced was read, in id order. --checkpoint-s
(default 1): the consumer keeps its cursor in memory (read_window) and
writes it that often; 0: it reads and writes the cursor row at every window
(open_window + finish_window).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import threading
import time

import psycopg2

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from window_drain import install, prepare  # noqa: E402

SCHEMA = "win_longtx"


def producer(dsn: str, rate: int, stop: threading.Event, produced: list[int]) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    per_tick = max(1, rate // 100)
    next_at = time.monotonic()
    while not stop.is_set():
        cur.execute(f"""INSERT INTO "{SCHEMA}".events (topic, payload, ordering_key)
                        SELECT 't', '{{}}', 'k' || (g % 100) FROM generate_series(1, {per_tick}) g""")
        produced[0] += per_tick
        next_at += 0.01
        time.sleep(max(0.0, next_at - time.monotonic()))
    conn.close()


def consumer(dsn: str, poll: float, stop: threading.Event, samples: list, seen: list[int],
             checkpoint: float) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    prepare(cur, SCHEMA)
    last = 0
    cur.execute(f'SELECT snap_a::text FROM "{SCHEMA}".cursors')
    snap_a = cur.fetchone()[0]
    written = time.monotonic()
    while not stop.is_set():
        t0 = time.monotonic()
        if checkpoint:
            cur.execute("EXECUTE read_window(%s, NULL, 0)", (snap_a,))
        else:
            cur.execute("EXECUTE open_window('d', 0, 0)")
        rows = cur.fetchall()
        t1 = time.monotonic()
        snap_b = rows[0][2]
        ids = [r[0] for r in rows if r[0] is not None]
        if ids:
            cur.execute("EXECUTE fetch_page(%s)", (ids,))
            for r in cur.fetchall():
                if r[0] <= last:
                    raise SystemExit(f"{r[0]} after {last}")
                last = r[0]
                seen[0] += 1
        snap_a = snap_b
        if not checkpoint or t0 - written >= checkpoint:
            cur.execute("EXECUTE finish_window('d', 0, 0, %s)", (snap_b,))
            written = t0
        t2 = time.monotonic()
        samples.append((t0, (t1 - t0) * 1e6, (t2 - t0) * 1e6, len(ids)))
        time.sleep(max(0.0, poll - (time.monotonic() - t0)))
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dsn")
    ap.add_argument("--hold", type=int, default=300)
    ap.add_argument("--rate", type=int, default=300)
    ap.add_argument("--poll-ms", type=int, default=10)
    ap.add_argument("--checkpoint-s", type=float, default=1.0,
                    help="keep the cursor in memory and write it this often (0: read and write "
                         "the cursor row at every window)")
    args = ap.parse_args()
    install(args.dsn, SCHEMA)
    admin = psycopg2.connect(args.dsn)
    admin.autocommit = True
    admin.cursor().execute(f"""INSERT INTO "{SCHEMA}".cursors (destination, slot, snap_a)
                               VALUES ('d', 0, pg_current_snapshot())""")
    stop = threading.Event()
    produced, seen, samples = [0], [0], []
    threads = [threading.Thread(target=producer, args=(args.dsn, args.rate, stop, produced)),
               threading.Thread(target=consumer, args=(args.dsn, args.poll_ms / 1000, stop, samples, seen,
                                                   args.checkpoint_s))]
    for t in threads:
        t.start()
    time.sleep(10)  # steady load first
    holder = psycopg2.connect(args.dsn)
    hcur = holder.cursor()
    hcur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    hcur.execute("SELECT txid_current()")
    hcur.execute(f'SELECT count(*) FROM "{SCHEMA}".events')
    hold_start = time.monotonic()
    time.sleep(args.hold)
    holder.commit()
    holder.close()
    time.sleep(5)
    stop.set()
    for t in threads:
        t.join()
    # Whatever the last window did not see yet.
    cur = admin.cursor()
    prepare(cur, SCHEMA)
    cur.execute("EXECUTE open_window('d', 0, 0)")  # from the last checkpoint
    tail = [r for r in cur.fetchall() if r[0] is not None]
    cur.execute(f'SELECT count(*), pg_size_pretty(pg_relation_size(\'"{SCHEMA}".events_txid_idx\')) '
                f'FROM "{SCHEMA}".events')
    total, index_size = cur.fetchone()
    print(f"produced {produced[0]}, read {seen[0]}; {len(tail)} after the last checkpoint; "
          f"table {total} rows (never deleted during the run), txid index {index_size}")
    if seen[0] + len(tail) < produced[0]:
        raise SystemExit("lost events")
    print("window read round trip (open_window, or read_window with --checkpoint-s) and whole window "
          "(read + fetch + checkpoint if due), from the start of the hold:")
    buckets: dict[int, list] = {}
    for t0, ow, whole, n in samples:
        buckets.setdefault(int((t0 - hold_start) // 15), []).append((ow, whole, n))
    for k in sorted(buckets):
        v = buckets[k]
        ow = sorted(x[0] for x in v)
        whole = sorted(x[1] for x in v)
        print(f"  {k * 15:+4d}..{k * 15 + 15:+4d} s  windows {len(v):5d}  events {sum(x[2] for x in v):6d}"
              f"  read median {ow[len(ow) // 2]:6.0f} us p90 {ow[int(len(ow) * 0.9)]:6.0f} us"
              f"  whole median {whole[len(whole) // 2]:6.0f} us p90 {whole[int(len(whole) * 0.9)]:6.0f} us")
    admin.cursor().execute(f'DROP SCHEMA "{SCHEMA}" CASCADE')


if __name__ == "__main__":
    main()
