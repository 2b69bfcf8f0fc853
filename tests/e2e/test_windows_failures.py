"""The failure modes that commit-ordered windows add (relay.consume =
"windows", issue 14 step 3), against the real binary, a real PostgreSQL and
a real receiver:

* a cursor that does not belong to the server (its xid ahead of the
  server's counter, another cluster's, or a standby) is refused: the relay
  exits with its own code and reads nothing;
* kill -9 of a relay mid-drain, with a peer running (its cursors move to the
  peer within the takeover tick) or alone (restarted): nothing lost, per-key
  order kept;
* a key paused behind a retry; a window spanning a long transaction;
  PostgreSQL restarted mid-drain.

Every relay here reads windows whatever OUTBOXD_TEST_CONSUME says, so these
run in the normal suite.
"""

from __future__ import annotations

import re
import signal
import threading
import time

import psycopg2
import pytest
from psycopg2 import sql

from conftest import EXIT_OK, TEST_APP, Db
from helpers import wait_delivered, wait_until
from receiver import Receiver

# relay.consume for every relay of this file (overrides OUTBOXD_TEST_CONSUME).
WINDOWS = {"OUTBOXD_CONSUME": "windows"}

# outboxd's exit code for a window that must not be read here (README: Exit codes).
EXIT_WINDOW_UNSAFE = 9


def prepare_windows(outboxd, url: str, schema: str) -> None:
    """Whatever windows need beyond `outboxd migrate`: today migration 0009
    installs them; once they become an opt-in setup step, it is run here."""
    conn = psycopg2.connect(url, connect_timeout=5, application_name=TEST_APP)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".cursors',))
            installed = cur.fetchone()[0]
    finally:
        conn.close()
    if not installed:
        r = outboxd("--database-url", url, "--schema", schema, "windows-setup")
        assert r.rc == EXIT_OK, f"outboxd windows-setup failed: {r!r}"


@pytest.fixture
def wdb(db, outboxd):
    """The test's Db, its schema ready for windows."""
    prepare_windows(outboxd, db.url, db.schema)
    return db


def server_position(db) -> tuple[int, int]:
    """(next xid, system_identifier) of the server."""
    row = db.query("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid, "
                   "(SELECT system_identifier FROM pg_control_system()) AS sysid")[0]
    return row["next_xid"], row["sysid"]


def forge_cursors(db, snap_a: str, system_identifier: int) -> None:
    """All 64 window cursors at `snap_a`, taken on `system_identifier`, free."""
    db.query("INSERT INTO {s}.cursors (destination, slot, snap_a, owner, epoch, system_identifier) "
             "SELECT '', g, %s::pg_snapshot, NULL, 1, %s FROM generate_series(0, 63) g "
             "ON CONFLICT (destination, slot) DO UPDATE "
             "SET snap_a = excluded.snap_a, snap_b = NULL, owner = NULL, "
             "system_identifier = excluded.system_identifier", (snap_a, system_identifier))


def events_left(db) -> set:
    return {r["id"] for r in db.query("SELECT id FROM {s}.events")}


# --------------------------------------------------------------------------
# 1. cursors that do not belong to this server are refused
# --------------------------------------------------------------------------
@pytest.mark.parametrize("forgery", ["xid_ahead", "other_cluster"])
def test_a_cursor_that_does_not_belong_to_the_server_is_refused_and_nothing_is_read(wdb, relay, forgery):
    db = wdb
    ids = [db.enqueue("refused", {"i": i}, key=f"k{i % 3}" if i % 2 else None) for i in range(12)]
    next_xid, sysid = server_position(db)
    if forgery == "xid_ahead":
        # A cursor from a server whose counter was far ahead: a restore or a
        # PITR to before the cursor's checkpoint. Every event here would look
        # already seen.
        ahead = next_xid + 1_000_000_000
        forge_cursors(db, f"{ahead}:{ahead}:", sysid)
        expected = rf"xid regression: the server's next transaction id (\d+) is below the cursor's {ahead}\b"
    else:
        other = sysid + 1 if sysid < 2 ** 62 else sysid - 1
        forge_cursors(db, "1:1:", other)
        expected = rf"the cursor was taken on cluster {other}, this server is cluster {sysid}\b"

    with Receiver() as rx:
        r = relay(rx, "--sweep-interval", "1h", env=WINDOWS)
        rc = r.wait(15)
        assert rc is not None, f"the relay did not refuse (still running):\n{r.log()}"
        log = r.log()
        assert rc == EXIT_WINDOW_UNSAFE, f"exit {rc}, expected {EXIT_WINDOW_UNSAFE}:\n{log}"
        m = re.search(expected, log)
        assert m, f"no refusal naming both values ({expected!r}) in:\n{log}"
        if forgery == "xid_ahead":
            assert int(m.group(1)) >= next_xid, m.group(0)
        assert rx.ids() == [], f"events were sent: {rx.ids()}"
    assert events_left(db) == set(ids), f"events gone from the outbox: {set(ids) - events_left(db)}"
    assert db.count_dead_letters() == 0
    assert db.scalar("SELECT count(*) FROM {s}.deliveries") == 0
    # The forged cursors were not moved to the server's position.
    snaps = {row["snap_a"] for row in db.query("SELECT snap_a::text FROM {s}.cursors WHERE destination = ''")}
    assert snaps == ({f"{ahead}:{ahead}:"} if forgery == "xid_ahead" else {"1:1:"}), snaps
