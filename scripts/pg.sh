#!/usr/bin/env bash
# Throwaway PostgreSQL 15 clusters for tests, benchmarks and the demo.
#
#   scripts/pg.sh [--fast] [--wal-level=L] start DIR [PORT]
#                                             initdb DIR if it holds no cluster,
#                                             start it, print its URL (last line)
#   scripts/pg.sh stop DIR                    fast shutdown; fine if not running
#   scripts/pg.sh restart DIR                 stop + start on the same port
#   scripts/pg.sh url DIR                     print the URL
#   scripts/pg.sh status DIR                  exit 0 if running, 3 if not
#
# DIR is the data directory itself; the server log is DIR/server.log and the
# Unix socket lives in DIR. Put DIR under /tmp (e.g. `mktemp -d`): as root the
# server runs as the `postgres` OS user (initdb refuses root), so every parent
# of DIR must be traversable by that user; pg.sh hands DIR itself to postgres.
#
# PORT omitted: the cluster's recorded port when it has one and it is free,
# otherwise a free port picked by the kernel (retried if another process grabs
# it before the server binds). `start` (re)writes a marked block of settings at
# the end of DIR/postgresql.conf — never `pg_ctl -o`, whose options a later
# stop/start forgets and the cluster comes back on 5432. `restart` keeps the
# block exactly as it is.
#
# --fast (or OUTBOXD_PG_FAST=1): fsync, synchronous_commit and
# full_page_writes off. For tests only: a crash of the machine loses the
# cluster. Benchmarks and the demo keep the defaults (durable commits).
#
# --wal-level=L (or OUTBOXD_PG_WAL_LEVEL=L): replica or logical (the
# default: relay.wake = "wal" needs it). `start` writes it, so a cluster
# started again with another level comes up with that one.
#
# Environment: PG_BINDIR (default /usr/lib/postgresql/15/bin).
set -euo pipefail

bindir=${PG_BINDIR:-/usr/lib/postgresql/15/bin}
fast=${OUTBOXD_PG_FAST:-0}
[[ $fast == 1 ]] || fast=0
wal_level=${OUTBOXD_PG_WAL_LEVEL:-logical}

usage() {
  sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() { echo "pg.sh: $*" >&2; exit 1; }

args=()
for a in "$@"; do
  case $a in
    --fast) fast=1 ;;
    --wal-level=*) wal_level=${a#--wal-level=} ;;
    -h|--help) usage ;;
    *) args+=("$a") ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
