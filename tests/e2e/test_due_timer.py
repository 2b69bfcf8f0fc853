"""The next-due timer: the relay sleeps until the earliest event that is not
due yet, and fires retries on time. It must neither spin on a due time far in
the future nor let a stale claim answer push a retry back by a lease."""

from __future__ import annotations

import threading
import time

from helpers import wait_delivered, wait_until
from receiver import Receiver


def test_an_event_due_in_the_year_2400_leaves_an_idle_relay_asleep(db, relay, receiver):
    # Far beyond what steady_clock can add to now() (~292 years of nanoseconds).
    far = db.enqueue("later", {"x": 1}, available_at="2400-01-01T00:00:00Z")
    # The far event is all there is when the relay starts: its first claims
    # answer "next due in 374 years" and nothing else. (A delivery before
    # would leave a claim that answered "next due when this lease ends" and
    # hide the overflow for a lease period.)
    r = relay(receiver, "--sweep-interval", "1h")
    assert db.wait_relay_quiet(quiet=0.3, timeout=10), \
        "the relay never went idle: it keeps running statements"
    # An idle relay runs no claim until its next wake-up, only its
    # once-a-second housekeeping (the takeover check): 2-3 here when the
    # machine is quiet, 5 once under a loaded CI run. The bug was a relay
    # re-claiming in a loop (~12,000 commits in 2 s), which scores about one
    # per 10 ms sample here (~200).
    ran = db.relay_statements_during(2.0)
    assert ran < 20, f"the idle relay ran statements {ran} times in 2 s"
    now = db.enqueue("now", {"x": 2})
    assert receiver.wait_for(1, timeout=10), receiver.requests
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



def test_a_retry_that_falls_due_while_a_claim_runs_its_delivery_statement_is_claimed_by_that_claim(db, relay, tmp_path):
    """A retry that falls due while a claim runs is claimed by that claim or
    timed by its answer, never left for the sweep (an hour away here; a's
    held request, 15 s, is the only other wake-up). Until 1dac15e a claim
    after one that saw deliveries due ran deliveries first, then events: a
    retry that fell due after the delivery statement's now() and before the
    event statement's was not taken by the first (not due yet) nor counted by
    the second's "when is the next one" (only what is not due yet). Now
    deliveries go first only while a backlog drains, and are claimed again
    after the events then (tests/unit/claim_sequence_test.cpp).
    Forced: a's only connection is held, so a delivery to it stays due and
    the relay carries "deliveries due" from claim to claim; two retries fall
    due 0.26 to 0.46 s apart (b's backoff 300 ms, c's 700 ms, less up to 20 %
    jitter; b and c more connections than a claim wants, so one delivery
    statement serves both); the next-due timer wakes a claim for the first,
    and that claim's delivery statement (the first UPDATE of `deliveries`
    after the test arms it) sleeps 1 s, across the second's due time. On the
    relay before 1dac15e the second retry came after 10 s (5 runs of 5)."""
    db.query("CREATE TABLE {s}.sleep_once (armed boolean NOT NULL)")
    db.query("INSERT INTO {s}.sleep_once VALUES (false)")
    db.query("""CREATE FUNCTION {s}.sleep_once() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  IF EXISTS (SELECT 1 FROM {s}.sleep_once WHERE armed) THEN
                    UPDATE {s}.sleep_once SET armed = false;
                    PERFORM pg_sleep(1);
                  END IF;
                  RETURN NULL;
                END $$""")
    db.query("CREATE TRIGGER sleep_once BEFORE UPDATE ON {s}.deliveries "
             "FOR EACH STATEMENT EXECUTE FUNCTION {s}.sleep_once()")
    release = threading.Event()
    lock = threading.Lock()
    attempts: dict = {}

    def held(req):
        if req.headers.get("outbox-topic") == "hold.first":
            release.wait(15)
        return 200, {}, b"ok"

    def fails_once(req):
        with lock:
            attempts.setdefault(req.event_id, []).append(time.monotonic())
            if len(attempts[req.event_id]) == 1:
                return 500, {}, b"not yet"
        return 200, {}, b"ok"

    with Receiver(held) as a, Receiver(fails_once) as b, Receiver(fails_once) as c:
        config = (f'[destinations.a]\nurl = "{a.url}"\nmax_concurrency = 1\nrequest_timeout = "20s"\n\n'
                  f'[destinations.b]\nurl = "{b.url}"\nmax_concurrency = 1024\n'
                  'retry = { base = "300ms", cap = "300ms" }\n\n'
                  f'[destinations.c]\nurl = "{c.url}"\nmax_concurrency = 1024\n'
                  'retry = { base = "700ms", cap = "700ms" }\n\n'
                  '[[routes]]\ntopics = ["hold.>"]\ndestinations = ["a"]\n\n'
                  '[[routes]]\ntopics = ["soon.>"]\ndestinations = ["b"]\n\n'
                  '[[routes]]\ntopics = ["later.>"]\ndestinations = ["c"]\n')
        path = tmp_path / "outboxd.toml"
        path.write_text(config)
        r = relay(None, "--config", str(path), "--sweep-interval", "1h", "--lease", "30s",
                  "--circuit-failures", "0")

        def delivery_rows(event_id) -> int:
            return db.scalar("SELECT count(*) FROM {s}.deliveries WHERE event_id = %s", (event_id,))

        try:
            first = db.enqueue("hold.first", {"n": 1})
            assert a.wait_until(lambda reqs: any(q.event_id == first for q in reqs), 10), r.log()
            # a has no free connection: this one gets a delivery row there, due now.
            second = db.enqueue("hold.second", {"n": 2})
            assert wait_until(lambda: delivery_rows(second) == 1, 10), r.log()
            soon = db.enqueue("soon.retry", {"n": 3})
            later = db.enqueue("later.retry", {"n": 4})
            assert wait_until(lambda: delivery_rows(soon) == 1 and delivery_rows(later) == 1, 5), r.log()
            db.query("UPDATE {s}.sleep_once SET armed = true")
            left = db.scalar("SELECT extract(epoch FROM min(available_at) - now())::float8 FROM {s}.deliveries "
                             "WHERE event_id IN (%s, %s)", (soon, later))
            assert left > 0, f"the first retry fell due {-left:.3f} s before the test armed the sleep"
            assert c.wait_until(lambda reqs: sum(q.event_id == later for q in reqs) >= 2, 10), \
                (db.deliveries(), r.log())
            assert not db.scalar("SELECT bool_or(armed) FROM {s}.sleep_once"), "no claim slept"
            with lock:
                gap = attempts[later][1] - attempts[later][0]
            assert gap < 3.0, f"the retry due 0.7 s after its failure came {gap:.1f} s after it"
        finally:
            release.set()
        assert wait_delivered(a, [first, second], 15), r.log()
        assert wait_delivered(b, [soon], 5), r.log()
        assert db.wait_empty(timeout=10), (db.events(), db.deliveries())
