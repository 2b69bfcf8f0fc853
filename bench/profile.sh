#!/usr/bin/env bash
# Where PostgreSQL's time goes, per statement, in two of the benchmark's
# situations — the timing breakdown behind the README's Performance notes.
#
#   bench/profile.sh backlog [N]   N events (default 100000) queued, then one relay drains them
#   bench/profile.sh paced         1000 events at 200/s, one per transaction
#
# Starts its own durable PostgreSQL with pg_stat_statements (planning time
# tracked), the bench receiver and build/outboxd, then prints per statement:
# calls, planning and execution time per call, rows per call, and µs per
# event. `paced` also prints the relay's own stages (its debug log: claim
# queued, claim round trip, hand-off to the event loop, HTTP request).
# Builds nothing: run bench/run.sh or scripts/build.sh first. Removes its
# cluster on exit. Environment: KEYS=K (backlog: ordering keys round-robin
# over K keys), OUTBOXD_BIN (another build), OUTBOXD_CONSUME=windows (the
# relay reads windows), MIN_CALLS (statements called fewer times are left
# out; default 11: a window read of a backlog is called a few times).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
[[ $mode == backlog || $mode == paced ]] || { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
n=${2:-100000}
keys=${KEYS:-0}
outboxd=${OUTBOXD_BIN:-build/outboxd}

source scripts/throwaway_pg.sh
throwaway_dir dir outboxd-profile
pgdir=$dir/pg
relay_pid=
receiver_pid=
stop_children() {
  [[ -n $relay_pid ]] && kill "$relay_pid" 2>/dev/null || true
  [[ -n $receiver_pid ]] && kill "$receiver_pid" 2>/dev/null || true
}

throwaway_pg_start "$pgdir"
scripts/pg.sh stop "$pgdir" >/dev/null
printf "shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track_planning = on\n" \
  >> "$pgdir/postgresql.conf"
url=$(scripts/pg.sh start "$pgdir" | tail -1)
on_exit stop_children
psql -X -q "$url" -c "CREATE EXTENSION pg_stat_statements"
build/outboxd migrate --database-url "$url" --schema outbox 2>/dev/null
# Claims unless OUTBOXD_CONSUME says otherwise (the profiles so far are of
# claims); migrate sets the outbox up for windows (sql/0016).
export OUTBOXD_CONSUME=${OUTBOXD_CONSUME:-claims}
build/outboxd consume-setup "$OUTBOXD_CONSUME" --database-url "$url" --schema outbox >/dev/null

build/bench/outboxd-bench-receiver --port-file "$dir/port" --threads 1 >"$dir/receiver.log" 2>&1 &
receiver_pid=$!
for _ in $(seq 50); do [[ -s $dir/port ]] && break; sleep 0.1; done
port=$(cat "$dir/port")

if [[ $mode == backlog ]]; then
  psql -X -q "$url" -c "INSERT INTO outbox.events (topic, ordering_key, payload)
                        SELECT 'orders.created', CASE WHEN $keys > 0 THEN 'k' || g % greatest($keys, 1) END,
                               '{\"order\": 1}'
                        FROM generate_series(1, $n) g" -c "VACUUM ANALYZE outbox.events"
  psql -X -q "$url" -c "SELECT pg_stat_statements_reset()" >/dev/null
  start=$(date +%s.%N)
  "$outboxd" --log-level warn run --database-url "$url" --url "http://127.0.0.1:$port/" &
  relay_pid=$!
  while [[ $(psql -X -qtA "$url" -c 'SELECT count(*) FROM outbox.events') != 0 ]]; do sleep 0.2; done
  echo "drained $n events in $(echo "$(date +%s.%N) - $start" | bc) s"
else
  n=1000
  "$outboxd" --log-level debug run --database-url "$url" --url "http://127.0.0.1:$port/" 2>"$dir/relay.log" &
  relay_pid=$!
  sleep 1
  psql -X -q "$url" -c "SELECT pg_stat_statements_reset()" >/dev/null
  /usr/bin/python3 - "$url" <<'PY'
import sys, time, psycopg2
conn = psycopg2.connect(sys.argv[1])
cur = conn.cursor()
due = time.monotonic()
for _ in range(1000):
    cur.execute("SELECT outbox.enqueue('t', '{}')")
    conn.commit()
    due += 0.005
    time.sleep(max(0.0, due - time.monotonic()))
PY
  sleep 1
fi
kill -TERM "$relay_pid"; wait "$relay_pid" || true; relay_pid=

psql -X "$url" -c "
  SELECT calls,
         round((total_plan_time / calls)::numeric * 1000) AS plan_us_per_call,
         round((total_exec_time / calls)::numeric * 1000) AS exec_us_per_call,
         round(rows::numeric / calls, 1) AS rows_per_call,
         round(((total_plan_time + total_exec_time) * 1000 / $n)::numeric, 1) AS us_per_event,
         left(regexp_replace(query, '\s+', ' ', 'g'), 60) AS statement
  FROM pg_stat_statements
  WHERE calls >= ${MIN_CALLS:-11} AND query NOT LIKE 'SELECT count(*) FROM outbox.events%'
  ORDER BY total_plan_time + total_exec_time DESC LIMIT 8"
if [[ $mode == paced ]]; then
  # The relay's side of one event's way, from its debug log (medians):
  # queued = wake to the claim thread picking the claim up, claim = the claim
  # statement's round trip, handoff = claim thread back to the event loop,
  # http = request written to response read. What the benchmark's latency
  # adds to their sum is NOTIFY delivery and the receiver's own wake-up.
  median() { sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
  field() { grep -o "msg=$1 .*" "$dir/relay.log" | grep -o " $2=[0-9]*" | cut -d= -f2; }
  echo "relay stages, median us: queued $(field claimed queued_us | median)" \
       "claim $(field claimed claim_us | median) handoff $(field claimed handoff_us | median)" \
       "http $(field delivered us | median) ($(field claimed claim_us | wc -l) claims)"
fi
