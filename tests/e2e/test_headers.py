"""Per-event headers (the row's headers jsonb): sent along, but they can neither
override the protocol headers nor inject new ones, and an event whose headers
cannot be sent is dead-lettered without harming the relay."""

from __future__ import annotations

import json
import signal
import time

import psycopg2
import psycopg2.errors
import pytest
from psycopg2 import sql

from helpers import wait_delivered, wait_until
from receiver import Receiver


def test_event_headers_are_sent_but_cannot_override_protocol_headers(db, receiver, relay):
    spoof = {
        "x-tenant": "acme",
        "webhook-id": "999999",
        "webhook-timestamp": "1",
        "outbox-topic": "spoofed",
        "outbox-attempt": "42",
        "content-length": "0",
        "transfer-encoding": "chunked",
        "host": "evil.example",
        "connection": "close",
    }
    payload = {"with": "spoofed headers"}
    event_id = db.enqueue("real.topic", payload, headers=spoof)
    good = db.enqueue("real.topic", {"after": True})
    relay(receiver, "--sweep-interval", "1h")
    assert wait_until(lambda: db.count_events() == 0, 10), db.events()

    # Reserved names in an event's headers are dropped, not a reason to
    # refuse the event: it is delivered (once), with the protocol's values.
    assert db.count_dead_letters() == 0, f"event with reserved header names dead-lettered: {db.dead_letters()}"
    sent = [r for r in receiver.snapshot() if r.event_id == event_id]
    assert len(sent) == 1, f"event with reserved header names sent {len(sent)} times: {receiver.ids()}"
    req = sent[0]
    names = [n for n, _ in req.header_list]
    for n in ("webhook-id", "webhook-timestamp", "outbox-topic", "outbox-attempt", "host",
              "content-length"):
        assert names.count(n) == 1, f"{n} sent {names.count(n)} times: {req.header_list}"
    assert req.headers["webhook-id"] == db.message_id(event_id)
    assert req.headers["outbox-topic"] == "real.topic"
    assert req.headers["outbox-attempt"] == "1"
    assert int(req.headers["webhook-timestamp"]) > 1_000_000_000
    assert req.headers["host"] == f"127.0.0.1:{receiver.port}"
    assert "transfer-encoding" not in req.headers
    # The body is the payload as PostgreSQL renders jsonb, byte for byte, and
    # exactly as long as content-length says.
    rendered = db.scalar("SELECT %s::jsonb::text", (json.dumps(payload),)).encode()
    assert req.body == rendered, (req.body, rendered)
    assert len(req.body) == int(req.headers["content-length"]) > 0
    assert req.json() == payload
    assert req.headers.get("x-tenant") == "acme", req.header_list
    # framing intact: the next event on the (keep-alive) connection arrived whole
    assert wait_delivered(receiver, [good], timeout=5)
    assert [r.json() for r in receiver.snapshot() if r.event_id == good] == [{"after": True}]


UNSENDABLE = [{"x-evil": "a\r\nInjected: yes"}, {"bad name": "v"}, {"x-nl": "a\nInjected: yes"},
              {"": "empty name"}, {"x-nul": "a\u0001b"}]


@pytest.mark.parametrize("headers", UNSENDABLE, ids=["crlf", "space-in-name", "lf", "empty-name", "ctl"])
def test_enqueue_refuses_headers_that_cannot_be_sent(db, headers):
    with pytest.raises(psycopg2.errors.CheckViolation):
        db.enqueue("bad", {}, headers=headers)
    assert db.count_events() == 0


def test_validation_says_which_rule_and_holds_for_replication_sessions(db):
    # A trigger (sql/0003), not CHECK constraints: it must hold where CHECKs
    # did, including sessions that skip ordinary triggers (logical
    # replication, restores), and name what is wrong.
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET session_replication_role = replica")
        for kwargs, what in [({"headers": {"x-evil": "a\r\nInjected: yes"}}, "headers"),
                             ({"topic": "bad\ntopic"}, "topic"), ({"key": "k\x01"}, "ordering_key")]:
            with pytest.raises(psycopg2.errors.CheckViolation) as err:
                db.enqueue(kwargs.get("topic", "t"), {}, key=kwargs.get("key"), headers=kwargs.get("headers"),
                           conn=conn)
            conn.rollback()
            assert f"outbox event {what} must" in str(err.value), err.value
    finally:
        conn.close()
    assert db.count_events() == 0


def test_relay_dead_letters_unsendable_rows_without_stalling(db, relay):
    """Defence in depth: rows that got past the validating trigger (a schema
    installed by hand from older SQL, a trigger disabled by an operator) must
    still never be sent (no header injection); the relay dead-letters them and
    carries on with full capacity. --concurrency 1 makes a leaked in-flight
    slot stall the relay outright."""
    db.query(sql.SQL("ALTER TABLE {} DISABLE TRIGGER events_validate").format(db.t("events")))
    with Receiver() as rx:
        r = relay(rx, "--sweep-interval", "1h", "--concurrency", "1",
                  "--shutdown-timeout", "8s")
        warm = db.enqueue("warm", {})
        assert wait_delivered(rx, [warm], timeout=10)

        # One at a time, each while nothing else is in flight.
        bad = []
        for i, headers in enumerate(UNSENDABLE):
            bad.append(db.enqueue("bad", {"i": i}, headers=headers))
            assert wait_until(lambda: db.count_dead_letters() == len(bad), 5), \
                f"unsendable event {bad[-1]} ({headers!r}) not dead-lettered: rows {db.events()}"
        good = [db.enqueue("good", {"i": i}) for i in range(4)]

        assert wait_delivered(rx, good, timeout=10), \
            (f"relay stalled after unsendable events (concurrency 1): delivered {rx.delivered_ids()}, "
             f"rows {db.events()}")
        assert all("injected" not in q.headers for q in rx.snapshot()), \
            [q.header_list for q in rx.snapshot() if "injected" in q.headers]
        assert not [q for q in rx.snapshot() if q.event_id in bad], "unsendable event was sent"
        assert all(d["last_error"] for d in db.dead_letters())
        assert db.wait_empty(timeout=5), db.events()

        # Nothing is in flight now: shutdown must not wait for phantom deliveries.
        t0 = time.monotonic()
        rc = r.stop(signal.SIGTERM, timeout=15)
        took = time.monotonic() - t0
        assert rc == 0, r.log()
        assert took < 3, f"idle relay took {took:.1f}s to stop (waited for phantom in-flight work?)"
