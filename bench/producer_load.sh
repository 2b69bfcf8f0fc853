#!/usr/bin/env bash
# What the outbox's wake-up costs the application's writes (issue 13): the
# commit rate of producers, each transaction one business row plus (in all
# modes but `none`) one `outbox.enqueue(...)`, measured with pgbench on a
# durable cluster (fsync and synchronous_commit on).
#
#   bench/producer_load.sh [--clients "1 8 32 64"] [--seconds 10] [--runs 3]
#                          [--modes "none no-wake notify auto-busy auto-live poll-live wal"]
#                          [--wal-level logical|replica]
#
# Modes (what the producers' transactions pay for):
#   none        no outbox: the business row alone
#   no-wake     the outbox without any wake-up trigger (`outboxd wake-trigger
#               remove`; what `relay.wake = "poll"` needs)
#   notify      the trigger, with a relay declared idle: every commit notifies
#               (what a `relay.wake = "notify"` relay asks for, and what
#               every commit paid before migration 0007)
#   auto-busy   the trigger, with the only relay declared busy: producers
#               read the declaration and do not notify
#   auto-live   the trigger with a real `relay.wake = "auto"` relay running
#               (stdout sink to /dev/null), deciding for itself
#   auto-windows  auto-live with the relay reading commit-ordered windows
#               (`relay.consume = "windows"`, the default consumption since
#               sql/0016; not in the default modes)
#   no-wake-windows, poll-windows  no-wake and poll-live on an outbox set up
#               for windows (producers pay the txid default and its index),
#               the relay reading windows: auto-windows's baselines (not in
#               the default modes)
#   poll-live   no trigger, a real `relay.wake = "poll"` relay running: what
#               a relay's own claims and deliveries cost producers here
#   wal         no trigger, the publication (`outboxd wake-setup wal`) and a
#               real `relay.wake = "wal"` relay streaming from its slot
#               (needs wal_level = logical, the cluster's default here)
#   wal-windows  wal with the relay reading windows, on an outbox set up
#               for them (its baseline is no-wake-windows)
# No relay runs in the other modes: their producer cost does not depend on
# one, and a relay's CPU would be charged to them on a small machine.
# --wal-level: the cluster's wal_level (default logical; replica to see
# what logical costs by itself, e.g. --modes "none no-wake").
#
# Prints a Markdown table: median commits/s of `runs` rounds (each runs
# every mode and client count once) per mode and client count, and each
# mode's ratio to `no-wake` (the same transactions with no wake mechanism at
# all; a *-windows mode's to `no-wake-windows` when that ran). A second
# table gives the CPU time each commit cost the machine (PostgreSQL's
# processes, pgbench, and the relay if one runs), median per mode, and
# no-wake's figure divided by the mode's: on a machine whose cores
# the producers saturate, that is the commit rate the mode leaves them, and
# unlike the rate it does not move with what else runs on a shared machine.
# The outbox tables are emptied before every run. Builds nothing
# (scripts/build.sh first); uses build/outboxd, or $OUTBOXD_BIN. The cluster
# is removed on exit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

clients="1 8 32 64"
seconds=10
runs=3
modes="none no-wake notify auto-busy auto-live poll-live wal"
wal_level=logical
usage() { sed -n '2,50p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
  case $1 in
    --clients) clients=${2:?}; shift 2 ;;
    --seconds) seconds=${2:?}; shift 2 ;;
    --runs) runs=${2:?}; shift 2 ;;
    --modes) modes=${2:?}; shift 2 ;;
    --wal-level) wal_level=${2:?}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "producer_load.sh: unknown argument: $1" >&2; usage ;;
  esac
done
[[ $wal_level == logical || " $modes " != *" wal"[" -"]* ]] || { echo "producer_load.sh: mode wal needs --wal-level logical" >&2; exit 2; }
outboxd=${OUTBOXD_BIN:-$root/build/outboxd}
[[ -x $outboxd ]] || { echo "producer_load.sh: build first (scripts/build.sh)" >&2; exit 1; }
pgbench=${PG_BINDIR:-/usr/lib/postgresql/15/bin}/pgbench

