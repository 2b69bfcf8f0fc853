#!/usr/bin/python3
"""Database cost of draining a keyed backlog: the relay's claim and complete
statements alone, no HTTP, one connection, as the relay runs them (generic
plans, the claim session's settings, synchronous_commit off, claims of 128
behind a watermark).

    bench/keyed_drain.py DSN [--events 20000] [--keys 1000] [--runs 3]
                            [--queries src/pg/queries.sql] [--migrations sql]

Installs the outbox from --migrations into a fresh schema per run, commits
--events events spread round-robin over --keys ordering keys (--keys 0: no
key), drains them with claim + complete, and prints each run's drain time
and the median, with the PostgreSQL backend's CPU time per event (read
from /proc: run it on the database's machine). Point --queries/--migrations at another checkout's files
to compare two versions of the SQL on one database.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import time

import psycopg2

ROOT = pathlib.Path(__file__).resolve().parent.parent


def named_blocks(path: pathlib.Path) -> dict[str, str]:
    blocks: dict[str, str] = {}
    name = None
    for line in path.read_text().splitlines():
        m = re.match(r"-- name: (\S+)", line)
        if m:
            name = m.group(1)
            blocks[name] = ""
        elif name:
            blocks[name] += line + "\n"
    return {k: v.strip().rstrip(";") for k, v in blocks.items()}


def backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a PostgreSQL backend on this machine:
    steadier than wall time on a shared machine."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(dsn: str, schema: str, queries: dict[str, str], migrations: list[pathlib.Path],
             events: int, keys: int, size: int) -> tuple[float, float]:
    for m in migrations:
        subprocess.run(["psql", "-q", "-X", "-v", "ON_ERROR_STOP=1", "-v", f"schema={schema}", "-1",
                        "-d", dsn, "-f", str(m)], check=True, stdout=subprocess.DEVNULL)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    q = lambda text: text.replace(':"schema"', f'"{schema}"')  # noqa: E731
    key = "NULL" if keys == 0 else f"'k' || (g % {keys})"
    cur.execute(f"""INSERT INTO "{schema}".events (topic, payload, ordering_key)
                    SELECT 't', '{{}}', {key} FROM generate_series(1, {events}) g""")
    cur.execute(f'VACUUM ANALYZE "{schema}".events')
    for setting in ("SET synchronous_commit = off", "SET plan_cache_mode = force_generic_plan",
                    "SET enable_seqscan = off", "SET enable_bitmapscan = off"):
        cur.execute(setting)
    claim = q(queries["claim"]).replace("LIMIT :claim_size", f"LIMIT {size}")
    cur.execute("PREPARE claim_first AS " + claim.replace("AND :after_watermark", "AND true")
                .replace("WHEN :outside_drain", "WHEN true"))
    cur.execute("PREPARE claim_after AS " + claim.replace(
        "AND :after_watermark", "AND (e.available_at, e.id) > ($3::timestamptz, $4::bigint)")
        .replace("WHEN :outside_drain", "WHEN false"))
    cur.execute("PREPARE complete AS " + q(queries["complete"]))

    cur.execute("SELECT pg_backend_pid()")
    backend = cur.fetchone()[0]
    done = 0
    watermark = None
    cpu_start = backend_cpu(backend)
    start = time.monotonic()
    while True:
        if watermark:
            cur.execute("EXECUTE claim_after('bench', 30000, %s, %s)", watermark)
        else:
            cur.execute("EXECUTE claim_first('bench', 30000)")
        rows = cur.fetchall()
        got = [(r[0], r[5]) for r in rows if r[0] is not None]
        extra = [r for r in rows if r[0] is None][0]
        if got:
            ids = "{" + ",".join(str(i) for i, _ in got) + "}"
            attempts = "{" + ",".join(str(a) for _, a in got) + "}"
            cur.execute("EXECUTE complete(%s, %s, 'bench')", (ids, attempts))
            done += len(cur.fetchall())
        # As the relay: a full claim goes on behind the watermark, anything less starts over.
        watermark = (extra[9], extra[10]) if len(got) == size else None
        if not got and watermark is None and done >= events:
            break
        if not got and done < events and watermark is None:
            # Nothing claimable but not drained: only possible if something is held elsewhere.
            cur.execute(f'SELECT count(*) FROM "{schema}".events')
            if cur.fetchone()[0] == 0:
                break
    elapsed = time.monotonic() - start
    cpu = backend_cpu(backend) - cpu_start
    if done != events:
        raise SystemExit(f"drained {done} of {events} events")
    cur.execute(f'DROP SCHEMA "{schema}" CASCADE')
    conn.close()
    return elapsed, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dsn")
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--queries", type=pathlib.Path, default=ROOT / "src/pg/queries.sql")
    ap.add_argument("--migrations", type=pathlib.Path, default=ROOT / "sql")
    args = ap.parse_args()
    queries = named_blocks(args.queries)
    migrations = sorted(args.migrations.glob("[0-9][0-9][0-9][0-9]_*.sql"))
    times, cpus = [], []
    for run in range(args.runs):
        t, cpu = run_once(args.dsn, f"keyed_drain_{run}", queries, migrations, args.events, args.keys, args.size)
        times.append(t)
        cpus.append(cpu)
        print(f"run {run + 1}: {args.events} events, {args.keys} keys: {t:.2f} s, "
              f"{args.events / t:,.0f} events/s; PostgreSQL CPU {cpu / args.events * 1e6:.1f} us/event")
    med, med_cpu = statistics.median(times), statistics.median(cpus)
    print(f"median: {med:.2f} s, {args.events / med:,.0f} events/s; "
          f"PostgreSQL CPU {med_cpu / args.events * 1e6:.1f} us/event")


if __name__ == "__main__":
    main()
