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

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import psycopg2
import pytest

from conftest import EXIT_DB_UNSUITABLE, EXIT_OK, TEST_APP, Db, PgCluster, clean_env
from helpers import two_phase_transaction, wait_delivered, wait_until
from receiver import Receiver

# relay.consume for every relay of this file (overrides OUTBOXD_TEST_CONSUME).
WINDOWS = {"OUTBOXD_CONSUME": "windows"}

# outboxd's exit code for a window that must not be read here (README: Exit codes).
EXIT_WINDOW_UNSAFE = 9


def prepare_windows(outboxd, url: str, schema: str) -> None:
    """Whatever windows need beyond `outboxd migrate` (idempotent)."""
    r = outboxd("--database-url", url, "--schema", schema, "consume-setup", "windows")
    assert r.rc == EXIT_OK, f"outboxd consume-setup windows failed: {r!r}"


def windows_outbox_on(url: str, make_schema, outboxd, request, name=None) -> Db:
    """A migrated schema on the cluster at `url`, ready for windows; its Db
    helper is closed at teardown."""
    schema = make_schema(url=url, name=name)
    prepare_windows(outboxd, url, schema)
    db = Db(url, schema)
    request.addfinalizer(db.close)
    return db


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


def windows_status(outboxd, db) -> dict | None:
    """The "windows" object of `outboxd status --json` (None: no cursors)."""
    r = outboxd("--database-url", db.url, "--schema", db.schema, "status", "--json")
    assert r.rc == EXIT_OK, r
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    return next((row["windows"] for row in rows if "windows" in row), None)


# --------------------------------------------------------------------------
# 1. cursors that do not belong to this server are refused
# --------------------------------------------------------------------------
@pytest.mark.parametrize("forgery", ["xid_ahead", "other_cluster"])
def test_a_cursor_that_does_not_belong_to_the_server_is_refused_and_nothing_is_read(wdb, relay, outboxd, forgery):
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

    # The relay is gone; `outboxd status` judges the cursors by its rules
    # and says the same, remedy included.
    text = outboxd("--database-url", db.url, "--schema", db.schema, "status")
    assert text.rc == EXIT_OK, text
    refusal = next((line for line in text.stdout.splitlines() if line.startswith("windows cannot be read here")), "")
    assert re.search(expected, refusal) and "outboxd cursor reset" in refusal, text.stdout
    w = windows_status(outboxd, db)
    assert w["cursors"] == 64 and w["held"] == 0 and re.search(expected, w["refusal"] or ""), w
    assert w["holding_back"] == [], w  # xids of another server are not looked up here

    # What the refusal tells the operator to do, once checked: reset the
    # cursors. The next relay then reads the whole outbox and sends it all.
    assert "outboxd cursor reset" in log, log
    reset = outboxd("--database-url", db.url, "--schema", db.schema, "cursor", "reset")
    assert reset.rc == EXIT_OK, reset
    assert db.scalar("SELECT count(*) FROM {s}.cursors") == 0
    assert windows_status(outboxd, db) is None
    with Receiver() as rx:
        relay(rx, "--sweep-interval", "1h", env=WINDOWS)
        assert wait_delivered(rx, ids, timeout=15), (sorted(rx.ids()), r.log())
        assert db.wait_empty(timeout=10), events_left(db)
        assert sorted(rx.ids()) == sorted(ids), "sent twice"


def test_cursor_reset_is_refused_while_a_windows_relay_runs_and_changes_nothing(wdb, relay, outboxd):
    db = wdb
    with Receiver() as rx:
        r = relay(rx, "--sweep-interval", "1h", env=WINDOWS)
        assert wait_until(lambda: db.scalar("SELECT count(*) FROM {s}.cursors WHERE owner IS NOT NULL") == 64,
                          timeout=15), r.log()
        before = db.query("SELECT slot, owner, epoch FROM {s}.cursors ORDER BY slot")
        reset = outboxd("--database-url", db.url, "--schema", db.schema, "cursor", "reset")
        assert reset.rc == EXIT_DB_UNSUITABLE, reset
        assert "1 relay(s) with relay.consume = \"windows\" are running" in reset.stderr, reset
        assert db.query("SELECT slot, owner, epoch FROM {s}.cursors ORDER BY slot") == before
        e = db.enqueue("after", {"n": 1})
        assert wait_delivered(rx, [e], timeout=10), r.log()


