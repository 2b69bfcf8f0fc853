#!/usr/bin/env bash
# The slow drain after a drain (bench/NOTES.md, "Database"):
#
#   bench/claim_cliff.sh [--events N] [--state analyze|vacuum|none] [--limit SECONDS] [--no-build]
#
# Starts its own durable PostgreSQL 15 with pg_stat_statements, installs the
# outbox, and drains N events (default 100,000, inserted in one statement)
# with `outboxd run --once --url stdout`. Then it leaves the table's
# statistics in STATE, inserts N more events and drains them the same way:
#   analyze  ANALYZE, as autoanalyze does when it comes round: the outbox
#            is empty, its pages are not (0 rows on N pages)
#   vacuum   VACUUM (TRUNCATE false): the same statistics, as a VACUUM that
#            could not truncate the table records them (deleted rows not
#            yet removable for an older snapshot, or a lock)
#   none     as the first drain left them
# With 0 rows on N pages the planner takes the table for a single row,
# whatever it holds, until the next autovacuum or autoanalyze of it.
# Each drain stops after --limit seconds (default 60; SIGINT, the relay's
# graceful stop). For each drain it prints the deliveries (lines on stdout,
# repeats included), seconds, deliveries a second, the events left in the
# outbox, the relay's claim_us median (its debug log) and its warnings and
# errors, and per statement of the relay's (pg_stat_statements): calls, ms
# and buffers a call.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

events=100000
state=analyze
limit=60
build=1
usage() { sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
  case $1 in
    --events) events=${2:?--events needs a number}; shift 2 ;;
    --state) state=${2:?--state needs analyze, vacuum or none}; shift 2 ;;
    --limit) limit=${2:?--limit needs seconds}; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) usage ;;
    *) echo "claim_cliff.sh: unknown option $1" >&2; usage ;;
  esac
done
[[ $state == analyze || $state == vacuum || $state == none ]] || usage

((build)) && scripts/build.sh >/dev/null
outboxd=$root/build/outboxd

tmp=$(mktemp -d /tmp/outboxd-cliff.XXXXXX)
chmod 755 "$tmp"
pgdir=$tmp/pg
cleanup() { scripts/pg.sh stop "$pgdir" >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
scripts/pg.sh start "$pgdir" >/dev/null
printf "shared_preload_libraries = 'pg_stat_statements'\n" >> "$pgdir/postgresql.conf"
url=$(scripts/pg.sh restart "$pgdir" | tail -1)
psql -X -q "$url" -c "CREATE EXTENSION pg_stat_statements"
"$outboxd" --database-url "$url" migrate 2>/dev/null

sql() { psql -X -q -A -t -v ON_ERROR_STOP=1 "$url" -c "$1"; }
insert() {
  sql "INSERT INTO outbox.events (topic, payload)
       SELECT 't', jsonb_build_object('n', g) FROM generate_series(1, $events) g ORDER BY g"
}
table_stats() {
  sql "SELECT format('events: %s rows in the table, statistics: %s rows on %s pages (file: %s pages)',
                     (SELECT count(*) FROM outbox.events), reltuples, relpages,
                     pg_relation_size('outbox.events') / current_setting('block_size')::int)
       FROM pg_class WHERE oid = 'outbox.events'::regclass"
}
drain() {
  local name=$1 log=$tmp/$1.log out=$tmp/$1.out
  sql "SELECT pg_stat_statements_reset()" >/dev/null
  local t0 t1
  t0=$(date +%s.%N)
  timeout -s INT "$limit" "$outboxd" --database-url "$url" --log-level debug run --once --url stdout \
    >"$out" 2>"$log" || true
  t1=$(date +%s.%N)
  local delivered left
  delivered=$(wc -l <"$out")
  left=$(sql "SELECT count(*) FROM outbox.events")
  grep -o 'claim_us=[0-9]*' "$log" | cut -d= -f2 | sort -n |
    awk -v n="$name" -v d="$delivered" -v l="$left" -v s="$(echo "$t1 - $t0" | bc)" '
      {a[NR] = $1}
      END {printf "%s: %d deliveries in %.1f s, %.0f a second, %d events left in the outbox; " \
                  "%d claims, claim_us median %d\n", n, d, s, d / s, l, NR, NR ? a[int((NR + 1) / 2)] : 0}'
  grep -o 'level=\(warn\|error\) msg="[^"]*"' "$log" | sort | uniq -c | sed 's/^/  log: /' || true
  sql "SELECT format('  %-40s %6s calls %9s ms %9s buffers a call', left(regexp_replace(regexp_replace(query,
                       '^(\s*--[^\n]*\n)*\s*', ''), '\s+', ' ', 'g'), 40), calls,
                     round((total_exec_time / calls)::numeric, 3),
                     round(((shared_blks_hit + shared_blks_read) / calls)::numeric))
       FROM pg_stat_statements
       WHERE calls >= 5 AND query !~* 'pg_stat_statements|^\s*(BEGIN|COMMIT|SET)'
       ORDER BY total_exec_time DESC LIMIT 4"
}

echo "claim_cliff: $events events, state $state, limit ${limit} s, $(git rev-parse --short HEAD)"
insert
drain "first drain "
case $state in
  analyze) sql "ANALYZE outbox.events" ;;
  vacuum) sql "VACUUM (TRUNCATE false) outbox.events" ;;
  none) ;;
esac
table_stats
insert
drain "second drain"
table_stats
