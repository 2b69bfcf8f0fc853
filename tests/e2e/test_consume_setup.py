"""`outboxd consume-setup claims|windows`: what producers pay for windows
(installed by migrate since sql/0016) is taken away and put back when asked,
a windows relay refuses an outbox not set up for it, and an outbox with pending events moves to windows without losing or
reordering any of them: a windows relay parks them itself."""

from __future__ import annotations

import secrets
import threading

import psycopg2
import pytest

from conftest import EXIT_DB_UNSUITABLE, EXIT_OK, EXIT_SCHEMA_MISSING, Db, apply_printed_sql, install_sql_files
from receiver import Receiver
from helpers import consume_setup as _setup, duplicates, live_relays, wait_delivered, wait_until

WINDOWS = {"OUTBOXD_CONSUME": "windows"}
CLAIMS = {"OUTBOXD_CONSUME": "claims"}


def _windows_state(db) -> dict:
    """The txid default and the two indexes `consume-setup windows` installs."""
    return {
        "default": db.scalar("SELECT column_default FROM information_schema.columns "
                             "WHERE table_schema = %s AND table_name = 'events' AND column_name = 'txid'",
                             (db.schema,)),
        "indexes": sorted(r["indexname"] for r in db.query(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s "
            "AND indexname IN ('events_txid_idx', 'events_pre_window_key_idx')", (db.schema,))),
    }


def _in_key_order(arrivals, by_key: dict) -> None:
    for key, ids in by_key.items():
        seen = [r.event_id for r in arrivals
                if r.headers.get("outbox-ordering-key") == key and 200 <= r.status < 300]
        # At least once: a repeat may follow, but the first arrivals are in order.
        firsts = list(dict.fromkeys(seen))
        assert firsts == ids, f"key {key}: delivered {seen}, enqueued {ids}"


def test_windows_is_installed_only_when_asked_and_claims_takes_it_away(outboxd, db):
    _setup(outboxd, db, "claims")  # whatever mode the suite runs in
    assert _windows_state(db) == {"default": None, "indexes": []}
    before = db.enqueue("t", {"n": 1})
    assert db.scalar("SELECT txid FROM {s}.events WHERE id = %s", (before,)) is None

    _setup(outboxd, db, "windows")
    _setup(outboxd, db, "windows")  # twice is fine
    assert _windows_state(db) == {"default": "pg_current_xact_id()",
                                  "indexes": ["events_pre_window_key_idx", "events_txid_idx"]}
    after = db.enqueue("t", {"n": 2})
    assert db.scalar("SELECT txid IS NOT NULL FROM {s}.events WHERE id = %s", (after,)) is True

    _setup(outboxd, db, "claims")
    assert _windows_state(db) == {"default": None, "indexes": []}
    assert db.count_events() == 2  # nothing written or lost by either switch


def test_a_windows_relay_refuses_an_outbox_not_set_up_for_it_and_touches_nothing(outboxd, db, relay, receiver):
    _setup(outboxd, db, "claims")
    ids = [db.enqueue("t", {"n": i}) for i in range(3)]
    r = relay(receiver, env=WINDOWS)
    assert r.wait(15) == EXIT_SCHEMA_MISSING, r.log()
    assert "run `outboxd consume-setup windows`" in r.log()
    assert receiver.ids() == []
    assert sorted(e["id"] for e in db.events()) == ids


def test_pending_events_move_to_windows_without_loss_or_reordering(outboxd, db, relay, receiver, tmp_path):
    """The upgrade path: events written before the setup are in no window; a
    windows relay parks them at startup (one deliveries row per destination,
    dead letters where nothing routes) and the window events of their keys
    queue behind them."""
    _setup(outboxd, db, "claims")
    by_key: dict = {}

    def enqueue(n: int, tag: str, topic: str = "up") -> None:
        for i in range(n):
            key = f"k{i % 3}"
            by_key.setdefault(key, []).append(db.enqueue(topic, {"tag": tag, "i": i}, key=key))

    enqueue(12, "before")
    unrouted = db.enqueue("nobody.listens", {"n": 0})
    _setup(outboxd, db, "windows")
    enqueue(6, "after-setup")

    config = tmp_path / "outboxd.toml"
    config.write_text(f'[destinations.hook]\nurl = "{receiver.url}"\n\n'
                      '[[routes]]\ntopics = ["up"]\ndestinations = ["hook"]\n')
    windows = relay(None, "--config", str(config), env=WINDOWS)
    enqueue(9, "windows")
    everything = [i for ids in by_key.values() for i in ids]
    assert wait_delivered(receiver, everything, timeout=30), \
        f"missing: {sorted(set(everything) - set(receiver.delivered_ids()))}"
    assert windows.alive(), windows.log()
    assert "events written before windows moved to deliveries" in windows.log()
    _in_key_order(receiver.snapshot(), by_key)
    assert not duplicates(receiver.delivered_ids()), duplicates(receiver.delivered_ids())
    assert unrouted not in receiver.ids()
    assert [d["id"] for d in db.dead_letters()] == [unrouted]
    assert db.wait_empty(timeout=10), db.events()


