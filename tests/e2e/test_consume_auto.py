"""relay.consume = "auto", the default: a relay reads commit-ordered windows
where it can (migrate sets every outbox up for them, sql/0016), claims where
windows cannot work for it or the operator chose claims, and joins the mode
of the relays already running, so that neither a rolling restart nor the
upgrade to 0016 ever stops on the one-mode-per-outbox check (exit 8).
Which mode it chose, and why, is in its "relay started" line."""

from __future__ import annotations

import json
import re
import secrets
import signal
import threading
from datetime import datetime, timedelta, timezone

from psycopg2 import sql

from conftest import EXIT_DB_UNSUITABLE, EXIT_OK, Db, admin_execute, install_sql_files
from helpers import consume_setup as _setup, duplicates, live_relays as _live_relays, wait_delivered, wait_until
from receiver import Receiver
from test_metrics import admin_port, scrape, value

AUTO = {"OUTBOXD_CONSUME": "auto"}


def _started(relay_proc) -> dict:
    """consume and consume_because from the relay's "relay started" line."""
    assert wait_until(lambda: "relay started" in relay_proc.log(), 15), relay_proc.log()
    line = next(l for l in relay_proc.log().splitlines() if "relay started" in l)
    fields = dict(re.findall(r'(consume(?:_because)?)=("[^"]*"|\S+)', line))
    return {k: v.strip('"') for k, v in fields.items()}


def _auto_would(outboxd, db) -> dict:
    """What `outboxd status` says a relay with relay.consume = "auto" started
    now would choose."""
    status = outboxd("status", "--json", "--database-url", db.url, "--schema", db.schema)
    assert status.rc == EXIT_OK, status
    return next(row["consume_auto"] for row in map(json.loads, status.stdout.splitlines()) if "consume_auto" in row)


def test_a_freshly_migrated_outbox_is_read_in_windows(outboxd, db, relay, receiver):
    _setup(outboxd, db, "windows")  # as migrate leaves it, whatever mode the suite runs in
    assert _auto_would(outboxd, db) == {"mode": "windows", "because": "the default"}
    text = outboxd("status", "--database-url", db.url, "--schema", db.schema)
    assert 'a relay started now with relay.consume = "auto" would read windows (the default)' in text.stdout, text
    r = relay(receiver, "--admin-listen", "127.0.0.1:0", env=AUTO)
    assert _started(r) == {"consume": "windows", "consume_because": "the default"}
    metrics = scrape(admin_port(r))
    assert value(metrics, "outboxd_consume_mode", mode="windows") == 1
    assert value(metrics, "outboxd_consume_mode", mode="auto") == 0
    ids = [db.enqueue("t", {"n": i}, key=f"k{i % 2}") for i in range(20)]
    assert wait_delivered(receiver, ids, timeout=15), r.log()
    assert _live_relays(outboxd, db) == {"live": 1, "claiming": 0, "windows": 1}
    # A windows relay holds window cursors and leases no event.
    assert db.scalar("SELECT count(*) FROM {s}.cursors WHERE owner IS NOT NULL") > 0
    assert db.scalar("SELECT count(*) FROM {s}.events WHERE lease_owner IS NOT NULL") == 0
    assert "relay.consume = \"claims\" on an outbox set up for windows" not in r.log()
    assert r.alive(), r.log()


def test_a_reload_keeps_the_mode_the_relay_settled_on(outboxd, db, relay, receiver, tmp_path):
    """SIGHUP rebuilds the engine from the file, which says "auto": the new
    engine must read windows as the old one did (an engine on "auto" would
    claim: lease the events it sends)."""
    _setup(outboxd, db, "windows")
    gate = threading.Event()

    def held(_req):
        gate.wait(20)
        return 200, {}, b"ok"

    config = tmp_path / "outboxd.toml"
    config.write_text(f'[destinations.a]\nurl = "{receiver.url}"\n\n[[routes]]\ntopics = [">"]\ndestinations = ["a"]\n')
    # relay.consume from the file alone (not set there: the default).
    r = relay(None, "--config", str(config), "--admin-listen", "127.0.0.1:0", env={"OUTBOXD_CONSUME": None})
    assert _started(r) == {"consume": "windows", "consume_because": "the default"}
    first = db.enqueue("t", {"n": 1})
    assert wait_delivered(receiver, [first], timeout=15), r.log()
    with Receiver(held) as rx:
        config.write_text(f'[destinations.b]\nurl = "{rx.url}"\n\n[[routes]]\ntopics = [">"]\ndestinations = ["b"]\n')
        r.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "reloaded" in r.log(), 10), r.log()
        assert "reload refused" not in r.log()
        second = db.enqueue("t", {"n": 2})
        assert rx.wait_until(lambda reqs: len(reqs) >= 1, timeout=15), r.log()
        # In flight at b: read from a window, so not leased.
        assert db.scalar("SELECT count(*) FROM {s}.events WHERE lease_owner IS NOT NULL") == 0
        gate.set()
        assert wait_delivered(rx, [second], timeout=15), r.log()
    assert value(scrape(admin_port(r)), "outboxd_consume_mode", mode="windows") == 1
    # The mode running named in the file: no restart needed; another: refused.
    config.write_text(config.read_text() + '\n[relay]\nconsume = "windows"\n')
    r.send_signal(signal.SIGHUP)
    assert wait_until(lambda: r.log().count("msg=reloaded") == 2, 10), r.log()
    config.write_text(config.read_text().replace('consume = "windows"', 'consume = "claims"'))
    r.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "reload refused" in r.log(), 10), r.log()
    assert "setting=relay.consume" in r.log()
    assert r.alive(), r.log()