source scripts/throwaway_pg.sh
throwaway_dir dir outboxd-producer-load
throwaway_pg_start "$dir/pg" "--wal-level=$wal_level"
url=$PG_URL
relay_pid=
stop_relay() {
  [[ -n $relay_pid ]] || return 0
  kill "$relay_pid" 2>/dev/null || true
  wait "$relay_pid" 2>/dev/null || true
  relay_pid=
}
on_exit stop_relay

psql_q() { psql -X -q -v ON_ERROR_STOP=1 "$url" "$@"; }
postmaster=$(head -1 "$dir/pg/postmaster.pid")
# Clock ticks of CPU used so far by the cluster (the postmaster, its live
# children, and the children it has reaped: pgbench's backends exit with it)
# and by the relay, if one runs.
cpu_ticks() {
  local t p
  t=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$postmaster/stat")
  for p in $(pgrep -P "$postmaster") ${relay_pid:-}; do
    t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo "$t"
}
hz=$(getconf CLK_TCK)
"$outboxd" migrate --database-url "$url" --schema outbox >/dev/null 2>&1
psql_q -c "CREATE TABLE bench_orders (id bigserial PRIMARY KEY, amount integer NOT NULL, at timestamptz NOT NULL DEFAULT now())"

cat > "$dir/none.sql" <<'EOF'
\set amount random(1, 100000)
BEGIN;
INSERT INTO bench_orders (amount) VALUES (:amount);
COMMIT;
EOF
cat > "$dir/outbox.sql" <<'EOF'
\set amount random(1, 100000)
BEGIN;
INSERT INTO bench_orders (amount) VALUES (:amount);
SELECT outbox.enqueue('order.created', jsonb_build_object('amount', :amount));
COMMIT;
EOF

# The consumption a mode's outbox is set up for, and its relay runs in.
consume_of() { [[ $1 == *-windows ]] && echo windows || echo claims; }

# Each mode: its database state, its script, whether a relay runs.
set_up_mode() {
  stop_relay
  psql_q -c "TRUNCATE bench_orders, outbox.events, outbox.deliveries, outbox.relay_wake"
  case $1 in
    none|no-wake*|poll-*) "$outboxd" wake-setup poll --database-url "$url" --schema outbox >/dev/null 2>&1 ;;
    wal*) "$outboxd" wake-setup wal --database-url "$url" --schema outbox >/dev/null 2>&1 ;;
    *) "$outboxd" wake-setup auto --database-url "$url" --schema outbox >/dev/null 2>&1 ;;
  esac
  # Only a windows relay's producers pay for the txid default and its index.
  "$outboxd" consume-setup "$(consume_of "$1")" \
    --database-url "$url" --schema outbox >/dev/null
  case $1 in
    notify) psql_q -c "INSERT INTO outbox.relay_wake (owner, idle, until) VALUES ('bench', true, 'infinity')" ;;
    auto-busy) psql_q -c "INSERT INTO outbox.relay_wake (owner, idle, until) VALUES ('bench', false, 'infinity')" ;;
    auto-live|auto-windows)
      OUTBOXD_CONSUME=$(consume_of "$1") \
      OUTBOXD_WAKE=auto "$outboxd" run --database-url "$url" --schema outbox --url stdout --log-level warn \
        >/dev/null 2>"$dir/relay.log" &
      relay_pid=$!
      # Started: its LISTEN is up and it has declared itself.
      for _ in $(seq 100); do
        [[ $(psql_q -Atc "SELECT count(*) FROM outbox.relay_wake") == 1 ]] && break
        sleep 0.1
      done
      ;;
    poll-live|poll-windows|wal|wal-windows)
      OUTBOXD_CONSUME=$(consume_of "$1") \
      OUTBOXD_WAKE=${1%-*} "$outboxd" run --database-url "$url" --schema outbox --url stdout --log-level info \
        >/dev/null 2>"$dir/relay.log" &
      relay_pid=$!
      # Started: claiming (poll) or streaming from its slot (wal).
      for _ in $(seq 100); do
        grep -q "$([[ $1 == wal* ]] && echo "WAL stream started" || echo "relay started")" "$dir/relay.log" && break
        sleep 0.1
      done
      ;;
  esac
  psql_q -c "CHECKPOINT"
}