def test_a_relay_refuses_to_start_beside_a_live_relay_of_the_other_mode(outboxd, db, relay, receiver):
    """Side by side, a claiming and a windows relay would both send what the
    windows relay reads (sql/0015): whichever starts second refuses, exit 8,
    and starts once the other is gone."""
    _setup(outboxd, db, "windows")
    for n, (running, starting) in enumerate([("claims", "windows"), ("windows", "claims")]):
        first = relay(receiver, env={"OUTBOXD_CONSUME": running})
        event = db.enqueue("t", {"n": n})
        assert wait_delivered(receiver, [event], timeout=15), first.log()

        refused = relay(receiver, env={"OUTBOXD_CONSUME": starting})
        assert refused.wait(15) == EXIT_DB_UNSUITABLE, refused.log()
        assert (f'relay.consume = "{starting}": 1 relay(s) with relay.consume = "{running}" are running'
                in refused.log())
        assert first.alive(), first.log()
        # `outboxd status` says which mode the live relays use.
        assert live_relays(outboxd, db) == {"live": 1, "claiming": int(running == "claims"), "windows": int(running == "windows")}
        assert first.stop() == EXIT_OK  # the next round starts the other mode
    assert not duplicates(receiver.delivered_ids()), duplicates(receiver.delivered_ids())


def test_a_windows_relay_leaves_what_a_claiming_relay_is_sending_and_says_stop_it(outboxd, db, relay):
    """A claiming relay without live leases (registered nowhere, so not
    refused for its mode) still running on the outbox holds leases (and key
    holds) on events from before the setup; the windows relay parks the rest
    (here: delayed events), refuses with exit 8 and names the fix; once the
    claiming relay is gone every event is delivered once, in key order."""
    gate = threading.Event()

    def held(_req):
        gate.wait(45)
        return 200, {}, b"ok"

    _setup(outboxd, db, "claims")
    by_key = {"a": [db.enqueue("t", {"i": i}, key="a") for i in range(4)]}
    by_key["b"] = [db.enqueue("t", {"i": i}, key="b") for i in range(4)]
    later = [db.enqueue("t", {"i": i}, key="c", available_at="infinity") for i in range(2)]
    _setup(outboxd, db, "windows")
    with Receiver(held) as rx:
        claims = relay(rx, "--request-timeout", "60s", "--lease", "90s",
                       env={**CLAIMS, "OUTBOXD_LIVE_LEASES": "false"})
        # Both keys' heads are at the gate.
        assert rx.wait_until(lambda reqs: len(reqs) >= 2, timeout=15), claims.log()

        refused = relay(rx, env=WINDOWS)
        assert refused.wait(15) == EXIT_DB_UNSUITABLE, refused.log()
        assert "written before `outboxd consume-setup windows` are being sent by a relay that claims" \
            in refused.log()
        # What no claiming relay holds moved: the delayed events, due when they were.
        assert [(d["event_id"], d["due"]) for d in db.deliveries()] == [(i, False) for i in later], db.deliveries()
        gate.set()
        everything = by_key["a"] + by_key["b"]
        assert wait_delivered(rx, everything, timeout=30), claims.log()
        assert claims.stop() == EXIT_OK

        windows = relay(rx, env=WINDOWS)
        assert wait_until(lambda: db.count_events() == len(later), timeout=15), windows.log()
        assert windows.alive(), windows.log()
        _in_key_order(rx.snapshot(), by_key)
        assert not duplicates(rx.delivered_ids()), duplicates(rx.delivered_ids())
        assert [d["event_id"] for d in db.deliveries()] == later  # still waiting, not lost


def test_claims_is_refused_while_a_windows_relay_runs(outboxd, db, relay, receiver):
    _setup(outboxd, db, "windows")
    r = relay(receiver, env=WINDOWS)
    assert wait_until(lambda: db.scalar("SELECT count(*) FROM {s}.cursors WHERE owner IS NOT NULL") > 0, timeout=15), r.log()

    refused = outboxd("consume-setup", "claims", "--database-url", db.url, "--schema", db.schema)
    assert refused.rc == EXIT_DB_UNSUITABLE, refused
    assert 'relay.consume = "windows" are running' in refused.stderr, refused
    assert _windows_state(db)["default"] == "pg_current_xact_id()"  # rolled back whole

    assert r.stop() == EXIT_OK
    _setup(outboxd, db, "claims")
    assert _windows_state(db) == {"default": None, "indexes": []}


