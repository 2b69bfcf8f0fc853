"""The stdout transport: one JSON line per event, same delivery semantics as
a webhook (a failed write is a failed attempt: retried, never lost)."""

from __future__ import annotations

import json
import subprocess

from conftest import clean_env
from helpers import wait_until


def test_one_json_line_per_event_with_its_headers_and_payload(db, relay):
    r = relay("stdout")
    plain = db.enqueue("orders.created", {"order": 1, "text": "é \" \\ \n"})
    keyed = db.enqueue("orders.paid", {"order": 1}, key="order-1", headers={"X-Tenant": "acme"})
    assert db.wait_empty(timeout=10), db.events()
    assert wait_until(lambda: len(r.stdout().splitlines()) >= 2, 5), r.stdout()

    lines = [json.loads(line) for line in r.stdout().splitlines()]
    assert [line["id"] for line in lines] == [plain, keyed]
    first, second = lines
    assert first["topic"] == "orders.created" and first["ordering_key"] is None
    assert first["payload"] == {"order": 1, "text": "é \" \\ \n"}
    assert first["attempt"] == 1
    assert first["headers"]["webhook-id"] == db.message_id(plain)
    assert second["ordering_key"] == "order-1"
    assert second["headers"]["X-Tenant"] == "acme"
    assert second["headers"]["outbox-topic"] == "orders.paid"
    # stdout carries the lines and nothing else: logs go to stderr.
    assert "level=" not in r.stdout()
    assert "relay started" in r.log()


def test_a_reader_that_goes_away_fails_the_attempt_and_loses_nothing(db, outboxd_bin, database_url, schema):
    argv = [outboxd_bin, "--log-level", "debug", "run", "--database-url", database_url, "--schema", schema,
            "--url", "stdout", "--retry-base", "200ms", "--retry-cap", "200ms", "--sweep-interval", "1h"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(), start_new_session=True)
    try:
        first = db.enqueue("t", {"n": 1})
        line = json.loads(proc.stdout.readline())
        assert line["id"] == first
        assert db.wait_empty(timeout=10)

        proc.stdout.close()  # the reader goes away: writes now fail with EPIPE
        lost = db.enqueue("t", {"n": 2})

        def failed_twice():
            state = db.retry_state(lost)
            return state if state and state["attempts"] >= 2 and state["last_error"] else None
        state = wait_until(failed_twice, 10)
        assert state, db.retry_state(lost)
        assert "stdout" in state["last_error"] and "pipe" in state["last_error"].lower(), state
        assert db.event(lost) is not None, "an event that could not be written left the outbox"
        assert proc.poll() is None, "outboxd died on a closed stdout (SIGPIPE?)"
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err.decode(errors="replace")