# Warm-up: a new cluster creates (and zero-fills) its WAL segments as it
# goes, which makes whatever runs first look slow; later runs recycle them.
psql_q -c "ALTER SYSTEM SET min_wal_size = '1GB'" -c "SELECT pg_reload_conf()" >/dev/null
"$pgbench" -n -f "$dir/outbox.sql" -c 8 -j 4 -T "$((seconds * 2))" "$url" >/dev/null 2>&1

script_of() { [[ $1 == none ]] && echo "$dir/none.sql" || echo "$dir/outbox.sql"; }

# Rounds: every mode and client count once per round, so that a slow spell
# of the machine (other work, a disk busy elsewhere) falls on all modes
# alike rather than on whichever mode ran then.
declare -A rates median cpus cpu_median
for ((r = 1; r <= runs; r++)); do
  for c in $clients; do
    for mode in $modes; do
      set_up_mode "$mode"
      before=$(cpu_ticks)
      out=$(/usr/bin/time -f 'pgbench_cpu %U %S' "$pgbench" -n -f "$(script_of "$mode")" -c "$c" \
              -j "$((c < 4 ? c : 4))" -T "$seconds" "$url" 2>&1)
      sleep 0.3  # the postmaster reaps the exited backends
      after=$(cpu_ticks)
      tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -1)
      [[ -n $tps ]] || { echo "producer_load.sh: pgbench failed ($mode, $c clients)" >&2; exit 1; }
      commits=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out" | head -1)
      pgbench_cpu=$(sed -n 's/^pgbench_cpu //p' <<<"$out" | awk '{print $1 + $2}')
      us=$(awk -v b="$before" -v a="$after" -v hz="$hz" -v n="$commits" -v pb="$pgbench_cpu" \
             'BEGIN {printf "%.1f", ((a - b) / hz + pb) * 1e6 / n}')
      rates[$mode,$c]+="$tps "
      cpus[$mode,$c]+="$us "
      echo "round $r c=$c $mode: $tps tps, $us us of CPU a commit" >&2
    done
  done
done
for mode in $modes; do
  for c in $clients; do
    median[$mode,$c]=$(printf '%s\n' ${rates[$mode,$c]} | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    cpu_median[$mode,$c]=$(printf '%s\n' ${cpus[$mode,$c]} | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  done
done
stop_relay

header="| mode |"
rule="|---|"
for c in $clients; do header+=" $c conn |"; rule+="---:|"; done
# One table of an array by (mode,clients), each cell with its ratio to
# no-wake: `rate` is the mode's figure over no-wake's (rounded figures),
# `cost` no-wake's over the mode's.
print_table() {
  local -n values=$1
  local ratio=$2 mode c m line base
  echo "$header"
  echo "$rule"
  for mode in $modes; do
    line="| $mode |"
    for c in $clients; do
      m=${values[$mode,$c]}
      [[ $ratio == rate ]] && m=$(printf '%.0f' "$m")
      base=no-wake
      [[ $mode == *-windows && -n ${values[no-wake-windows,$c]:-} ]] && base=no-wake-windows
      if [[ -n ${values[$base,$c]:-} && $mode != "$base" ]]; then
        line+=" $m ($(awk -v a="${values[$mode,$c]}" -v b="${values[$base,$c]}" -v r="$ratio" \
                         'BEGIN {printf "%.2f", r == "rate" ? a / b : b / a}')×) |"
      else
        line+=" $m |"
      fi
    done
    echo "$line"
  done
}
print_table median rate
echo
echo "commits/s, median of $runs runs of ${seconds}s each; (×): ratio to no-wake (no-wake-windows for a *-windows mode, when it ran); wal_level = $wal_level; $(nproc) CPUs; $(date -u +%F)"
echo
print_table cpu_median cost
echo
echo "µs of CPU a commit (PostgreSQL + pgbench + relay), median of $runs; (×): no-wake's CPU a commit / the mode's"
