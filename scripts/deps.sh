#!/usr/bin/env bash
# Install the Debian 12 packages outboxd needs to build, test and demo.
#
# Idempotent and fast when everything is present: it asks dpkg first and only
# runs `apt-get update` + `apt-get install` for what is missing. As a non-root
# user it prints the exact command to run and exits non-zero instead.
#
#   scripts/deps.sh            # install what is missing (quiet)
#   scripts/deps.sh --check    # only report; exit 1 if anything is missing
set -euo pipefail

packages=(
  # toolchain
  g++ meson ninja-build pkg-config
  # libraries (see "Platform facts" in the design brief for versions)
  libpqxx-dev libpq-dev libboost-dev libboost-system-dev nlohmann-json3-dev
  libfmt-dev doctest-dev libssl-dev libtomlplusplus-dev
  # the NATS JetStream destination (C client) and the server its tests start
  libnats-dev nats-server
  # a real server for the pg/e2e suites and the demo
  postgresql-15
  # a real transaction pooler for the poll-mode e2e tests (tests/e2e/test_wake.py)
  pgbouncer
  # end-to-end tests and demo run under Debian's /usr/bin/python3
  python3 python3-psycopg2 python3-pytest
  # parses /metrics in the e2e tests (the Prometheus client's own parser)
  python3-prometheus-client
  # HTTPS
  ca-certificates openssl
  # systemd-analyze, which checks packaging/outboxd.service (tests/e2e/test_packaging.py)
  systemd
)

check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "deps.sh: unknown argument: $1" >&2; exit 2 ;;
esac

missing=()
for pkg in "${packages[@]}"; do
  # "ii" = wanted and installed; anything else (absent, half-installed,
  # removed with config files left) counts as missing.
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
  [[ $status == ii* ]] || missing+=("$pkg")
done

((${#missing[@]} == 0)) && exit 0

if ((check_only)); then
  echo "deps.sh: missing Debian packages: ${missing[*]}" >&2
  exit 1
fi

install_cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if ((EUID != 0)); then
  echo "deps.sh: missing Debian packages: ${missing[*]}" >&2
  echo "deps.sh: run as root:  sudo sh -c '$install_cmd'" >&2
  exit 1
fi

echo "deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps.sh: done" >&2
