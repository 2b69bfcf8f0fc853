#!/usr/bin/env bash
# Producer cost of sql/0009_windows.sql and of the slot alternatives it
# rejected: 20,000 outbox.enqueue() calls (half of them keyed, 100 keys) in
# one transaction, timed by psql (statement + commit), 3 runs per variant,
# median printed. Needs a durable cluster (scripts/pg.sh start DIR, no --fast).
#   bench/windows/producer_cost.sh URL
set -euo pipefail
url=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
runs=${RUNS:-3}
psql_() { PGOPTIONS="-c client_min_messages=warning" psql -X -q -v ON_ERROR_STOP=1 "$url" "$@"; }

install() {  # schema, migrations up to N
  psql_ -c "DROP SCHEMA IF EXISTS $1 CASCADE" -c "CREATE SCHEMA $1" \
    -c "CREATE TABLE $1.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
  for f in "$root"/sql/000[1-$2]_*.sql; do psql_ -v schema="$1" -1 -f "$f" >/dev/null 2>&1; done
}

run() {  # schema -> "wall_ms cpu_ms" (cpu: the backend's own, from /proc/self/schedstat)
  psql_ -c "TRUNCATE $1.events, $1.idempotency_keys RESTART IDENTITY" -c "VACUUM ANALYZE $1.events" -c "CHECKPOINT"
  psql_ -At <<SQL | tr '\n' ' ' | sed -E 's/^Time: ([0-9.]+) ms[^ ]* *([0-9.]+).*/\1 \2/; s/.*Time: ([0-9.]+) ms.* ([0-9.]+) ?$/\1 \2/'
SELECT split_part(pg_read_file('/proc/self/schedstat'), ' ', 1) AS before \gset
\\timing on
DO \$\$ BEGIN FOR i IN 1..20000 LOOP
    PERFORM $1.enqueue('orders', jsonb_build_object('i', i), CASE WHEN i % 2 = 0 THEN 'k' || (i % 100) END);
  END LOOP; END \$\$;
\\timing off
SELECT round((split_part(pg_read_file('/proc/self/schedstat'), ' ', 1)::bigint - :before) / 1e6, 1);
SQL
}

median() { sort -n | sed -n "$(( (runs + 1) / 2 ))p"; }

install pc8 8
install pc9 9
install pcgen 9
psql_ -c "ALTER TABLE pcgen.events ADD COLUMN slot integer GENERATED ALWAYS AS (hashtext(coalesce(ordering_key, id::text)) & 63) STORED"
install pctrg 9
psql_ -c "ALTER TABLE pctrg.events ADD COLUMN slot integer" \
  -c "CREATE FUNCTION pctrg.set_slot() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN
        NEW.slot := hashtext(coalesce(NEW.ordering_key, NEW.id::text)) & 63; RETURN NEW; END \$\$" \
  -c "CREATE TRIGGER events_slot BEFORE INSERT ON pctrg.events FOR EACH ROW EXECUTE FUNCTION pctrg.set_slot()"

# Rounds interleave the variants, so drift on a shared machine hits them alike.
declare -A wall cpu
for _ in $(seq "$runs"); do
  for s in pc8 pc9 pcgen pctrg; do
    read -r w c < <(run "$s"; echo)
    wall[$s]+="$w "; cpu[$s]+="$c "
  done
done
for s in pc8 pc9 pcgen pctrg; do
  case $s in
    pc8) label="0008 (before)" ;; pc9) label="0009 (txid + index)" ;;
    pcgen) label="0009 + stored generated slot" ;; pctrg) label="0009 + BEFORE trigger slot" ;;
  esac
  # shellcheck disable=SC2086
  printf '%-30s wall median %7.1f ms  backend CPU median %7.1f ms  (cpu: %s)\n' "$label" \
    "$(printf '%s\n' ${wall[$s]} | median)" "$(printf '%s\n' ${cpu[$s]} | median)" "${cpu[$s]% }"
done
for s in pc8 pc9 pcgen pctrg; do psql_ -c "DROP SCHEMA $s CASCADE"; done
