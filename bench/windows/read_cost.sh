#!/usr/bin/env bash
# Cost of read_window (src/pg/queries.sql) on a 20,000-event window: 200
# transactions of 100 events (half keyed, 100 keys) committed between A and B,
# behind 200,000 older events (committed before A: delivered rows a
# partitioned outbox keeps until its partition goes). EXPLAIN (ANALYZE,
# BUFFERS) of the statement as the store runs it (unprepared) and of its
# generic plan, without a slot filter, with all 64 slots listed, with 32 and
# with 1; 3 runs each, median printed. Durable cluster. The read returns the
# page's bodies and key_pending (probes of deliveries and of the events from
# before windows) and deliveries_due for destination 'hooks'.
#   bench/windows/read_cost.sh URL
# BEHIND=N (default 200000): the older events; KEYED_EVERY=N (default 2):
# every Nth event keyed (1: all, as bench/run.sh's backlog-k100); QUERIES=FILE:
# another version of src/pg/queries.sql.
set -euo pipefail
url=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
runs=${RUNS:-3}
behind=${BEHIND:-200000}
every=${KEYED_EVERY:-2}
s=rc9
# jit = off, as on the relay's sessions (store::relay_session_settings).
psql_() { PGOPTIONS="-c client_min_messages=warning -c jit=off" psql -X -q -v ON_ERROR_STOP=1 "$url" "$@"; }

psql_ -c "DROP SCHEMA IF EXISTS $s CASCADE" -c "CREATE SCHEMA $s" \
  -c "CREATE TABLE $s.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
for f in "$root"/sql/000[1-9]_*.sql; do psql_ -v schema="$s" -1 -f "$f" >/dev/null; done
"$root/build/outboxd" consume-setup windows --print --schema "$s" | psql_ >/dev/null
psql_ -c "DROP TRIGGER events_notify ON $s.events"
psql_ -c "INSERT INTO $s.events (topic, ordering_key, payload) SELECT 't', CASE WHEN g % $every = 0 THEN 'k' || g % 100 END, '{\"n\":1}' FROM generate_series(1, $behind) g"
a=$(psql_ -Atc "SELECT pg_current_snapshot()")
for _ in $(seq 200); do
  echo "INSERT INTO $s.events (topic, ordering_key, payload) SELECT 't', CASE WHEN g % $every = 0 THEN 'k' || g % 100 END, '{\"n\":1}' FROM generate_series(1, 100) g;"
done | psql_ >/dev/null
b=$(psql_ -Atc "SELECT pg_current_snapshot()")
psql_ -c "VACUUM ANALYZE $s.events"

# The statement, for this schema.
sql=$(awk '/^-- name: read_window$/{on=1; next} on && /^-- name:/{exit} on && !/^--/' "${QUERIES:-$root/src/pg/queries.sql}" |
      sed "s/:\"schema\"/$s/g" | sed '/^$/d')
sql=${sql%;}

measure() {  # label slots(SQL) generic(0|1) [done_below limit] -> "label median_ms us/event buffers"
  local label=$1 slots=$2 generic=$3 from=${4:-0} limit=${5:-1000000} out times=() bufs=() n
  for _ in $(seq "$runs"); do
    if ((generic)); then
      out=$(psql_ -c "SET plan_cache_mode = force_generic_plan" \
        -c "PREPARE rw(pg_snapshot, pg_snapshot, bigint, int[], bigint, text[]) AS $sql" \
        -c "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE rw('$a', '$b', $from, $slots, $limit, '{hooks}')" -At)
    else
      out=$(psql_ -At -c "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) $(echo "$sql" | sed "s/\$1::pg_snapshot/'$a'::pg_snapshot/; s/\$2::pg_snapshot/'$b'::pg_snapshot/; s/\$3::bigint/$from::bigint/g; s/\$4::int\[\]/$slots::int[]/g; s/\$5::bigint/$limit::bigint/; s/\$6::text\[\]/'{hooks}'::text[]/")")
    fi
    times+=("$(echo "$out" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Execution Time"])')")
    bufs+=("$(echo "$out" | /usr/bin/python3 -c 'import json,sys; p=json.load(sys.stdin)[0]["Plan"]; print(p["Shared Hit Blocks"]+p["Shared Read Blocks"])')")
  done
  n=$(psql_ -Atc "SELECT least($limit, count(*)) FROM $s.events WHERE txid IS NOT NULL AND id > $behind AND id >= $from AND ($slots::int[] IS NULL OR $s.event_slot(ordering_key, id) = ANY ($slots::int[]))")
  local med
  med=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (runs + 1) / 2 ))p")
  printf '%-34s %6s events  median %7.2f ms  %5.2f us/window event  buffers %s  (ms: %s)\n' "$label" "$n" "$med" \
    "$(echo "$med * 1000 / 20000" | bc -l)" "${bufs[0]}" "${times[*]}"
}

all=$(seq -s, 0 63); half=$(seq -s, 0 2 63)
for g in 0 1; do
  kind=$([[ $g == 1 ]] && echo "generic" || echo "custom")
  measure "$kind, no slot filter" "NULL" $g
  measure "$kind, all 64 slots listed" "'{$all}'" $g
  measure "$kind, 32 slots" "'{$half}'" $g
  measure "$kind, 1 slot" "'{7}'" $g
done
# Chunks of 1,000 (same A and B): the first one, one from the middle and the
# last one (done_below = the 10,001st and 19,001st id of the window).
measure "custom, chunk 1000, first" "NULL" 0 0 1000
measure "custom, chunk 1000, middle" "NULL" 0 $((behind + 10001)) 1000
measure "custom, chunk 1000, last" "NULL" 0 $((behind + 19001)) 1000
echo "plan (custom, as the relay runs it, no filter):"
psql_ -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) $(echo "$sql" | sed "s/\$1::pg_snapshot/'$a'::pg_snapshot/; s/\$2::pg_snapshot/'$b'::pg_snapshot/; s/\$3::bigint/0::bigint/g; s/\$4::int\[\]/NULL::int[]/g; s/\$5::bigint/1000000::bigint/; s/\$6::text\[\]/'{hooks}'::text[]/")"
echo "plan (generic, no filter):"
psql_ -c "SET plan_cache_mode = force_generic_plan" -c "PREPARE rw(pg_snapshot, pg_snapshot, bigint, int[], bigint, text[]) AS $sql" \
  -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) EXECUTE rw('$a', '$b', 0, NULL, 1000000, '{hooks}')"
psql_ -c "DROP SCHEMA $s CASCADE"
