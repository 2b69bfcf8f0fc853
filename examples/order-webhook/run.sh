#!/usr/bin/env bash
# The order-webhook example in one command, against a throwaway PostgreSQL:
#
#   examples/order-webhook/run.sh            # KEEP=1 keeps the logs
#
# Builds outboxd (the binary only), starts PostgreSQL 15 in a fresh directory
# under /tmp (scripts/pg.sh) with two databases, shop and warehouse, runs
# scenario.py (outboxd migrate and shop.sql in the shop's; the inbox and
# warehouse.sql in the warehouse's; the warehouse service, outboxd run, the
# story), and removes it all.
# Exits non-zero if any order was lost or applied twice.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

"$root/scripts/build.sh" outboxd:executable

work=$(mktemp -d /tmp/outboxd-order-webhook.XXXXXX)
chmod 755 "$work"   # the postgres OS user runs the cluster inside it
cleanup() {
  "$root/scripts/pg.sh" stop "$work/pg" || true
  if [[ ${KEEP:-0} == 1 ]]; then echo "run.sh: kept $work/state" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

url=$("$root/scripts/pg.sh" start "$work/pg" | tail -n 1)
echo "run.sh: throwaway PostgreSQL at $url" >&2

# Two databases: the shop's (with the outbox) and the warehouse's (with the
# inbox), as two services would have.
base=${url%/*}
psql -q "$url" -v ON_ERROR_STOP=1 -c 'CREATE DATABASE shop' -c 'CREATE DATABASE warehouse'

# Not exec: the EXIT trap above must still stop the cluster.
/usr/bin/python3 "$here/scenario.py" --shop-url "$base/shop" --warehouse-url "$base/warehouse" \
  --outboxd "$root/build/outboxd" --workdir "$work/state" "$@"