def test_an_outbox_set_up_for_claims_is_claimed(outboxd, db, relay, receiver):
    _setup(outboxd, db, "claims")
    assert _auto_would(outboxd, db) == {"mode": "claims", "because": "the outbox is set up for claims"}
    r = relay(receiver, "--admin-listen", "127.0.0.1:0", env=AUTO)
    assert _started(r) == {"consume": "claims", "consume_because": "the outbox is set up for claims"}
    assert value(scrape(admin_port(r)), "outboxd_consume_mode", mode="claims") == 1
    ids = [db.enqueue("t", {"n": i}) for i in range(5)]
    assert wait_delivered(receiver, ids, timeout=15), r.log()
    assert db.wait_empty(10), db.events()  # claimed events are deleted once delivered
    assert _live_relays(outboxd, db) == {"live": 1, "claiming": 1, "windows": 0}
    assert "on an outbox set up for windows" not in r.log()


def test_without_live_leases_it_claims_and_says_what_producers_pay_for_nothing(outboxd, db, relay, receiver):
    _setup(outboxd, db, "windows")
    r = relay(receiver, env={**AUTO, "OUTBOXD_LIVE_LEASES": "false"})
    assert _started(r) == {"consume": "claims", "consume_because": "relay.live_leases = false"}
    assert "run `outboxd consume-setup claims` to drop it" in r.log()
    ids = [db.enqueue("t", {"n": i}) for i in range(5)]
    assert wait_delivered(receiver, ids, timeout=15), r.log()
    assert db.wait_empty(10), db.events()


def test_a_new_relay_joins_the_mode_of_the_live_relays(outboxd, db, relay, receiver):
    """Beside a relay that claims by configuration, on an outbox set up for
    windows, the default relay claims too (it would otherwise refuse, exit 8);
    beside a windows relay it reads windows. Every event once."""
    _setup(outboxd, db, "windows")
    sent = []
    for n, running in enumerate(["claims", "windows"]):
        first = relay(receiver, env={"OUTBOXD_CONSUME": running})
        assert wait_until(lambda: _live_relays(outboxd, db)["live"] == 1, 15), first.log()
        joining = relay(receiver, env=AUTO)
        assert _started(joining) == {"consume": running,
                                     "consume_because": "the mode of the relays already running"}
        ids = [db.enqueue("t", {"round": n, "i": i}, key=f"k{i % 3}") for i in range(30)]
        sent += ids
        assert wait_delivered(receiver, ids, timeout=15), (first.log(), joining.log())
        assert first.alive() and joining.alive(), (first.log(), joining.log())
        assert _live_relays(outboxd, db)["live"] == 2
        assert first.stop() == EXIT_OK
        assert joining.stop() == EXIT_OK
        # Their sessions end at the server a moment after the processes.
        assert wait_until(lambda: _live_relays(outboxd, db)["live"] == 0, 15)
    assert not duplicates(receiver.delivered_ids()), duplicates(receiver.delivered_ids())


