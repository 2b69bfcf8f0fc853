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
    return {row["topic"]: row for row in rows if "topic" in row}


def _event(db, topic, key=None, due="now()", attempts=0, lease_owner=None, fanned_out=False,
           created="now()", last_error=None, leased_until="NULL") -> int:
    return db.scalar(
        "INSERT INTO {s}.events (topic, ordering_key, payload, available_at, attempts, lease_owner, fanned_out, "
        f"created_at, last_error, leased_until) VALUES (%s, %s, '{{{{}}}}', {due}, %s, %s, %s, {created}, %s, "
        f"{leased_until}) RETURNING id",
        (topic, key, attempts, lease_owner, fanned_out, last_error))


def _delivery(db, event_id, destination, key=None, due="now()", attempts=0, lease_owner=None, last_error=None):
    db.query("INSERT INTO {s}.deliveries (event_id, destination, ordering_key, available_at, attempts, "
             f"lease_owner, last_error) VALUES (%s, %s, %s, {due}, %s, %s, %s) RETURNING event_id",
             (event_id, destination, key, attempts, lease_owner, last_error))


def test_each_status_count_means_one_state(outboxd, db):
    _event(db, "a", created="now() - interval '10 minutes'", due="now() - interval '2 minutes'")
    _event(db, "a")
    _event(db, "later", due="now() + interval '1 hour'", created="now() - interval '3 hours'")
    _event(db, "fly", attempts=1, lease_owner="relay-x", leased_until="now() + interval '30 seconds'")

    # Key K: e1 failed at d and retries in an hour; e2 queued behind it at d
    # (fanned out for its key, never attempted); e3 not claimed yet.
    e1 = _event(db, "keyed", key="K", attempts=1, fanned_out=True, due="'infinity'")
    _delivery(db, e1, "d", key="K", attempts=2, due="now() + interval '1 hour'", last_error="HTTP 500")
    e2 = _event(db, "keyed", key="K", attempts=1, fanned_out=True, due="'infinity'")
    _delivery(db, e2, "d", key="K")
    _event(db, "keyed", key="K")

    # Key R sent as a run: its first event leased, the next two under the
    # key's hold alone (no lease of their own), the fourth behind the run.
    _event(db, "run", key="R", attempts=1, lease_owner="relay-x", leased_until="now() + interval '30 seconds'")
    _event(db, "run", key="R")
    last = _event(db, "run", key="R")
    _event(db, "run", key="R")
    db.query("INSERT INTO {s}.key_holds (ordering_key, destination, event_id, until, lease_owner) "
             "VALUES ('R', '', %s, now() + interval '30 seconds', 'relay-x') RETURNING 1", (last,))

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
        "run": {"pending": 0, "waiting_on_key": 1, "scheduled": 0, "in_flight": 3, "retrying": 0, "dead": 0},
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


def test_status_per_destination_splits_work_by_route_and_shows_the_circuits_live_relays_report(
        outboxd, db, relay, tmp_path):
    from helpers import wait_until
    from receiver import Receiver

    with Receiver(lambda req: (500, {}, b"down")) as down, Receiver() as up:
        config = tmp_path / "outboxd.toml"
        config.write_text(
            '[defaults.retry]\nbase = "1h"\ncap = "1h"\n\n'
            f'[destinations.down]\nurl = "{down.url}"\ncircuit = {{ failures = 2 }}\n\n'
            f'[destinations.up]\nurl = "{up.url}"\n\n'
            '[[routes]]\ntopics = ["orders.>"]\ndestinations = ["down", "up"]\n')
        base = ["--database-url", db.url, "--schema", db.schema, "--config", str(config)]
        # Before any relay: events are owed to both destinations by their route.
        for n in range(3):
            db.enqueue("orders.created", {"n": n})
        db.enqueue("billing.paid", {"n": 0})  # no route
        r = outboxd("status", "--json", *base)
        assert r.rc == EXIT_OK, r
        rows = {row["destination"]: row for row in map(json.loads, r.stdout.splitlines()) if "destination" in row}
        assert rows["down"]["pending"] == 3 and rows["up"]["pending"] == 3, rows
        assert rows["(no route)"]["pending"] == 1, rows
        assert rows["down"]["circuit"] == "-", rows  # no live relay reports

        relay(None, "--config", str(config))
        assert up.wait_for(3, timeout=10)

        def by_destination():
            out = outboxd("status", "--json", *base)
            assert out.rc == EXIT_OK, out
            return {row["destination"]: row for row in map(json.loads, out.stdout.splitlines())
                    if "destination" in row}

        # The circuit is published when it opens, the outcomes a moment later.
        rows = wait_until(lambda: (lambda v: v if v["down"]["circuit"] == "open" and v["down"]["in_flight"] == 0
                                   else None)(by_destination()), 10)
        assert rows, by_destination()
        assert rows["up"]["circuit"] == "closed", rows
        assert rows["down"]["retrying"] + rows["down"]["pending"] == 3, rows
        assert rows["up"]["pending"] == 0 and rows["up"]["retrying"] == 0, rows
        text = outboxd("status", *base)
        assert text.rc == EXIT_OK
        line = next(l for l in text.stdout.splitlines() if l.startswith("down "))
        assert line.split()[-1] == "open", text.stdout


def test_status_watch_redraws_in_place_until_ctrl_c(outboxd_bin, db):
    """Under a pseudo-terminal: the view is redrawn from the top at every
    interval and follows the outbox; SIGINT ends it with exit 0."""
    import os
    import pty
    import select
    import signal
    import subprocess
    import time

    from conftest import clean_env

    leader, follower = pty.openpty()
    p = subprocess.Popen([outboxd_bin, "status", "--watch", "--interval", "200ms", "--database-url", db.url,
                          "--schema", db.schema], stdin=follower, stdout=follower, stderr=follower,
                         env=clean_env(), start_new_session=True)
    os.close(follower)
    seen = b""

    def read_for(seconds):
        nonlocal seen
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.05)
            if ready:
                try:
                    seen += os.read(leader, 65536)
                except OSError:
                    return

    try:
        read_for(0.7)
        first = seen.count(b"\x1b[H")
        assert first >= 2, seen
        assert b"orders.watched" not in seen
        db.enqueue("orders.watched", {"n": 1})
        read_for(0.7)
        assert seen.count(b"\x1b[H") >= first + 2, seen
        last = seen.rsplit(b"\x1b[H", 1)[1].decode()
        row = next(l for l in last.splitlines() if l.startswith("orders.watched"))
        assert row.split()[1] == "1", last
        p.send_signal(signal.SIGINT)
        assert p.wait(5) == EXIT_OK
    finally:
        if p.poll() is None:
            p.kill()
        os.close(leader)
