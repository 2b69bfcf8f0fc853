"""The next-due timer: the relay sleeps until the earliest event that is not
due yet, and fires retries on time. It must neither spin on a due time far in
the future nor let a stale claim answer push a retry back by a lease."""

from __future__ import annotations

import threading
import time

from receiver import Receiver


def _commits(db) -> int:
    return db.scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")


def test_an_event_due_in_the_year_2400_leaves_an_idle_relay_asleep(db, relay, receiver):
    # Far beyond what steady_clock can add to now() (~292 years of nanoseconds).
    far = db.enqueue("later", {"x": 1}, available_at="2400-01-01T00:00:00Z")
    r = relay(receiver, "--sweep-interval", "1h")
    now = db.enqueue("now", {"x": 2})
    assert receiver.wait_for(1, timeout=10), receiver.requests
    assert db.wait_relay_quiet(quiet=0.3, timeout=10), \
        "the relay never went idle: it keeps running statements"

    before = _commits(db)
    time.sleep(2)  # creates the situation: an idle relay for two seconds
    spent = _commits(db) - before
    # An idle relay commits nothing; our own two reads of the counter and
    # PostgreSQL's background work leave a handful. The bug: ~12,000.
    assert spent < 50, f"{spent} commits in 2 s by an idle relay"
    assert r.alive()
    assert [rq.event_id for rq in receiver.snapshot()] == [now]
    assert db.event(far) is not None, "the far-future event must stay in the outbox"


def test_a_retry_fires_on_time_although_a_claim_that_began_before_it_was_recorded_ends_after(db, relay):
    """A claim whose snapshot predates the retry's outcome write still sees
    the delivery leased, and answers "next due at the lease's end". When that
    answer comes back after the retry was recorded, it must not replace the
    retry's timer. Forced here: the second failure's outcome is written
    (rescheduling a delivery row sends no NOTIFY) while a claim sleeps in a
    trigger of the test's own (a claim stalled in PostgreSQL)."""
    db.query("""CREATE FUNCTION {s}.slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  IF NEW.topic = 'slow.claim' AND NEW.lease_owner IS NOT NULL AND OLD.lease_owner IS NULL THEN
                    PERFORM pg_sleep(1.5);
                  END IF;
                  RETURN NEW;
                END $$""")
    db.query("CREATE TRIGGER slow_claim BEFORE UPDATE ON {s}.events "
             "FOR EACH ROW EXECUTE FUNCTION {s}.slow_claim()")
    producer = db.connect()
    lock = threading.Lock()
    arrivals: list[float] = []

    def responder(req):
        if req.headers.get("outbox-topic") != "retry.twice":
            return 200, {}, b"ok"
        with lock:
            arrivals.append(time.monotonic())
            n = len(arrivals)
        if n == 2:
            # A claim starts now and sleeps 1.5 s in the trigger, its snapshot
            # taken; this failure's outcome is written while it sleeps.
            db.enqueue("slow.claim", {"x": 0}, conn=producer)
            time.sleep(0.3)
        return (500, {}, b"not yet") if n <= 2 else (200, {}, b"ok")

    rx = Receiver(responder).start()
    try:
        # Retries after 2.5 s, lease 20 s, no sweep: on time, attempt 3 comes
        # ~2.5 s after attempt 2; pushed back to the lease's end, ~20 s.
        relay(rx, "--retry-base", "2500ms", "--retry-cap", "2500ms", "--lease", "20s",
              "--request-timeout", "2s", "--connect-timeout", "1s", "--sweep-interval", "1h")
        event_id = db.enqueue("retry.twice", {"x": 1})
        assert rx.wait_until(lambda reqs: sum(r.event_id == event_id and r.status == 200 for r in reqs) >= 1, 30), \
            f"not delivered within 30 s: {[(r.event_id, r.status) for r in rx.snapshot()]}"
        with lock:
            gap = arrivals[2] - arrivals[1]
        assert gap < 6, f"attempt 3 came {gap:.1f} s after attempt 2 (backoff 2.5 s): it waited for the lease"
        assert db.wait_empty(timeout=5), db.events()
    finally:
        rx.stop()
