"""webhook-id, the id consumers de-duplicate on, is unique across outboxes
and time: two schemas (or databases, or an outbox dropped and made again)
that both have an event 1 send different ids, while one event keeps its id
across retries and dead-letter replays."""

from __future__ import annotations

import json
import re
import threading

from conftest import EXIT_OK, Db
from helpers import wait_delivered
from receiver import Receiver


def test_event_1_of_two_outboxes_has_two_different_message_ids(make_schema, database_url, relay, receiver):
    schemas = [make_schema(), make_schema()]
    for schema in schemas:
        db = Db(database_url, schema)
        try:
            assert db.enqueue("t", {"schema": schema}) == 1
        finally:
            db.close()
        relay(receiver, "--sweep-interval", "1h", schema=schema)
    assert receiver.wait_for(2, 10), receiver.snapshot()
    sent = {r.json()["schema"]: r.headers["webhook-id"] for r in receiver.snapshot()}
    assert sent[schemas[0]] != sent[schemas[1]], f"two outboxes sent the same webhook-id: {sent}"
    for schema in schemas:
        assert re.fullmatch(r"msg_[0-9a-f]{16}_1", sent[schema]), sent
        db = Db(database_url, schema)
        try:
            assert db.message_id(1) == sent[schema], "message_id() in SQL gives what the relay sends"
        finally:
            db.close()


def test_one_event_keeps_its_message_id_across_retries_and_a_replay(db, relay, outboxd):
    lock = threading.Lock()
    failing = {"on": True}

    def responder(req):
        with lock:
            return (410, {}, b"gone") if failing["on"] else (200, {}, b"ok")

    with Receiver(responder) as rx:
        relay(rx, "--retry-base", "50ms", "--retry-cap", "50ms", "--sweep-interval", "1h")
        event_id = db.enqueue("t", {"n": 1})
        message_id = db.scalar("SELECT {s}.message_id(%s)", (event_id,))
        assert rx.wait_for(1, 10)
        assert db.wait_empty(timeout=5)
        listed = outboxd("dead", "list", "--json", "--database-url", db.url, "--schema", db.schema)
        assert listed.rc == EXIT_OK, listed
        assert json.loads(listed.stdout.splitlines()[0])["message_id"] == message_id, listed.stdout
        with lock:
            failing["on"] = False
        assert outboxd("dead", "replay", "--id", str(event_id), "--database-url", db.url,
                       "--schema", db.schema).rc == EXIT_OK
        assert wait_delivered(rx, [event_id], 10)
        assert [r.headers["webhook-id"] for r in rx.snapshot()] == [message_id, message_id]
