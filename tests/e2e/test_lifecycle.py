"""Lifecycle of a relay process: `run --once` (drain what is due, exit 0) and
SIGHUP (reload the configuration without dropping in-flight work), with
real processes, a real PostgreSQL and real HTTP receivers; and the systemd
unit's ExecReload carried out the way systemd does it."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time

from conftest import EXIT_OK, REPO
from helpers import claims_only, duplicates, wait_until
from receiver import Receiver

UNIT = REPO / "packaging" / "outboxd.service"


def write_config(tmp_path, text: str, name: str = "outboxd.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def one_destination(name: str, rx: Receiver, extra: str = "") -> str:
    return (f'[relay]\nshutdown_timeout = "10s"\n\n'
            f'[defaults.retry]\nbase = "1h"\ncap = "1h"\n\n'
            f'[destinations.{name}]\nurl = "{rx.url}"\n{extra}\n'
            f'[[routes]]\ntopics = [">"]\ndestinations = ["{name}"]\n')


def ok(rx: Receiver) -> list:
    return [r.event_id for r in rx.snapshot() if 200 <= r.status < 300]


# --------------------------------------------------------------------------
# run --once
# --------------------------------------------------------------------------
def test_run_once_delivers_everything_due_and_exits_0_leaving_what_is_not_due(db, relay, receiver):
    due = [db.enqueue("orders.created", {"n": n}) for n in range(40)]
    keyed = [db.enqueue("orders.keyed", {"n": n}, key="K") for n in range(5)]  # one at a time, in order
    later = db.enqueue("orders.later", {"n": 0}, available_at="2999-01-01T00:00:00Z")
    r = relay(receiver, "--once", "--concurrency", "4")
    assert r.wait(30) == EXIT_OK, r.log()
    got = ok(receiver)
    assert sorted(got) == sorted(due + keyed), got
    assert not duplicates(got)
    assert [i for i in got if i in keyed] == keyed
    assert [e["id"] for e in db.events()] == [later]
    assert "nothing left that is due" in r.log()
    # Its leases are given back and its relays row is left for takeover: nothing held.
    assert db.scalar("SELECT count(*) FROM {s}.events WHERE lease_owner IS NOT NULL") == 0


def test_run_once_on_an_empty_outbox_exits_0_at_once(db, relay, receiver):
    r = relay(receiver, "--once")
    assert r.wait(10) == EXIT_OK, r.log()
    assert receiver.snapshot() == []


@claims_only("inspects the event row's attempts; a window event's retry lives in its delivery row")
def test_run_once_leaves_a_retry_not_yet_due_for_the_next_run(db, relay, tmp_path):
    failing = {"id": None}

    def responder(req):
        return (500, {}, b"no") if req.event_id == failing["id"] else (200, {}, b"ok")

    with Receiver(responder) as rx:
        failing["id"] = db.enqueue("orders.created", {"n": "fails"})
        others = [db.enqueue("orders.created", {"n": n}) for n in range(10)]
        config = write_config(tmp_path, one_destination("a", rx))
        r = relay(None, "--config", config, "--once")
        assert r.wait(30) == EXIT_OK, r.log()
        assert sorted(ok(rx)) == sorted(others)
        # Attempted once, waiting out its backoff (1h) in the outbox.
        row = db.event(failing["id"])
        assert row is not None and row["attempts"] == 1, row
        attempts_seen = [q.event_id for q in rx.snapshot()].count(failing["id"])
        assert attempts_seen == 1

        # The next run finds nothing due: it sends nothing and exits.
        r2 = relay(None, "--config", config, "--once")
        assert r2.wait(15) == EXIT_OK, r2.log()
        assert [q.event_id for q in rx.snapshot()].count(failing["id"]) == 1


def test_run_once_sends_a_retry_that_falls_due_while_it_is_still_busy(db, relay, tmp_path):
    """Event F fails once (retry in 300 ms); event S is held at the receiver
    for 1.5 s. The run is not over while S is out, so F's retry, due in the
    meantime, is sent in the same run."""
    first_try = {"done": False}
    slow = {"id": None}

    def responder(req):
        if req.event_id == slow["id"]:
            time.sleep(1.5)
            return 200, {}, b"ok"
        if not first_try["done"]:
            first_try["done"] = True
            return 503, {}, b"busy"
        return 200, {}, b"ok"

    with Receiver(responder) as rx:
        f = db.enqueue("orders.created", {"n": "F"})
        slow["id"] = db.enqueue("orders.created", {"n": "S"})
        config = write_config(tmp_path, one_destination("a", rx).replace('base = "1h"\ncap = "1h"',
                                                                         'base = "300ms"\ncap = "300ms"'))
        r = relay(None, "--config", config, "--once")
        assert r.wait(30) == EXIT_OK, r.log()
        assert sorted(ok(rx)) == sorted([f, slow["id"]]), [(q.event_id, q.status) for q in rx.snapshot()]
        assert db.count_events() == 0


def test_run_once_exits_3_when_the_database_is_unreachable(outboxd):
    r = outboxd("run", "--once", "--database-url", "postgresql://nobody@127.0.0.1:1/none",
                "--url", "http://127.0.0.1:9/hook", "--database-connect-timeout", "2s", timeout=30)
    assert r.rc == 3, r


# --------------------------------------------------------------------------
# SIGHUP
# --------------------------------------------------------------------------
def test_sighup_moves_new_work_to_the_new_destination_while_the_request_in_flight_finishes_at_the_old(
        db, relay, tmp_path):
    release = threading.Event()

    def held(req):
        release.wait(10)
        return 200, {}, b"ok"

    with Receiver(held) as a, Receiver() as b:
        config = write_config(tmp_path, one_destination("a", a))
        r = relay(None, "--config", config)
        first = db.enqueue("orders.created", {"n": 1})
        assert a.wait_until(lambda reqs: len(reqs) == 1, 10), r.log()  # in flight at a, held there

        write_config(tmp_path, one_destination("b", b))
        r.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "reloading" in r.log(), 5), r.log()
        # Nothing new is claimed while the old configuration drains.
        second = db.enqueue("orders.created", {"n": 2})
        time.sleep(0.3)  # creates the situation: a claim would have happened by now
        assert b.snapshot() == [] and len(a.snapshot()) == 1
        release.set()
        assert b.wait_for(1, timeout=10), r.log()
        assert db.wait_empty(5), db.events()
        assert ok(a) == [first] and ok(b) == [second]
        assert "reloaded" in r.log()
        assert r.alive()
        # The new configuration keeps working, and the process stops cleanly.
        third = db.enqueue("orders.created", {"n": 3})
        assert b.wait_for(2, timeout=10)
        assert ok(b) == [second, third] and ok(a) == [first]
        assert r.stop(signal.SIGTERM) == EXIT_OK


def test_sighup_with_an_invalid_configuration_changes_nothing(db, relay, tmp_path):
    with Receiver() as a:
        config = write_config(tmp_path, one_destination("a", a))
        r = relay(None, "--config", config)
        first = db.enqueue("orders.created", {"n": 1})
        assert a.wait_for(1, timeout=10)
        write_config(tmp_path, '[destinations.a]\nurl = "ftp://nowhere"\n')
        r.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "reload refused" in r.log(), 5), r.log()
        second = db.enqueue("orders.created", {"n": 2})
        assert a.wait_for(2, timeout=10), r.log()
        assert ok(a) == [first, second]
        assert "reloading" not in r.log()
        assert r.alive()


def test_sighup_that_changes_the_database_is_refused(db, relay, tmp_path):
    with Receiver() as a:
        config = write_config(tmp_path, one_destination("a", a))
        r = relay(None, "--config", config)
        assert wait_until(lambda: "relay started" in r.log(), 10), r.log()
        write_config(tmp_path, '[database]\nstatement_timeout = "7s"\n\n' + one_destination("a", a))
        r.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "reload refused" in r.log(), 5), r.log()
        assert "setting=database.statement_timeout" in r.log()
        assert "reloading" not in r.log()
        event = db.enqueue("orders.created", {"n": 1})
        assert a.wait_for(1, timeout=10)
        assert ok(a) == [event]


def test_sigterm_during_a_reload_stops_after_the_in_flight_request(db, relay, tmp_path):
    release = threading.Event()

    def held(req):
        release.wait(10)
        return 200, {}, b"ok"

    with Receiver(held) as a, Receiver() as b:
        r = relay(None, "--config", write_config(tmp_path, one_destination("a", a)))
        event = db.enqueue("orders.created", {"n": 1})
        assert a.wait_until(lambda reqs: len(reqs) == 1, 10), r.log()
        write_config(tmp_path, one_destination("b", b))
        r.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "reloading" in r.log(), 5), r.log()
        r.send_signal(signal.SIGTERM)
        assert wait_until(lambda: "shutting down" in r.log(), 5), r.log()
        release.set()
        assert r.wait(10) == EXIT_OK, r.log()
        assert ok(a) == [event] and b.snapshot() == []
        assert db.count_events() == 0


# --------------------------------------------------------------------------
# systemd: ExecReload as systemd runs it
# --------------------------------------------------------------------------
def test_systemd_unit_exec_reload_reloads_a_running_relay(db, relay, tmp_path):
    """ExecReload= from packaging/outboxd.service, with $MAINPID set to a
    running relay's pid, as systemd would run it on `systemctl reload`."""
    lines = [line for line in UNIT.read_text().splitlines() if line.startswith("ExecReload=")]
    assert len(lines) == 1, lines
    command = lines[0].split("=", 1)[1]
    with Receiver() as a, Receiver() as b:
        r = relay(None, "--config", write_config(tmp_path, one_destination("a", a)))
        assert wait_until(lambda: "relay started" in r.log(), 10), r.log()
        write_config(tmp_path, one_destination("b", b))
        argv = [w.replace("$MAINPID", str(r.pid)) for w in shlex.split(command)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, env=dict(os.environ))
        assert done.returncode == 0, done
        assert wait_until(lambda: "reloaded" in r.log(), 10), r.log()
        event = db.enqueue("orders.created", {"n": 1})
        assert b.wait_for(1, timeout=10), r.log()
        assert ok(b) == [event] and a.snapshot() == []