def test_upgrading_to_0016_under_load_loses_nothing_and_switches_to_windows_at_the_next_full_stop(
        outboxd, make_schema, database_url, relay, receiver, request):
    """The upgrade as the README tells it: relays of 0015 claim; migrate to
    0016 while they run; a relay started then joins them; once every relay has
    stopped, the next reads windows and first parks what is left from before
    0016 (no txid) ahead of the later events of their keys."""
    name = make_schema(migrate=False)
    install_sql_files(database_url, name, 15)
    db = Db(database_url, name)
    request.addfinalizer(db.close)
    by_key: dict = {}

    def enqueue(n: int, tag: str, **kw) -> None:
        for i in range(n):
            key = f"k{i % 4}"
            by_key.setdefault(key, []).append(db.enqueue("t", {"tag": tag, "i": i}, key=key, **kw))

    enqueue(8, "before-0016")
    # Due in an hour: still in the outbox, with no txid, at the switch.
    later = db.enqueue("t", {"tag": "later"}, key="w", available_at=datetime.now(timezone.utc) + timedelta(hours=1))
    r = outboxd("--database-url", database_url, "--schema", name, "migrate")
    assert r.rc == EXIT_OK and "version=0016" in r.stderr, r
    # The relays of 0015 still running: this binary refuses to start on an
    # outbox older than itself, so a relay of it that claims by
    # configuration stands in for them (to a new relay both look alike).
    old = relay(receiver, schema=name, env={"OUTBOXD_CONSUME": "claims"})
    assert _started(old)["consume"] == "claims"
    # As a relay of 0006 to 0014 registers: without a mode.
    db.query("UPDATE {s}.relays SET consume = NULL")
    assert _auto_would(outboxd, db) == {"mode": "claims", "because": "the mode of the relays already running"}
    enqueue(8, "after-0016")
    new = relay(receiver, schema=name, env=AUTO)
    assert _started(new) == {"consume": "claims", "consume_because": "the mode of the relays already running"}
    assert "read windows once every relay has stopped and one starts again" in new.log()
    enqueue(8, "both-running")
    assert old.stop() == EXIT_OK
    assert new.stop() == EXIT_OK
    assert wait_until(lambda: _live_relays(outboxd, db)["live"] == 0, 15)

    assert _auto_would(outboxd, db) == {"mode": "windows", "because": "the default"}
    enqueue(8, "stopped")
    windows = relay(receiver, schema=name, env=AUTO)
    assert _started(windows) == {"consume": "windows", "consume_because": "the default"}
    enqueue(8, "windows")
    everything = [i for ids in by_key.values() for i in ids]
    assert wait_delivered(receiver, everything, timeout=30), \
        f"missing: {sorted(set(everything) - set(receiver.delivered_ids()))}\n{windows.log()}"
    assert windows.alive(), windows.log()
    assert not duplicates(receiver.delivered_ids()), duplicates(receiver.delivered_ids())
    # The one left from before 0016 was parked, on its own schedule.
    assert "events written before windows moved to deliveries" in windows.log()
    assert [(d["event_id"], d["due"]) for d in db.deliveries()] == [(later, False)], db.deliveries()
    for key, ids in by_key.items():
        seen = [r.event_id for r in receiver.snapshot()
                if r.headers.get("outbox-ordering-key") == key and 200 <= r.status < 300]
        assert seen == ids, f"key {key}: delivered {seen}, enqueued {ids}"


def test_a_relay_that_registers_again_beside_relays_of_the_other_mode_stops(outboxd, db, relay, receiver,
                                                                            database_url):
    """Liveness is a session: a relay whose connections were cut looks dead
    until it reconnects, and an auto relay started in that gap chooses
    windows. The claiming relay, registering again, finds it and stops (exit
    8) before it claims anything; the windows relay delivers everything."""
    _setup(outboxd, db, "windows")
    role = f"e2e_gap_{secrets.token_hex(3)}"
    admin_execute(database_url, sql.SQL("CREATE ROLE {} LOGIN IN ROLE postgres").format(sql.Identifier(role)))
    try:
        scheme, rest = database_url.split("://", 1)
        claiming = relay(receiver, "--sweep-interval", "500ms", database_url=f"{scheme}://{role}@{rest.split('@', 1)[1]}",
                         env={"OUTBOXD_CONSUME": "claims"})
        assert _started(claiming)["consume"] == "claims"
        first = db.enqueue("t", {"n": "before"})
        assert wait_delivered(receiver, [first], timeout=15), claiming.log()
        # Its sessions end, and it cannot log in again for now.
        admin_execute(database_url, sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(role)))
        admin_execute(database_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                      (role,))
        assert wait_until(lambda: _live_relays(outboxd, db)["live"] == 0, 15), claiming.log()

        windows = relay(receiver, env=AUTO)
        assert _started(windows) == {"consume": "windows", "consume_because": "the default"}
        during = [db.enqueue("t", {"n": i}, key=f"k{i % 3}") for i in range(10)]
        assert wait_delivered(receiver, during, timeout=15), windows.log()

        admin_execute(database_url, sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(role)))
        assert claiming.wait(30) == EXIT_DB_UNSUITABLE, claiming.log()
        assert 'relay.consume = "claims": 1 relay(s) with relay.consume = "windows" are running' in claiming.log()
        assert "found when this relay registered again after its connection was lost" in claiming.log()
        after = [db.enqueue("t", {"n": i}, key=f"k{i % 3}") for i in range(10)]
        assert wait_delivered(receiver, after, timeout=15), windows.log()
        assert windows.alive(), windows.log()
        assert not duplicates(receiver.delivered_ids()), duplicates(receiver.delivered_ids())
    finally:
        admin_execute(database_url, sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
