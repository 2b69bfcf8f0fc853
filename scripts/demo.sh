#!/usr/bin/env bash
# The demo: a live relay delivering webhooks, with commit-to-delivery latency.
#
#   scripts/demo.sh                    # throwaway PostgreSQL, 20 events
#   scripts/demo.sh --events 100       # arguments go to scripts/demo.py
#   DATABASE_URL=postgresql://... scripts/demo.sh
#
# Without DATABASE_URL it starts a throwaway PostgreSQL 15 (durable settings,
# fsync on, like production) in a fresh directory under /tmp and removes it on
# exit. With DATABASE_URL it uses that database and, unless OUTBOXD_SCHEMA is
# set, the schema "outbox_demo" — so a relay already serving the real "outbox"
# schema there is neither disturbed nor competing for the demo's events.
# Then: outboxd migrate, and scripts/demo.py (receiver + `outboxd run` +
# enqueue + report). Exits non-zero if an event was lost.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# The binary only: tests and benchmarks are not needed to watch it run.
"$root/scripts/build.sh" outboxd:executable

if [[ -z ${DATABASE_URL:-} ]]; then
  source "$root/scripts/throwaway_pg.sh"
  throwaway_dir pgdir outboxd-demo
  throwaway_pg_start "$pgdir"
  DATABASE_URL=$PG_URL
  echo "demo.sh: throwaway PostgreSQL at $DATABASE_URL" >&2
else
  export OUTBOXD_SCHEMA=${OUTBOXD_SCHEMA:-outbox_demo}
fi
export DATABASE_URL
export OUTBOXD_SCHEMA=${OUTBOXD_SCHEMA:-outbox}

echo "demo.sh: outboxd migrate (schema $OUTBOXD_SCHEMA)" >&2
build/outboxd migrate

# Not exec: the EXIT trap above must still stop the cluster.
/usr/bin/python3 "$root/scripts/demo.py" --outboxd "$root/build/outboxd" "$@"
