#!/usr/bin/env bash
# The outboxd benchmark (issue 5), one command:
#
#   bench/run.sh [--runs N] [--scenario NAME]... [--relay NAME]... [--quick] [--concurrency N]
#                [--receiver-threads N] [--outboxd-dsn-params P] [--outboxd-wake MODE]
#                [--backlog-count N] [--keep-raw] [--no-build]
#
#   --runs N            runs per scenario and relay; the table shows medians (default 3)
#   --scenario NAME     paced | flat | backlog | many | idle | js-paced | js-backlog
#                       | flat-k100 | backlog-20k | backlog-k100 | backlog-k10
#                       (repeatable; default all but the last four; js-*: into a
#                       JetStream stream; -kN: ordering keys over N keys)
#   --relay NAME        outboxd | outboxd-windows | baseline | windows (repeatable, the order within a
#                       round; default outboxd and baseline; outboxd: as
#                       configured by default (relay.consume = "auto": windows
#                       on the freshly migrated outbox, since sql/0016;
#                       OUTBOXD_CONSUME=claims in the environment for claims);
#                       outboxd-windows: outboxd with relay.consume = "windows";
#                       windows: the commit-ordered windows prototype, bench/windows/)
#   --quick             shortened scenarios for a smoke run (~2 minutes)
#   --backlog-count N   events in every backlog scenario (keyed and -20k ones too)
#   --concurrency N     passed to `outboxd run` (default: outboxd's own)
#   --receiver-threads  threads of the HTTP receiver (default 1)
#   --outboxd-dsn-params P  URI parameters for outboxd's database URL only, to try
#                       a setting (e.g. 'options=-csynchronous_commit%3Doff')
#   --outboxd-wake MODE auto | notify | poll | wal: outboxd's relay.wake, and
#                       `outboxd wake-setup MODE` first (poll: producers commit
#                       trigger-less; wal: the publication)
#   --outboxd-windows-bin PATH  the outboxd binary of relay outboxd-windows
#                       (default build/outboxd): with OUTBOXD_CONSUME=windows in
#                       the environment, --relay outboxd --relay outboxd-windows
#                       interleaves two builds reading windows (before/after)
#   --keep-raw          keep the raw per-event files (printed path under /tmp)
#   --no-build          use the binaries already in build/
#
# It builds outboxd and the bench programs (scripts/build.sh), starts a
# throwaway PostgreSQL 15 with durable commits (fsync and synchronous_commit
# on, as users run it), installs the outbox and the baseline's table, runs
# every scenario for outboxd and for a textbook baseline relay side by side,
# prints a Markdown table of medians with outboxd/baseline ratios, and writes
# it to bench/results/latest.md. The database and raw files are removed on
# exit, whatever happens.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

runs=3
build=1
keep_raw=0
windows=0
outboxd_windows=0
py_args=()
usage() { sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
  case $1 in
    --runs) runs=${2:?--runs needs a number}; shift 2 ;;
    --scenario) py_args+=(--scenario "${2:?--scenario needs a name}"); shift 2 ;;
    --relay) py_args+=(--relay "${2:?--relay needs a name}"); [[ $2 == windows ]] && windows=1
             [[ $2 == outboxd-windows ]] && outboxd_windows=1; shift 2 ;;
    --quick) py_args+=(--quick); shift ;;
    --backlog-count) py_args+=(--backlog-count "${2:?--backlog-count needs a number}"); shift 2 ;;
    --concurrency) py_args+=(--concurrency "${2:?--concurrency needs a number}"); shift 2 ;;
    --receiver-threads) py_args+=(--receiver-threads "${2:?--receiver-threads needs a number}"); shift 2 ;;
    --outboxd-dsn-params) py_args+=(--outboxd-dsn-params "${2:?--outboxd-dsn-params needs a value}"); shift 2 ;;
    --outboxd-wake) export OUTBOXD_WAKE=${2:?--outboxd-wake needs a mode}; py_args+=(--outboxd-wake "$OUTBOXD_WAKE"); shift 2 ;;
    --outboxd-windows-bin) py_args+=(--outboxd-windows-bin "$(realpath "${2:?--outboxd-windows-bin needs a path}")"); shift 2 ;;
    --keep-raw) keep_raw=1; shift ;;
    --no-build) build=0; shift ;;
    -h|--help) usage ;;
    *) echo "run.sh: unknown option $1" >&2; usage ;;
  esac
done

python=/usr/bin/python3
[[ -x $python ]] || python=$(command -v python3)

if ((build)); then
  echo "[bench] building (scripts/build.sh)" >&2
  scripts/build.sh >&2
fi

source scripts/throwaway_pg.sh
# Made by hand, not throwaway_dir: --keep-raw keeps part of it.
work=$(mktemp -d /tmp/outboxd-bench.XXXXXX)
chmod 755 "$work"
pgdir="$work/pg"
raw="$work/raw"
py_pid=

remove_work() {
  if ((keep_raw)); then
    rm -rf "$pgdir"
    echo "[bench] raw files kept in $raw (rebuild the table: $python bench/analyze.py $raw)" >&2
  else
    rm -rf "$work"
  fi
}
stop_orchestrator() {
  if [[ -n $py_pid ]] && kill -0 "$py_pid" 2>/dev/null; then
    kill -TERM "$py_pid" 2>/dev/null || true
    wait "$py_pid" 2>/dev/null || true
  fi
}
on_exit remove_work

echo "[bench] starting PostgreSQL in $pgdir (fsync and synchronous_commit on)" >&2
throwaway_pg_start "$pgdir"
url=$PG_URL
on_exit stop_orchestrator
build/outboxd --database-url "$url" migrate >&2
# OUTBOXD_WAKE (the relay's wake mode, from the environment): what it needs
# in the database, e.g. the publication for wal, no trigger for poll.
[[ -z ${OUTBOXD_WAKE:-} ]] || build/outboxd --database-url "$url" wake-setup "$OUTBOXD_WAKE" >&2
# OUTBOXD_CONSUME likewise (migrate sets the outbox up for windows; claims
# takes that away), and relay outboxd-windows: windows need the txid default
# and its index (then every relay's producers pay for them).
consume=${OUTBOXD_CONSUME:-}
((outboxd_windows)) && consume=windows
[[ -z $consume ]] || build/outboxd --database-url "$url" consume-setup "$consume" >&2
build/bench/outboxd-bench-baseline --database-url "$url" --setup
# The windows prototype's own copy of the outbox (it deletes nothing), plus
# its txid column and cursor.
if ((windows)); then
  build/outboxd --database-url "$url" --schema win migrate >&2
  build/outboxd --database-url "$url" --schema win consume-setup windows >&2
  build/bench/outboxd-bench-windows --database-url "$url" --schema win --setup
fi

# In the background with `wait`, so that a signal runs the trap at once.
"$python" bench/orchestrate.py --database-url "$url" --build-dir build --raw-dir "$raw" \
  --runs "$runs" --results bench/results/latest.md "${py_args[@]+"${py_args[@]}"}" &
py_pid=$!
wait "$py_pid"
