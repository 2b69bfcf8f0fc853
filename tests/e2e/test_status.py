"""`outboxd status`: every count means exactly what the README says.

Work is counted per topic, once per event, or once per destination that
still owes a fanned-out event; each piece of work is in exactly one state:
pending (due now, never attempted), waiting_on_key (behind an earlier event
of its ordering key), scheduled (delayed, not due yet), in_flight (leased by a
relay), retrying (attempted before, waiting for its next attempt); dead
counts dead letters. oldest_pending_seconds is how long the oldest work that
is due now (pending, waiting on its key, or a retry now due) has been due."""

from __future__ import annotations

import json

from conftest import EXIT_OK


def _status(outboxd, db) -> dict:
    r = outboxd("status", "--json", "--database-url", db.url, "--schema", db.schema)
    assert r.rc == EXIT_OK, r
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    return {row["topic"]: row for row in rows}


def _event(db, topic, key=None, due="now()", attempts=0, lease_owner=None, fanned_out=False,
           created="now()", last_error=None) -> int:
    return db.scalar(
        "INSERT INTO {s}.events (topic, ordering_key, payload, available_at, attempts, lease_owner, fanned_out, "
        f"created_at, last_error) VALUES (%s, %s, '{{{{}}}}', {due}, %s, %s, %s, {created}, %s) RETURNING id",
        (topic, key, attempts, lease_owner, fanned_out, last_error))


def _delivery(db, event_id, destination, key=None, due="now()", attempts=0, lease_owner=None, last_error=None):
    db.query("INSERT INTO {s}.deliveries (event_id, destination, ordering_key, available_at, attempts, "
             f"lease_owner, last_error) VALUES (%s, %s, %s, {due}, %s, %s, %s) RETURNING event_id",
             (event_id, destination, key, attempts, lease_owner, last_error))


def test_each_status_count_means_one_state(outboxd, db):
    _event(db, "a", created="now() - interval '10 minutes'", due="now() - interval '2 minutes'")
    _event(db, "a")
    _event(db, "later", due="now() + interval '1 hour'", created="now() - interval '3 hours'")
    _event(db, "fly", attempts=1, lease_owner="relay-x", due="now() + interval '30 seconds'")

    # Key K: e1 failed at d and retries in an hour; e2 queued behind it at d
    # (fanned out for its key, never attempted); e3 not claimed yet.
    e1 = _event(db, "keyed", key="K", attempts=1, fanned_out=True, due="'infinity'")
    _delivery(db, e1, "d", key="K", attempts=2, due="now() + interval '1 hour'", last_error="HTTP 500")
    e2 = _event(db, "keyed", key="K", attempts=1, fanned_out=True, due="'infinity'")
    _delivery(db, e2, "d", key="K")
    _event(db, "keyed", key="K")

    # A retry being delivered right now.
    e4 = _event(db, "retry.fly", attempts=1, fanned_out=True, due="'infinity'")
    _delivery(db, e4, "d", attempts=3, lease_owner="relay-x", due="now() + interval '20 seconds'",
              last_error="HTTP 503")
    db.query("INSERT INTO {s}.dead_letters (id, topic, payload, headers, created_at, attempts) "
             "VALUES (999, 'a', '{{}}', '{{}}', now(), 3) RETURNING id")

    s = _status(outboxd, db)
    counts = {t: {k: row[k] for k in ("pending", "waiting_on_key", "scheduled", "in_flight", "retrying", "dead")}
              for t, row in s.items()}
    assert counts == {
        "a": {"pending": 2, "waiting_on_key": 0, "scheduled": 0, "in_flight": 0, "retrying": 0, "dead": 1},
        "later": {"pending": 0, "waiting_on_key": 0, "scheduled": 1, "in_flight": 0, "retrying": 0, "dead": 0},
        "fly": {"pending": 0, "waiting_on_key": 0, "scheduled": 0, "in_flight": 1, "retrying": 0, "dead": 0},
        "keyed": {"pending": 0, "waiting_on_key": 2, "scheduled": 0, "in_flight": 0, "retrying": 1, "dead": 0},
        "retry.fly": {"pending": 0, "waiting_on_key": 0, "scheduled": 0, "in_flight": 1, "retrying": 0, "dead": 0},
    }, counts
    # Due two minutes ago (created ten minutes ago: its delay does not count).
    assert 115 <= s["a"]["oldest_pending_seconds"] < 180, s["a"]
    # Delayed by an hour: not due, so it has not waited at all.
    assert s["later"]["oldest_pending_seconds"] == 0, s["later"]
    assert s["keyed"]["last_error"] == "d: HTTP 500", s["keyed"]
    assert s["retry.fly"]["last_error"] == "d: HTTP 503", s["retry.fly"]

    r = outboxd("status", "--database-url", db.url, "--schema", db.schema)
    assert r.rc == EXIT_OK, r
    header = r.stdout.splitlines()[0].split()
    assert header == ["topic", "pending", "waiting_on_key", "scheduled", "in_flight", "retrying", "dead",
                      "oldest_pending"], header
