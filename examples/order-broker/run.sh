#!/usr/bin/env bash
# The order-broker example in one command, against a throwaway PostgreSQL and
# a throwaway nats-server:
#
#   examples/order-broker/run.sh            # KEEP=1 keeps the logs
#
# Builds outboxd (the binary only), starts PostgreSQL 15 in a fresh directory
# under /tmp (scripts/pg.sh) and nats-server with JetStream (its store in the
# same directory), runs scenario.py (outboxd migrate, shop.sql, the ORDERS
# stream, outboxd run, the consumer, the story), and removes it all.
# Exits non-zero if any order's events were lost, repeated or out of order.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
nats_server=${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}

"$root/scripts/build.sh" outboxd:executable

work=$(mktemp -d /tmp/outboxd-order-broker.XXXXXX)
chmod 755 "$work"   # the postgres OS user runs the cluster inside it
nats_pid=
cleanup() {
  if [[ -n $nats_pid ]]; then kill "$nats_pid" 2>/dev/null && wait "$nats_pid" 2>/dev/null || true; fi
  "$root/scripts/pg.sh" stop "$work/pg" || true
  if [[ ${KEEP:-0} == 1 ]]; then echo "run.sh: kept $work/state" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

url=$("$root/scripts/pg.sh" start "$work/pg" | tail -n 1)
echo "run.sh: throwaway PostgreSQL at $url" >&2

port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$work/state"
"$nats_server" -a 127.0.0.1 -p "$port" -js -sd "$work/nats" >"$work/state/nats-server.log" 2>&1 &
nats_pid=$!
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  kill -0 "$nats_pid" 2>/dev/null || { cat "$work/state/nats-server.log" >&2; exit 1; }
  sleep 0.1
done
echo "run.sh: throwaway nats-server (JetStream) at nats://127.0.0.1:$port" >&2

# Not exec: the EXIT trap above must still stop the servers.
/usr/bin/python3 "$here/scenario.py" --database-url "$url" --nats-url "nats://127.0.0.1:$port" \
  --outboxd "$root/build/outboxd" --workdir "$work/state" "$@"
