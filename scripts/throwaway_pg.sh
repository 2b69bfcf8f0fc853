# Sourced (not run) by the scripts and benchmarks that need a throwaway
# PostgreSQL: one exit trap for all of them, so the cluster is stopped and
# its directory removed however the script ends (error, Ctrl-C, TERM).
#
#   source "$root/scripts/throwaway_pg.sh"
#   throwaway_dir dir outboxd-test        # dir=/tmp/outboxd-test.XXXXXX, removed on exit
#   throwaway_pg_start "$dir" --fast      # a cluster in it; sets PG_URL; stopped on exit
#   on_exit kill "$child"                 # more to undo, run before what came earlier
#
# On exit the registered commands run last-registered first (a child that
# uses the cluster is stopped before the cluster), each allowed to fail, and
# the script's exit status is kept. INT and TERM exit 130 and 143, which runs
# the same cleanup. Takes over the EXIT, INT and TERM traps.

throwaway_pg_script=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/pg.sh
_on_exit_commands=()

_run_on_exit() {
  local rc=$? i
  trap - EXIT INT TERM
  for ((i = ${#_on_exit_commands[@]} - 1; i >= 0; i--)); do
    eval "${_on_exit_commands[i]}" || true
  done
  exit "$rc"
}
trap _run_on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# on_exit CMD [ARG...]: runs CMD ARG... (quoted as given) when the script exits.
on_exit() {
  _on_exit_commands+=("$(printf '%q ' "$@")")
}

# throwaway_dir VAR NAME: makes a fresh directory /tmp/NAME.XXXXXX, sets
# VAR to its path, and removes it on exit. /tmp, not $TMPDIR: as root the
# server runs as user postgres, which must be able to reach it.
throwaway_dir() {
  local path
  path=$(mktemp -d "/tmp/$2.XXXXXX")
  chmod 755 "$path"
  on_exit rm -rf "$path"
  printf -v "$1" '%s' "$path"
}

# throwaway_pg_start DIR [--fast] [--wal-level=L] [PORT]: starts (initialising if needed) a
# cluster in DIR with scripts/pg.sh, sets PG_URL to its URL, and stops it on
# exit (before DIR is removed, if throwaway_dir made it).
throwaway_pg_start() {
  local dir=$1
  shift
  local args=() port=
  while (($#)); do
    case $1 in
      --fast|--wal-level=*) args+=("$1") ;;
      *) port=$1 ;;
    esac
    shift
  done
  on_exit _throwaway_pg_stop "$dir"
  PG_URL=$("$throwaway_pg_script" "${args[@]+"${args[@]}"}" start "$dir" ${port:+"$port"} | tail -n 1)
}

_throwaway_pg_stop() {
  "$throwaway_pg_script" stop "$1" >/dev/null 2>&1
}