def start_standby(primary, request):
    """A streaming standby of `primary` (pg_basebackup -R), started with
    scripts/pg.sh; stopped and removed at teardown."""
    d = tempfile.mkdtemp(prefix="outboxd-e2e-standby-", dir="/tmp")
    request.addfinalizer(lambda: shutil.rmtree(d, ignore_errors=True))
    as_owner = []
    if os.geteuid() == 0:  # as pg.sh does: the server runs as the postgres OS user
        shutil.chown(d, "postgres", "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
    os.chmod(d, 0o700)
    bindir = os.environ.get("PG_BINDIR", "/usr/lib/postgresql/15/bin")
    p = subprocess.run([*as_owner, f"{bindir}/pg_basebackup", "-D", d, "-R", "-c", "fast", "-d", primary.url],
                       capture_output=True, text=True, timeout=60, cwd="/tmp", env=clean_env())
    assert p.returncode == 0, f"pg_basebackup failed: {p.stderr}"
    standby = PgCluster(primary.script, d)
    request.addfinalizer(standby.stop)
    standby.start()
    return standby


def test_a_standby_is_refused_before_anything_is_written(pg_cluster, make_schema, relay, outboxd, request):
    primary = pg_cluster()
    db = windows_outbox_on(primary.url, make_schema, outboxd, request)
    schema = db.schema
    ids = [db.enqueue("standby", {"i": i}) for i in range(5)]
    standby = start_standby(primary, request)
    sdb = Db(standby.url, schema)
    request.addfinalizer(sdb.close)
    assert sdb.scalar("SELECT pg_is_in_recovery()") is True
    assert wait_until(lambda: len(events_left(sdb)) == len(ids), 10), "the standby never caught up"

    with Receiver() as rx:
        r = relay(rx, "--sweep-interval", "1h", database_url=standby.url, schema=schema, env=WINDOWS)
        rc = r.wait(15)
        assert rc is not None, f"the relay did not refuse the standby (still running):\n{r.log()}"
        log = r.log()
        assert rc == EXIT_WINDOW_UNSAFE, f"exit {rc}, expected {EXIT_WINDOW_UNSAFE}:\n{log}"
        assert "the server is a standby (in recovery)" in log, log
        assert rx.ids() == []
    assert events_left(db) == set(ids)
    assert db.scalar("SELECT count(*) FROM {s}.relays") == 0


def test_a_relay_that_reconnects_to_a_restored_cluster_refuses_its_cursors(
        pg_cluster, make_schema, relay, outboxd, request):
    """The server the relay reads from is replaced under it by another
    cluster on the same address, into which the outbox was restored with its
    cursors (a dump, or a cluster rebuilt). Its transaction counter is behind
    the cursors: new events there would look already read. The relay, after
    reconnecting, must refuse before reading a window there."""
    first = pg_cluster()
    db = windows_outbox_on(first.url, make_schema, outboxd, request)
    schema = db.schema
    # The first cluster's counter well ahead of the second's.
    conn = psycopg2.connect(first.url, connect_timeout=5, application_name=TEST_APP)
    conn.autocommit = True
    with conn.cursor() as cur:
        for _ in range(2000):
            cur.execute("SELECT pg_current_xact_id()")
    conn.close()
    _, first_id = server_position(db)

    with Receiver() as rx:
        r = relay(rx, "--sweep-interval", "1h", "--connect-timeout", "1s",
                  database_url=first.url, schema=schema, env=WINDOWS)
        before = [db.enqueue("restore", {"i": i}, commit=False) for i in range(5)]
        txid = db.scalar("SELECT pg_current_xact_id()::text::bigint")  # and commits
        assert wait_delivered(rx, before, 10), rx.ids()
        # Checkpointed past them: the cursors to restore.
        assert wait_until(lambda: db.scalar(
            "SELECT count(*) FROM {s}.cursors WHERE destination = '' "
            "AND pg_snapshot_xmax(snap_a) > %s::text::xid8", (txid,)) == 64, 10), \
            db.query("SELECT slot, snap_a::text, owner FROM {s}.cursors")
        cursors = db.query("SELECT destination, slot, snap_a::text AS snap_a, snap_b::text AS snap_b, "
                           "done_below, epoch, system_identifier FROM {s}.cursors")
        db.close()
        first.stop()

        # Another cluster on the same address, the outbox restored into it.
        second = PgCluster(first.script, tempfile.mkdtemp(prefix="outboxd-e2e-pg-", dir="/tmp"), port=first.port)
        os.chmod(second.dir, 0o755)
        request.addfinalizer(lambda: shutil.rmtree(second.dir, ignore_errors=True))
        request.addfinalizer(second.stop)
        second.start()
        db2 = windows_outbox_on(second.url, make_schema, outboxd, request, name=schema)
        for c in cursors:
            db2.query("INSERT INTO {s}.cursors (destination, slot, snap_a, snap_b, done_below, epoch, "
                      "system_identifier) VALUES (%(destination)s, %(slot)s, %(snap_a)s, %(snap_b)s, "
                      "%(done_below)s, %(epoch)s, %(system_identifier)s)", c)
        after = [db2.enqueue("restore", {"i": i, "restored": True}) for i in range(5)]
        next_xid, second_id = server_position(db2)
        assert second_id != first_id
        assert max_txid(db2, after) < min(xmax(c["snap_a"]) for c in cursors), \
            "the second cluster's counter is not behind the cursors: the test proves nothing"

        assert r.wait(30) is not None, f"the relay did not refuse the restored cluster:\n{r.log()}"
        log = r.log()
        assert r.returncode == EXIT_WINDOW_UNSAFE, f"exit {r.returncode}:\n{log}"
        assert re.search(rf"the cursor was taken on cluster {first_id}, this server is cluster {second_id}\b",
                         log), log
        restored_sent = [q.event_id for q in rx.snapshot() if q.json().get("restored")]
        assert restored_sent == [], f"events of the restored outbox were sent: {restored_sent}"
    assert events_left(db2) == set(after), f"gone from the restored outbox: {set(after) - events_left(db2)}"


def max_txid(db, ids) -> int:
    return db.scalar("SELECT max(txid)::text::bigint FROM {s}.events WHERE id = ANY(%s)", (ids,)) or 0


def xmax(snapshot: str) -> int:
    return int(snapshot.split(":")[1])


# --------------------------------------------------------------------------
# helpers for the drains below
# --------------------------------------------------------------------------
def lease_owner(r) -> str:
    found = wait_until(lambda: re.search(r'msg="?relay started"?.*\blease_owner="?([^\s"]+)', r.log()), 10)
    assert found, f"no lease_owner in the relay's log:\n{r.log()}"
    return found.group(1)


def enqueue_backlog(db, n: int, keys: int, topic: str = "drain") -> dict:
    """n events in one transaction, every other one keyed over `keys` keys:
    {id: key or None}."""
    rows = db.query("SELECT {s}.enqueue(%s, jsonb_build_object('n', g), "
                    "CASE WHEN mod(g, 2) = 0 THEN 'k' || mod(g / 2, %s) END) AS id, "
                    "CASE WHEN mod(g, 2) = 0 THEN 'k' || mod(g / 2, %s) END AS key "
                    "FROM generate_series(1, %s) AS g", (topic, keys, keys, n))
    return {r["id"]: r["key"] for r in rows}


def delivered_count(log: str) -> int:
    return len(re.findall(r'msg="?delivered"? ', log))


def assert_key_order(reqs, key_of: dict) -> None:
    """Per key, the first acceptance of each event in id order."""
    first_ok: dict = {}
    for seq, q in enumerate(reqs):
        if 200 <= q.status < 300 and q.event_id in key_of and q.event_id not in first_ok:
            first_ok[q.event_id] = seq
    for key in {k for k in key_of.values() if k}:
        mine = sorted((i for i, k in key_of.items() if k == key), key=lambda i: first_ok[i])
        assert mine == sorted(mine), f"key {key} delivered out of order: {mine}"


def slow(delay: float, status: int = 200):
    def responder(_req):
        time.sleep(delay)
        return status, {}, b"ok"
    return responder


# Flags of the drains: a long sweep (what is delivered comes from windows and
# the takeover, not the sweep), a request timeout far above the receiver's.
DRAIN_FLAGS = ("--sweep-interval", "1h", "--concurrency", "8", "--request-timeout", "5s",
               "--connect-timeout", "1s", "--retry-base", "100ms")

# The takeover tick is a second (relay_engine's takeover_interval); a dead
# relay's cursors must move well within this.
TAKEOVER_DEADLINE = 5.0


# --------------------------------------------------------------------------
# 2a. kill -9 of one of two relays mid-drain: its cursors move to the other
# --------------------------------------------------------------------------
def test_kill_9_of_one_of_two_relays_mid_drain_its_cursors_move_to_the_other_and_nothing_is_lost(wdb, relay):
    db = wdb
    with Receiver(slow(0.003)) as rx:
        a = relay(rx, *DRAIN_FLAGS, env=WINDOWS)
        owner_a = lease_owner(a)
        b = relay(rx, *DRAIN_FLAGS, env=WINDOWS)
        owner_b = lease_owner(b)
        # Both read windows: the 64 cursors shared (A hands B its surplus).
        assert wait_until(lambda: db.scalar(
            "SELECT count(DISTINCT owner) FROM {s}.cursors WHERE destination = '' "
            "AND owner IN (%s, %s)", (owner_a, owner_b)) == 2, 10), \
            db.query("SELECT slot, owner FROM {s}.cursors ORDER BY slot")
        key_of = enqueue_backlog(db, 3000, keys=20)
        ids = list(key_of)
        # Mid-drain: both have delivered some, much is left.
        assert wait_until(lambda: delivered_count(a.log()) >= 50 and delivered_count(b.log()) >= 50, 20), \
            f"both relays never delivered: A {delivered_count(a.log())}, B {delivered_count(b.log())}"
        assert len(set(rx.delivered_ids())) < len(ids) // 2, "the drain was nearly over at the kill"
        a_slots = db.scalar("SELECT count(*) FROM {s}.cursors WHERE destination = '' AND owner = %s",
                            (owner_a,))
        assert a_slots > 0
        a.kill()
        t_kill = time.monotonic()
        assert a.returncode == -signal.SIGKILL

        # B takes A's cursors at its next takeover tick once A's session is gone.
        took = wait_until(lambda: db.scalar(
            "SELECT count(*) FROM {s}.cursors WHERE destination = '' AND owner = %s", (owner_b,)) == 64,
            TAKEOVER_DEADLINE)
        waited = time.monotonic() - t_kill
        assert took, (f"B did not take A's cursors within {TAKEOVER_DEADLINE}s: "
                      f"{db.query('SELECT slot, owner FROM {s}.cursors ORDER BY slot')}")

        assert wait_delivered(rx, ids, 60), f"never delivered: {sorted(set(ids) - set(rx.delivered_ids()))[:20]}"
        assert db.wait_empty(timeout=15), f"{db.count_events()} events left"
        assert db.count_dead_letters() == 0, db.dead_letters()
        assert b.alive()
        reqs = rx.snapshot()
    print(f"\nA held {a_slots} slots; B held all 64 {waited:.2f}s after the kill; "
          f"{len(reqs) - len(set(q.event_id for q in reqs))} requests were repeats")
    assert_key_order(reqs, key_of)


# --------------------------------------------------------------------------
# 2b. kill -9 and restart of the only relay mid-drain
# --------------------------------------------------------------------------
def test_kill_9_and_restart_of_the_only_relay_mid_drain_sends_again_only_what_is_past_its_checkpoint(wdb, relay):
    db = wdb
    with Receiver(slow(0.003)) as rx:
        a = relay(rx, *DRAIN_FLAGS, env=WINDOWS)
        key_of = enqueue_backlog(db, 3000, keys=20)
        ids = list(key_of)
        # Mid-drain, past at least one checkpoint (once a second).
        assert wait_until(lambda: db.scalar(
            "SELECT count(*) FROM {s}.cursors WHERE destination = '' AND (snap_b IS NOT NULL OR "
            "pg_snapshot_xmax(snap_a) > %s::text::xid8)", (min_txid(db, ids),)) > 0
            and len(set(rx.delivered_ids())) >= 300, 20), \
            f"no checkpoint mid-drain: {db.query('SELECT slot, snap_a::text, snap_b::text, done_below FROM {s}.cursors LIMIT 3')}"
        a.kill()
        assert a.returncode == -signal.SIGKILL
        assert wait_until(lambda: not db.relay_sessions(), 15), "the killed relay's sessions did not end"
        sent_by_a = set(rx.ids())
        assert len(set(rx.delivered_ids())) < len(ids), "the drain was over at the kill"
        # What the checkpoints do not cover: the events a restart may send again.
        uncovered = {r["id"] for r in db.query(
            "SELECT e.id FROM {s}.events e JOIN {s}.cursors c "
            "  ON c.destination = '' AND c.slot = {s}.event_slot(e.ordering_key, e.id) "
            "WHERE NOT (pg_visible_in_snapshot(e.txid, c.snap_a) OR (c.snap_b IS NOT NULL "
            "           AND pg_visible_in_snapshot(e.txid, c.snap_b) AND e.id < c.done_below))")}
        covered_sent = sent_by_a - uncovered

        b = relay(rx, *DRAIN_FLAGS, env=WINDOWS)
        assert wait_delivered(rx, ids, 60), f"never delivered: {sorted(set(ids) - set(rx.delivered_ids()))[:20]}"
        assert db.wait_empty(timeout=15), f"{db.count_events()} events left"
        assert db.count_dead_letters() == 0, db.dead_letters()
        assert b.alive()
        reqs = rx.snapshot()
    counts: dict = {}
    for q in reqs:
        counts[q.event_id] = counts.get(q.event_id, 0) + 1
    dups = {i for i, c in counts.items() if c > 1}
    print(f"\nsent before the kill: {len(sent_by_a)}, of them past the checkpoint: {len(sent_by_a & uncovered)}; "
          f"sent twice: {len(dups)}")
    assert covered_sent, "nothing the checkpoint covers was sent: the test proves nothing"
    assert not dups & covered_sent, \
        f"events the checkpoint covered were sent again: {sorted(dups & covered_sent)[:20]}"
    assert dups <= uncovered
    assert_key_order(reqs, key_of)


def min_txid(db, ids) -> int:
    return db.scalar("SELECT min(txid)::text::bigint FROM {s}.events WHERE id = ANY(%s)", (ids,)) or 0


# --------------------------------------------------------------------------
# 2c. a key paused behind a retry
# --------------------------------------------------------------------------
def test_a_key_paused_behind_a_retry_holds_only_its_own_later_events(wdb, relay):
    db = wdb
    failures = 4
    seen = {"n": 0}
    lock = threading.Lock()
    stuck: dict = {}

    def responder(req):
        if req.event_id == stuck.get("id"):
            with lock:
                seen["n"] += 1
                if seen["n"] <= failures:
                    return 503, {}, b"busy"
        return 200, {}, b"ok"

    with Receiver(responder) as rx:
        r = relay(rx, "--sweep-interval", "1h", "--retry-base", "300ms", env=WINDOWS)
        # The stuck event, and at once two more of its key (read while it is
        # in memory: the sequencer holds them behind it)...
        conn = db.connect()
        stuck["id"] = db.enqueue("paused", {"k": "K", "i": 0}, key="K", conn=conn, commit=False)
        conn.commit()
        later_k = [db.enqueue("paused", {"k": "K", "i": i}, key="K") for i in range(1, 3)]
        # ... then, once its failure is parked in `deliveries`, more of K
        # (held by the read's key_pending) and of other keys, each in its own
        # transaction.
        assert wait_until(lambda: db.deliveries(stuck["id"]), 10), \
            f"the failed event was never parked: {rx.snapshot()}"
        later_k += [db.enqueue("paused", {"k": "K", "i": i}, key="K") for i in range(3, 6)]
        others = [db.enqueue("paused", {"k": f"o{i % 4}", "i": i}, key=f"o{i % 4}" if i % 2 else None)
                  for i in range(40)]
        assert wait_delivered(rx, [stuck["id"], *later_k, *others], 30), \
            f"not delivered: {sorted(set([stuck['id'], *later_k, *others]) - set(rx.delivered_ids()))}"
        reqs = rx.snapshot()
        assert r.alive()
    stuck_reqs = [(n, q) for n, q in enumerate(reqs) if q.event_id == stuck["id"]]
    assert [q.status for _, q in stuck_reqs] == [503] * failures + [200], [q.status for _, q in stuck_reqs]
    first_fail = stuck_reqs[0][0]
    ok_at = stuck_reqs[-1][0]
    # Nothing later of K was even sent before K's first event was accepted...
    early = [q.event_id for n, q in enumerate(reqs) if q.event_id in later_k and n < ok_at]
    assert early == [], f"later events of K sent before the event it waits on was accepted: {early}"
    # ... while the other keys kept flowing during the retries.
    meanwhile = [q.event_id for n, q in enumerate(reqs)
                 if first_fail < n < ok_at and q.event_id in others and q.status == 200]
    assert len(meanwhile) >= len(others) // 2, \
        f"other keys were held behind K's retries: {len(meanwhile)} of {len(others)} delivered meanwhile"
    # After recovery, K in order, once each.
    k_after = [q.event_id for q in reqs[ok_at + 1:] if q.event_id in later_k]
    assert k_after == later_k, k_after
    assert db.wait_empty(timeout=10), db.events()
    assert db.count_dead_letters() == 0


# --------------------------------------------------------------------------
# 2d. a window spanning a long transaction
# --------------------------------------------------------------------------
LONG_TRANSACTION_SECONDS = 3.0  # how long the producer holds it open (creates the situation)


def test_a_long_transaction_blocks_no_window_and_its_event_is_delivered_once_it_commits(wdb, relay):
    db = wdb
    with Receiver() as rx:
        r = relay(rx, "--sweep-interval", "1h", env=WINDOWS)
        warm = db.enqueue("long", {"phase": "warm"})
        assert wait_delivered(rx, [warm], 10)
        # Opened before the others commit, with its event in it.
        long_conn = db.connect()
        long_id = db.enqueue("long", {"phase": "long"}, conn=long_conn, commit=False)
        t_open = time.monotonic()
        others = []
        for i in range(30):
            others.append(db.enqueue("long", {"phase": "other", "i": i}, key=f"k{i % 3}" if i % 2 else None))
        assert wait_delivered(rx, others, 10), \
            f"events committed after the long transaction began were held behind it: " \
            f"{sorted(set(others) - set(rx.delivered_ids()))}"
        assert time.monotonic() - t_open < LONG_TRANSACTION_SECONDS, "the others took longer than the hold"
        assert long_id not in rx.ids()
        # Windows read meanwhile (checkpointed past the others) still owe it.
        time.sleep(max(0.0, LONG_TRANSACTION_SECONDS - (time.monotonic() - t_open)))
        long_conn.commit()
        t_commit = time.monotonic()
        assert wait_delivered(rx, [long_id], 10), f"the long transaction's event was lost: {rx.ids()}"
        latency = time.monotonic() - t_commit
        assert db.wait_empty(timeout=10), db.events()
        assert r.alive()
        assert sorted(set(rx.delivered_ids())) == sorted([warm, long_id, *others])
    print(f"\nthe long transaction's event arrived {latency * 1000:.0f} ms after its commit")


def test_status_shows_the_cursors_and_the_transactions_that_hold_them_back(wdb, relay, outboxd):
    """A session left idle in a transaction and a forgotten prepared
    transaction keep every row version since they began: `outboxd status`
    names both (pid, gid), and neither once they end. Polled: PostgreSQL
    refuses to PREPARE a transaction that ran NOTIFY, which the wake-up
    trigger does while a relay is idle (README: Wake-up modes)."""
    db = wdb
    gid = f"outboxd-test-{os.urandom(4).hex()}"
    setup = outboxd("--database-url", db.url, "--schema", db.schema, "wake-setup", "poll")
    assert setup.rc == EXIT_OK, setup
    with Receiver() as rx:
        r = relay(rx, "--wake", "poll", "--poll-interval", "100ms", "--sweep-interval", "1h", env=WINDOWS)
        warm = db.enqueue("held", {"phase": "warm"})
        assert wait_delivered(rx, [warm], 10)
        w = wait_until(lambda: (lambda v: v if v and v["held"] == 64 else None)(windows_status(outboxd, db)), 10)
        assert w, windows_status(outboxd, db)
        assert w["cursors"] == 64 and w["relays"] == 1 and w["refusal"] is None and w["holding_back"] == [], w

        session = db.connect()
        session_id = db.enqueue("held", {"phase": "session"}, conn=session, commit=False)
        pid = session.get_backend_pid()
        with two_phase_transaction(db, gid) as prepared:
            prepared_id = db.enqueue("held", {"phase": "prepared"}, conn=prepared, commit=False)
            prepared.tpc_prepare()
            # Later commits move the cursors past both.
            later = [db.enqueue("held", {"phase": "later", "i": i}) for i in range(3)]
            assert wait_delivered(rx, later, 10)

            def both_named():
                v = windows_status(outboxd, db)
                held = v["holding_back"] if v else []
                if any(t["gid"] == gid for t in held) and any(t["pid"] == pid for t in held):
                    return v
                return None

            w = wait_until(both_named, 10)
            assert w, windows_status(outboxd, db)
            by_pid = next(t for t in w["holding_back"] if t["pid"] == pid)
            assert by_pid["state"] == "idle in transaction" and by_pid["application_name"] == TEST_APP, by_pid
            by_gid = next(t for t in w["holding_back"] if t["gid"] == gid)
            assert by_gid["pid"] is None and by_gid["prepared_by"] and by_gid["age_seconds"] >= 0, by_gid
            text = outboxd("--database-url", db.url, "--schema", db.schema, "status")
            line = next((l for l in text.stdout.splitlines() if l.startswith("windows held back")), "")
            assert f"prepared '{gid}'" in line and f"pid {pid}, idle in transaction" in line, text.stdout
            assert session_id not in rx.ids() and prepared_id not in rx.ids()

            session.commit()
            prepared.tpc_commit()
        assert wait_delivered(rx, [session_id, prepared_id], 10), rx.ids()
        assert wait_until(lambda: windows_status(outboxd, db)["holding_back"] == [], 10), windows_status(outboxd, db)
        assert r.alive()


# --------------------------------------------------------------------------
# 2e. PostgreSQL restarted mid-drain
# --------------------------------------------------------------------------
def test_postgres_restart_mid_drain_loses_nothing(pg_cluster, make_schema, relay, outboxd, request):
    cluster = pg_cluster()
    db = windows_outbox_on(cluster.url, make_schema, outboxd, request)
    schema = db.schema
    with Receiver(slow(0.003)) as rx:
        r = relay(rx, *DRAIN_FLAGS, database_url=cluster.url, schema=schema, env=WINDOWS)
        key_of = enqueue_backlog(db, 2000, keys=20)
        assert wait_until(lambda: len(set(rx.delivered_ids())) >= 200, 20), "the drain never started"
        db.close()
        cluster.stop()
        delivered_at_stop = len(set(rx.delivered_ids()))
        time.sleep(1.0)  # the outage
        assert r.alive(), f"the relay exited while PostgreSQL was down (rc={r.returncode})"
        cluster.start()
        db = Db(cluster.url, schema)
        request.addfinalizer(db.close)
        after = enqueue_backlog(db, 200, keys=20, topic="after")
        key_of.update(after)
        ids = list(key_of)
        assert delivered_at_stop < 2000, "the drain was over before the stop"
        assert wait_delivered(rx, ids, 60), \
            f"lost: {sorted(set(ids) - set(rx.delivered_ids()))[:20]}; relay alive={r.alive()}"
        assert db.wait_empty(timeout=15), f"{db.count_events()} events left"
        assert db.count_dead_letters() == 0
        assert r.alive()
        reqs = rx.snapshot()
    assert_key_order(reqs, key_of)
    assert r.stop() == 0


def test_status_counts_the_window_events_a_relay_is_sending_as_in_flight(wdb, relay, outboxd):
    """A windows relay leases nothing: `outboxd status` counts what the owner
    of a slot's cursor has read and not passed (as of its checkpoint) as in
    flight, not pending; once delivered and passed, nothing."""
    gate = threading.Event()

    def held(_req):
        gate.wait(30)
        return 200, {}, b"ok"

    def counts():
        r = outboxd("--database-url", wdb.url, "--schema", wdb.schema, "status", "--json")
        assert r.rc == EXIT_OK, r
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        return {k: sum(row.get(k, 0) for row in rows if "topic" in row) for k in ("pending", "in_flight")}

    with Receiver(held) as rx:
        r = relay(rx, "--concurrency", "4", env=WINDOWS)
        ids = [wdb.enqueue("t", {"n": n}) for n in range(3)]
        assert rx.wait_until(lambda reqs: len(reqs) >= 3, timeout=15), r.log()
        seen = wait_until(lambda: (lambda c: c if c == {"pending": 0, "in_flight": 3} else None)(counts()), 10)
        assert seen, counts()
        gate.set()
        assert wait_delivered(rx, ids, timeout=15), r.log()
        assert wait_until(lambda: counts() == {"pending": 0, "in_flight": 0}, 10), counts()
