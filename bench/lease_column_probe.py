#!/usr/bin/env python3
"""Under a held transaction: what the next-due lookup costs when a lease
writes its end into available_at (today) and when it writes it into a
column of its own (a possible schema change, not in sql/).

    bench/lease_column_probe.py DATABASE_URL

Installs two copies of the outbox (schemas lease_probe_a and lease_probe_b,
dropped first) with build/outboxd migrate, adds lease_until to the second
(fillfactor 80), and in each: 12,800 events, then 100 claims of 128 and the
delete of each claim's events, all while another session holds a REPEATABLE
READ transaction with an xid; then EXPLAIN (ANALYZE, BUFFERS) of the
next-due lookup of the claim statement (src/pg/queries.sql). A throwaway
database only: it drops the two schemas.
"""
import statistics
import subprocess
import sys
import time

import psycopg2

url = sys.argv[1]
LOOKUP = ("SELECT available_at FROM {s}.events WHERE available_at > now() AND available_at < 'infinity' "
          "ORDER BY available_at LIMIT 1")


def install(schema: str, own_column: bool) -> None:
    c = psycopg2.connect(url)
    c.autocommit = True
    c.cursor().execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    subprocess.run(["build/outboxd", "migrate", "--database-url", url, "--schema", schema],
                   check=True, capture_output=True)
    if own_column:
        c.cursor().execute(f"ALTER TABLE {schema}.events ADD COLUMN lease_until timestamptz, SET (fillfactor = 80)")
    c.close()


def probe(schema: str, own_column: bool) -> None:
    install(schema, own_column)
    hold = psycopg2.connect(url)
    hold.set_session(isolation_level="REPEATABLE READ")
    hold.cursor().execute(f"SELECT pg_current_xact_id(), (SELECT count(*) FROM {schema}.events)")
    c = psycopg2.connect(url)
    c.autocommit = True
    cur = c.cursor()
    cur.execute(f"INSERT INTO {schema}.events (topic, payload) SELECT 't', '{{}}' FROM generate_series(1, 12800)")
    lease = "lease_until" if own_column else "available_at"
    claim = (f"UPDATE {schema}.events SET {lease} = now() + interval '30 seconds', lease_owner = 'r', "
             f"attempts = attempts + 1 WHERE id IN (SELECT id FROM {schema}.events WHERE available_at <= now() "
             f"AND lease_owner IS NULL ORDER BY available_at, id LIMIT 128 FOR UPDATE SKIP LOCKED) RETURNING id")
    took = []
    for _ in range(100):
        t = time.perf_counter()
        cur.execute(claim)
        ids = [r[0] for r in cur.fetchall()]
        took.append(time.perf_counter() - t)
        cur.execute(f"DELETE FROM {schema}.events WHERE id = ANY(%s)", (ids,))
    cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + LOOKUP.format(s=schema))
    plan = cur.fetchone()[0][0]
    scan = plan["Plan"]["Plans"][0]
    print(f"{'own column' if own_column else 'available_at'}: next-due lookup {plan['Execution Time']:.2f} ms, "
          f"heap fetches {scan.get('Heap Fetches')}, buffers {scan['Shared Hit Blocks'] + scan['Shared Read Blocks']}; "
          f"claims of 128 (from the start of the index) median {statistics.median(took) * 1e3:.2f} ms")
    hold.rollback()
    hold.close()
    cur.execute(f"DROP SCHEMA {schema} CASCADE")


probe("lease_probe_a", False)
probe("lease_probe_b", True)
