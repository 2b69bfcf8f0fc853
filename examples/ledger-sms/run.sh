#!/usr/bin/env bash
# The ledger-sms example in one command, against a throwaway PostgreSQL:
#
#   examples/ledger-sms/run.sh            # KEEP=1 keeps the gateway's files and the relay's log
#
# Builds outboxd (the binary only), starts PostgreSQL 15 in a fresh directory
# under /tmp (scripts/pg.sh), runs scenario.py (outboxd migrate, ledger.sql,
# the SMS gateway stand-in, outboxd run, the story), and removes it all.
# Exits non-zero if any deposit's text was lost or sent twice.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

"$root/scripts/build.sh" outboxd:executable

work=$(mktemp -d /tmp/outboxd-ledger-sms.XXXXXX)
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

# Not exec: the EXIT trap above must still stop the cluster.
/usr/bin/python3 "$here/scenario.py" --database-url "$url" --outboxd "$root/build/outboxd" \
  --workdir "$work/state" "$@"