def test_claims_is_refused_while_a_windows_relay_that_holds_no_cursor_yet_runs(outboxd, db):
    """A windows relay that has registered but holds no cursor yet (one that
    parks the events from before the setup first): a live session that holds
    its lock and its row of `relays` stands for it."""
    _setup(outboxd, db, "windows")
    session = psycopg2.connect(db.url)
    try:
        session.autocommit = True
        with session.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(hashtextextended('outboxd.relay.starting', 0))")
        db.query("INSERT INTO {s}.relays (lease_owner, lock_key, consume) "
                 "VALUES ('starting', hashtextextended('outboxd.relay.starting', 0), 'windows')")
        refused = outboxd("consume-setup", "claims", "--database-url", db.url, "--schema", db.schema)
        assert refused.rc == EXIT_DB_UNSUITABLE, refused
        assert '1 relay(s) with relay.consume = "windows" are running' in refused.stderr, refused
        assert _windows_state(db)["default"] == "pg_current_xact_id()"
    finally:
        session.close()  # the relay is gone
    _setup(outboxd, db, "claims")
    assert _windows_state(db) == {"default": None, "indexes": []}


def test_consume_setup_print_is_sql_a_migration_tool_can_run_for_a_hostile_schema_name(outboxd, make_schema,
                                                                                         database_url, relay,
                                                                                         receiver):
    schema = make_schema(name=f'e2e cs "x"; \'y\' {secrets.token_hex(2)}')
    db = Db(database_url, schema)
    try:
        _setup(outboxd, db, "claims")
        printed = outboxd("consume-setup", "windows", "--print", "--schema", schema)  # needs no database
        assert printed.rc == EXIT_OK, printed
        assert printed.stdout.startswith("-- outboxd consume-setup windows\nBEGIN;\n"), printed.stdout
        apply_printed_sql(database_url, printed.stdout)
        assert _windows_state(db)["indexes"] == ["events_pre_window_key_idx", "events_txid_idx"]
        event = db.enqueue("t", {"n": 1})
        relay(receiver, schema=schema, env=WINDOWS)
        assert wait_delivered(receiver, [event], timeout=15)
    finally:
        db.close()


@pytest.mark.parametrize("mode", ["", "both"])
def test_consume_setup_needs_one_mode(outboxd, mode):
    r = outboxd("consume-setup", *([mode] if mode else []), "--schema", "x")
    assert r.rc == 2, r
    assert "claims or windows" in r.stderr, r


def test_consume_setup_on_an_outbox_older_than_the_binary_says_migrate(outboxd, db):
    db.query("ALTER TABLE {s}.events DROP COLUMN txid")  # as before migration 0009
    r = outboxd("consume-setup", "windows", "--database-url", db.url, "--schema", db.schema)
    assert r.rc == EXIT_SCHEMA_MISSING, r
    assert "older than this binary; run `outboxd migrate`" in r.stderr, r


def test_migration_0011_takes_the_windows_setup_away_unless_a_windows_relay_has_used_the_outbox_and_0016_sets_it_up(
        outboxd, database_url, make_schema, request):
    """0009 as first released set the txid default and built both indexes on
    every outbox. 0011 removes them where no windows relay has a cursor
    (producers stop paying), and keeps them where one has (taking the default
    away would hide every later event from that relay). 0016 (windows the
    default) sets both up again, whichever state it finds."""
    unused, in_use = make_schema(migrate=False), make_schema(migrate=False)
    dbs = []
    for name in (unused, in_use):
        install_sql_files(database_url, name, 9)
        dbs.append(Db(database_url, name))
        request.addfinalizer(dbs[-1].close)
        # What 0009 as first released added beyond the file as it is now
        # (the file was edited after its release; 0011 meets both).
        dbs[-1].query("ALTER TABLE {s}.events ALTER COLUMN txid SET DEFAULT pg_current_xact_id()")
        dbs[-1].query("CREATE INDEX events_txid_idx ON {s}.events (txid, id) WHERE txid IS NOT NULL")
        dbs[-1].query("CREATE INDEX events_pre_window_key_idx ON {s}.events (ordering_key, id) "
                      "WHERE txid IS NULL AND ordering_key IS NOT NULL")
    windows = {"default": "pg_current_xact_id()", "indexes": ["events_pre_window_key_idx", "events_txid_idx"]}
    assert _windows_state(dbs[0]) == windows  # what 0009 did
    dbs[1].query("INSERT INTO {s}.cursors (destination, slot, snap_a, system_identifier) "
                 "VALUES ('', 0, pg_current_snapshot(), (SELECT system_identifier FROM pg_control_system()))")
    for name in (unused, in_use):
        install_sql_files(database_url, name, 11, after=9)
    assert _windows_state(dbs[0]) == {"default": None, "indexes": []}
    assert _windows_state(dbs[1]) == windows
    for name in (unused, in_use):
        r = outboxd("--database-url", database_url, "--schema", name, "migrate")
        assert r.rc == EXIT_OK, r
        assert "version=0016" in r.stderr, r
    assert _windows_state(dbs[0]) == windows
    assert _windows_state(dbs[1]) == windows
