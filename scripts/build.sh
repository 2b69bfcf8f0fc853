#!/usr/bin/env bash
# Build outboxd into build/ at the repository root.
#
#   scripts/build.sh                 # deps check, configure once, compile
#   scripts/build.sh outboxd:executable   # arguments go to `meson compile`
#
# Configuration happens only when build/ is not a configured meson build
# directory yet; `meson compile` re-runs meson by itself when a meson.build
# changes. For other options use meson directly, e.g.
#   meson configure build -Dbuildtype=release
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

"$root/scripts/deps.sh"

# -Dwerror=true here, not as a project default: warnings fail development
# and CI builds, never a packager's build with other flags or compilers.
if [[ ! -f build/meson-private/coredata.dat ]]; then
  meson setup build -Dwerror=true
fi
meson compile -C build "$@"
