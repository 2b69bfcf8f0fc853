#!/usr/bin/env bash
# The test command: build, start a throwaway PostgreSQL, run the test suites.
#
#   scripts/test.sh                    # all suites: unit, pg, e2e
#   scripts/test.sh --suite unit       # arguments go to `meson test`
#   scripts/test.sh --suite e2e -v     # e.g. verbose, one suite
#
# The cluster lives in a fresh directory under /tmp with durability off
# (pg.sh --fast) and is stopped and removed on exit, also on Ctrl-C. Tests see:
#   OUTBOXD_TEST_DATABASE_URL  URL of that cluster (each test makes its own schema)
#   OUTBOXD_TEST_PG_SCRIPT     absolute path of scripts/pg.sh, for tests that
#                              start (and restart, and stop) clusters of their own
# Exit status is meson test's. The last line is a plain summary,
# e.g. "tests: 3 passed, 0 failed".
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

"$root/scripts/build.sh"

source "$root/scripts/throwaway_pg.sh"
throwaway_dir pgdir outboxd-test
throwaway_pg_start "$pgdir" --fast
url=$PG_URL
export OUTBOXD_TEST_DATABASE_URL=$url
export OUTBOXD_TEST_PG_SCRIPT=$root/scripts/pg.sh
echo "test.sh: PostgreSQL at $url (data in $pgdir)" >&2

testlog=build/meson-logs/testlog.json
rm -f "$testlog"
rc=0
meson test -C build --print-errorlogs "$@" || rc=$?

# One line per test in testlog.json; count its results.
summary=$(/usr/bin/python3 - "$testlog" <<'PY' 2>/dev/null || true
import json, sys
passed = failed = skipped = 0
try:
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            result = json.loads(line).get("result", "")
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif result == "SKIP":
                skipped += 1
            else:  # FAIL, TIMEOUT, ERROR, UNEXPECTEDPASS
                failed += 1
except FileNotFoundError:
    pass
extra = f" ({skipped} skipped)" if skipped else ""
print(f"tests: {passed} passed, {failed} failed{extra}")
PY
)
[[ -n $summary ]] || summary="tests: 0 passed, 0 failed"
if ((rc != 0)) && [[ $summary == *" 0 failed"* ]]; then
  summary+=" (meson test exited $rc)"
fi
echo "$summary"
exit "$rc"