(($# >= 2)) || usage
[[ $wal_level == replica || $wal_level == logical ]] || die "--wal-level must be replica or logical: $wal_level"
cmd=$1
dir=$2
port_arg=${3:-}
[[ -z $port_arg || $port_arg =~ ^[0-9]+$ ]] || die "PORT must be a number: $port_arg"

# Absolute path: the server, pg_ctl and the socket setting all need one.
case $dir in
  /*) ;;
  *) dir="$PWD/$dir" ;;
esac
dir=${dir%/}
conf="$dir/postgresql.conf"
log="$dir/server.log"

# Run a PostgreSQL program as the cluster's owner. As root that is the
# `postgres` OS user, from /tmp so it never starts in a directory it cannot read.
as_owner() {
  if ((EUID == 0)); then
    (cd /tmp && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

have_cluster() { [[ -f $dir/PG_VERSION ]]; }

is_running() {
  have_cluster || return 1
  as_owner "$bindir/pg_ctl" -D "$dir" status >/dev/null 2>&1
}

recorded_port() {
  [[ -f $conf ]] || return 0
  # Last assignment wins, as in PostgreSQL itself.
  sed -n -E "s/^[[:space:]]*port[[:space:]]*=[[:space:]]*'?([0-9]+)'?.*/\1/p" "$conf" | tail -n 1
}

pick_python() {
  if [[ -x /usr/bin/python3 ]]; then echo /usr/bin/python3; else command -v python3; fi
}

# A port nothing listens on right now (the kernel's choice for port 0).
free_port() {
  "$(pick_python)" -c '
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
'
}

# SO_REUSEADDR as PostgreSQL binds: a port left in TIME_WAIT (the server
# closed connections when it stopped) is free for it, so the cluster keeps it.
port_is_free() {
  "$(pick_python)" - "$1" <<'PY'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
PY
}

url_for() { echo "postgresql://postgres@127.0.0.1:$1/postgres"; }

# postgresql.conf quoting: single quotes, embedded ones doubled.
conf_quote() { printf "'%s'" "${1//\'/\'\'}"; }

begin_mark='# >>> scripts/pg.sh settings (rewritten by `pg.sh start`) >>>'
end_mark='# <<< scripts/pg.sh settings <<<'

write_settings() {
  local port=$1 tmp
  tmp=$(mktemp)
  # Drop an earlier block, then append a fresh one.
  awk -v b="$begin_mark" -v e="$end_mark" '
    $0 == b { skip = 1; next }
    $0 == e { skip = 0; next }
    !skip' "$conf" >"$tmp"
  {
    echo "$begin_mark"
    echo "listen_addresses = '127.0.0.1'"
    echo "port = $port"
    echo "unix_socket_directories = $(conf_quote "$dir")"
    echo "max_connections = 200          # e2e tests run many relays and clients at once"
    echo "wal_level = $wal_level            # logical: relay.wake = \"wal\" streams from a replication slot"
    echo "log_line_prefix = '%m [%p] %q%a '"
    echo "max_prepared_transactions = 10  # pg tests: a prepared transaction inside a commit-ordered window"
    if ((fast)); then
      echo "# --fast: throwaway test cluster, durability off"
      echo "fsync = off"
      echo "synchronous_commit = off"
      echo "full_page_writes = off"
    fi
    echo "$end_mark"
  } >>"$tmp"
  # cat into the existing file keeps its owner and mode.
  cat "$tmp" >"$conf"
  rm -f "$tmp"
}

prepare_dir() {
  if ((EUID == 0)); then
    id postgres >/dev/null 2>&1 || die "OS user 'postgres' missing (install postgresql-15: scripts/deps.sh)"
    mkdir -p "$dir"
    if ! have_cluster; then
      chown postgres:postgres "$dir"
      chmod 700 "$dir"
    fi
    if ! runuser -u postgres -- test -x "$dir" -a -w "$dir"; then
      die "user postgres cannot reach $dir (a parent directory is not traversable); use a directory under /tmp, e.g. \$(mktemp -d)"
    fi
  else
    mkdir -p "$dir"
    chmod 700 "$dir"
  fi
}

init_cluster() {
  [[ -x $bindir/initdb ]] || die "$bindir/initdb not found (install postgresql-15: scripts/deps.sh)"
  if [[ -n $(ls -A "$dir") ]]; then
    die "$dir is not empty and holds no cluster; give an empty or new directory"
  fi
  local out
  if ! out=$(as_owner "$bindir/initdb" -D "$dir" -U postgres -A trust -E UTF8 \
      --locale=C.UTF-8 --no-sync 2>&1); then
    echo "$out" >&2
    die "initdb failed for $dir"
  fi
}

# Start the server with the settings already in postgresql.conf.
# Returns 0 on success, 10 if the port was taken, 1 on any other failure.
try_start() {
  local out
  if out=$(as_owner "$bindir/pg_ctl" -D "$dir" -l "$log" -w -t 60 start 2>&1); then
    return 0
  fi
  if tail -n 20 "$log" 2>/dev/null | grep -qE 'Address already in use|could not create any TCP/IP'; then
    return 10
  fi
  echo "$out" >&2
  echo "--- last lines of $log ---" >&2
  tail -n 20 "$log" >&2 || true
  return 1
}

cmd_start() {
  prepare_dir
  have_cluster || init_cluster

  if is_running; then
    local running_port
    running_port=$(recorded_port)
    if [[ -n $port_arg && $port_arg != "$running_port" ]]; then
      die "cluster in $dir already running on port $running_port (asked for $port_arg); restart it with: pg.sh stop $dir && pg.sh start $dir $port_arg"
    fi
    url_for "$running_port"
    return 0
  fi

  local port auto=0 attempt rc
  if [[ -n $port_arg ]]; then
    port=$port_arg
  else
    port=$(recorded_port)
    if [[ -z $port ]] || ! grep -qF "$begin_mark" "$conf" || ! port_is_free "$port"; then
      port=$(free_port)
    fi
    auto=1
  fi

  for attempt in 1 2 3 4 5; do
    write_settings "$port"
    rc=0
    try_start || rc=$?
    if ((rc == 0)); then
      url_for "$port"
      return 0
    fi
    if ((rc == 10 && auto)); then
      echo "pg.sh: port $port was taken before the server bound it; trying another (attempt $attempt)" >&2
      port=$(free_port)
      continue
    fi
    ((rc == 10)) && die "port $port is in use"
    die "could not start the cluster in $dir (log: $log)"
  done
  die "could not find a free port after 5 attempts"
}

cmd_stop() {
  is_running || return 0
  local out
  if ! out=$(as_owner "$bindir/pg_ctl" -D "$dir" -m fast -w -t 60 stop 2>&1); then
    # It may have stopped between the check and the stop.
    is_running || return 0
    echo "$out" >&2
    die "could not stop the cluster in $dir"
  fi
}

cmd_restart() {
  have_cluster || die "no cluster in $dir"
  local port
  port=$(recorded_port)
  [[ -n $port ]] || die "no port recorded in $conf; use: pg.sh start $dir [PORT]"
  cmd_stop
  local rc=0
  try_start || rc=$?
  ((rc == 0)) || { ((rc == 10)) && die "port $port is in use; cannot restart on the same port"; die "could not restart the cluster in $dir (log: $log)"; }
  url_for "$port"
}

cmd_url() {
  have_cluster || die "no cluster in $dir"
  local port
  port=$(recorded_port)
  [[ -n $port ]] || die "no port recorded in $conf"
  url_for "$port"
}

cmd_status() {
  if is_running; then
    echo "running: $(cmd_url)"
  else
    echo "not running"
    exit 3
  fi
}

case $cmd in
  start) cmd_start ;;
  stop) [[ -z $port_arg ]] || usage; cmd_stop ;;
  restart) [[ -z $port_arg ]] || usage; cmd_restart ;;
  url) cmd_url ;;
  status) cmd_status ;;
  *) usage ;;
esac
