"""Delivery: committed events arrive (once), uncommitted ones never do, and the
paths that do not depend on NOTIFY (drain at startup, the sweep) work."""

from __future__ import annotations

import json
import re
import threading
import time

from helpers import claims_only, duplicates, wait_delivered, wait_until
from receiver import Receiver


def warm_up(db, rx, timeout: float = 10.0) -> int:
    """Enqueue a probe and wait until it is delivered: afterwards the relay has
    connected, listens and processes work. Returns the probe's id."""
    probe = db.enqueue("e2e.probe", {"probe": True})
    assert wait_delivered(rx, [probe], timeout), "relay never delivered the warm-up probe"
    return probe


def test_committed_event_is_delivered_exactly_once_with_headers(db, receiver, relay):
    # The sweep is an hour away: delivery must come from the startup drain or NOTIFY.
    relay(receiver, "--sweep-interval", "1h")
    payload = {"order": 7, "text": "grüße \u2603", "nested": {"a": [1, 2, None]}, "ok": True}
    t_before = time.time()
    event_id = db.enqueue("orders.created", payload, key="order-7")

    assert receiver.wait_for(1, timeout=10), "event was not delivered within 10s"
    req = receiver.requests[0]
    assert req.event_id == event_id, req.headers
    assert req.status == 200
    assert req.method == "POST" and req.path == "/hook"
    assert json.loads(req.body) == payload, req.body
    assert req.headers.get("webhook-id") == db.message_id(event_id)
    assert req.headers.get("outbox-topic") == "orders.created"
    assert req.headers.get("outbox-ordering-key") == "order-7"
    assert req.headers.get("outbox-attempt") == "1"
    ts = int(req.headers["webhook-timestamp"])  # Standard Webhooks: seconds since the epoch
    assert t_before - 60 <= ts <= time.time() + 60, ts

    # The delivered row leaves the hot table (and is not dead-lettered).
    assert db.wait_empty(timeout=5), f"delivered row still in events: {db.events()}"
    assert db.count_dead_letters() == 0

    # Barrier: a later event (without key) goes through as well, so anything
    # the relay was going to do with the first one has happened by now.
    later = db.enqueue("orders.updated", {"order": 8})
    assert wait_delivered(receiver, [later], timeout=10)
    later_req = [r for r in receiver.requests if r.event_id == later][0]
    assert "outbox-ordering-key" not in later_req.headers, later_req.headers
    assert db.wait_empty(timeout=5)

    ids = receiver.ids()
    assert ids.count(event_id) == 1, f"event {event_id} delivered {ids.count(event_id)} times"
    assert ids.count(later) == 1
    assert len(ids) == 2, ids


def test_notification_wakes_the_relay_without_waiting_for_the_sweep(db, receiver, relay):
    relay(receiver, "--sweep-interval", "1h")
    warm_up(db, receiver)
    latencies = []
    for i in range(5):
        t0 = time.monotonic()
        event_id = db.enqueue("wake.test", {"i": i})
        assert wait_delivered(receiver, [event_id], timeout=5), \
            f"event {i} not delivered within 5s although NOTIFY should wake the relay"
        latencies.append(next(r.t_monotonic for r in receiver.snapshot() if r.event_id == event_id) - t0)
    # Generous bound (a debug build on a loaded machine); a relay that only
    # polls every second or so would still fail it on average.
    assert sorted(latencies)[len(latencies) // 2] < 0.5, latencies


def test_event_committed_before_the_relay_started_is_delivered_at_startup(db, receiver, relay):
    early = [db.enqueue("early", {"i": i}) for i in range(3)]
    # No notification will ever arrive for these and the sweep is an hour
    # away: only the drain after connect can deliver them.
    relay(receiver, "--sweep-interval", "1h")
    assert wait_delivered(receiver, early, timeout=10), receiver.ids()
    assert db.wait_empty(timeout=5), db.events()
    assert not duplicates(receiver.ids())


def test_rolled_back_event_is_never_delivered(db, receiver, relay):
    relay(receiver, "--sweep-interval", "1s")
    warm_up(db, receiver)

    # 1. a whole transaction rolled back
    rolled_back = db.enqueue("rb", {"marker": "rolled-back-1"}, commit=False)
    db.conn.rollback()
    # 2. a rolled-back savepoint inside a committed transaction
    with db.conn.cursor() as cur:
        cur.execute("SAVEPOINT sp")
    in_savepoint = db.enqueue("rb", {"marker": "rolled-back-2"}, commit=False)
    with db.conn.cursor() as cur:
        cur.execute("ROLLBACK TO SAVEPOINT sp")
    kept = db.enqueue("rb", {"marker": "kept"}, commit=True)
    # 3. a transaction still open (uncommitted) while later work is processed
    other = db.connect()
    pending = db.enqueue("rb", {"marker": "uncommitted"}, conn=other, commit=False)

    # Later committed work: once the relay has demonstrably processed it,
    # nothing from the rolled-back or pending work may have been sent.
    later = db.enqueue("rb", {"marker": "later"})
    assert wait_delivered(receiver, [kept, later], timeout=10), receiver.ids()
    assert db.wait_empty(timeout=5), db.events()
    barrier = db.enqueue("rb", {"marker": "barrier"})
    assert wait_delivered(receiver, [barrier], timeout=10)

    markers = [json.loads(r.body).get("marker") for r in receiver.snapshot()]
    ids = receiver.ids()
    assert rolled_back not in ids and "rolled-back-1" not in markers, markers
    assert in_savepoint not in ids and "rolled-back-2" not in markers, markers
    assert pending not in ids and "uncommitted" not in markers, markers
    assert ids.count(kept) == 1 and ids.count(later) == 1
    other.rollback()
    assert db.wait_empty(timeout=5), db.events()


def test_event_without_notification_is_delivered_by_the_sweep(db, receiver, relay):
    relay(receiver, "--sweep-interval", "1s")
    warm_up(db, receiver)
    # ...and is asleep again: the claim that follows the probe's completion
    # must not be what picks up the silent event.
    assert db.wait_relay_quiet(), "relay never went idle"

    # Insert in a session where ordinary triggers (events_notify) do not fire,
    # so no NOTIFY is ever sent for this row.
    conn = db.connect()
    with conn.cursor() as cur:
        cur.execute("SET session_replication_role = replica")
    t0 = time.monotonic()
    silent = db.enqueue("silent", {"how": "no notify"}, conn=conn)
    assert wait_delivered(receiver, [silent], timeout=6), \
        "an event without a notification was not delivered by the 1s sweep"
    latency = next(r.t_monotonic for r in receiver.snapshot() if r.event_id == silent) - t0
    assert db.wait_empty(timeout=5), db.events()
    assert receiver.ids().count(silent) == 1
    print(f"sweep delivered the silent event after {latency:.2f}s")


def test_event_inserted_with_the_trigger_disabled_is_delivered_by_the_sweep(db, receiver, relay):
    relay(receiver, "--sweep-interval", "1s")
    warm_up(db, receiver)
    db.query("ALTER TABLE {s}.events DISABLE TRIGGER events_notify")
    assert db.wait_relay_quiet(), "relay never went idle"
    silent = [db.enqueue("silent", {"i": i}) for i in range(3)]
    assert wait_delivered(receiver, silent, timeout=6), receiver.ids()
    assert db.wait_empty(timeout=5), db.events()
    assert not duplicates(receiver.ids())


def test_idempotency_key_makes_a_repeated_enqueue_a_no_op(db, outboxd, receiver, relay):
    first = db.enqueue("orders.created", {"n": 1}, idempotency_key="req-42")
    again = db.enqueue("orders.created", {"n": 1, "retried": True}, idempotency_key="req-42")
    assert again == first
    other_topic = db.enqueue("orders.updated", {"n": 1}, idempotency_key="req-42")
    assert other_topic != first  # keys are per topic
    r = outboxd("--database-url", db.url, "--schema", db.schema, "enqueue",
                "--topic", "orders.created", "--payload", '{"n": 2}', "--idempotency-key", "req-42")
    assert r.rc == 0, r
    assert int(r.stdout.strip().splitlines()[-1]) == first
    assert db.count_events() == 2

    relay(receiver, "--sweep-interval", "1h")
    assert wait_delivered(receiver, [first, other_topic], timeout=10)
    assert db.wait_empty(timeout=5)
    # still deduplicated after the first event was delivered and left the table
    assert db.enqueue("orders.created", {"n": 3}, idempotency_key="req-42") == first
    barrier = db.enqueue("barrier", {})
    assert wait_delivered(receiver, [barrier], timeout=10)
    assert receiver.ids().count(first) == 1
    assert json.loads([r for r in receiver.snapshot() if r.event_id == first][0].body) == {"n": 1}


def test_delayed_event_is_delivered_when_due_and_not_before(db, outboxd, receiver, relay):
    relay(receiver, "--sweep-interval", "1h")
    warm_up(db, receiver)
    t0 = time.monotonic()
    r = outboxd("--database-url", db.url, "--schema", db.schema, "enqueue",
                "--topic", "later", "--payload", '{"delayed": true}', "--delay", "1500ms")
    assert r.rc == 0, r
    event_id = int(r.stdout.strip().splitlines()[-1])
    # The relay's timer for the next due row fires it (the sweep is an hour away).
    assert wait_delivered(receiver, [event_id], timeout=6), "delayed event never delivered"
    arrived = next(q.t_monotonic for q in receiver.snapshot() if q.event_id == event_id) - t0
    assert arrived >= 1.4, f"delivered {arrived:.2f}s after enqueue, before its 1.5s delay"
    assert arrived < 3.5, f"delivered {arrived:.2f}s after enqueue; the due timer is late"
    assert db.wait_empty(timeout=5)


def test_the_relay_forgets_idempotency_keys_after_the_retention(db, receiver, relay):
    relay(receiver, "--idempotency-retention", "1h", "--sweep-interval", "200ms")
    first = db.enqueue("orders.created", {"n": 1}, idempotency_key="order-1")
    kept = db.enqueue("orders.created", {"n": 2}, idempotency_key="order-2")
    assert wait_delivered(receiver, [first, kept], 10)
    assert db.enqueue("orders.created", {"n": 1}, idempotency_key="order-1") == first
    # Age one key past the retention: the next sweep forgets it, not the other.
    db.query("UPDATE {s}.idempotency_keys SET created_at = now() - interval '2 hours' "
             "WHERE idempotency_key = 'order-1' RETURNING 1")
    assert wait_until(lambda: db.scalar("SELECT count(*) FROM {s}.idempotency_keys") == 1, 5)
    assert db.enqueue("orders.created", {"n": 1}, idempotency_key="order-1") != first
    assert db.enqueue("orders.created", {"n": 2}, idempotency_key="order-2") == kept


def test_the_relay_purges_dead_letters_after_the_retention(db, receiver, relay):
    relay(receiver, "--dead-letter-retention", "1h", "--sweep-interval", "200ms")
    db.query("INSERT INTO {s}.dead_letters (id, topic, payload, headers, created_at, attempts, died_at) "
             "VALUES (1, 't', '{{}}', '{{}}', now(), 1, now() - interval '2 hours'), "
             "(2, 't', '{{}}', '{{}}', now(), 1, now() - interval '30 minutes')")
    assert wait_until(lambda: db.scalar("SELECT count(*) FROM {s}.dead_letters") == 1, 5)
    assert db.scalar("SELECT id FROM {s}.dead_letters") == 2


def test_an_event_committed_late_during_a_backlog_drain_is_not_left_behind(db, receiver, relay):
    # A producer's transaction starts (its events are due from its start)
    # and commits while a backlog of later events drains. The drain claims
    # behind a watermark; the late event must still go out when the drain
    # ends, not at the sweep an hour later.
    import psycopg2
    late_conn = psycopg2.connect(db.url)
    try:
        late = db.enqueue("late", {"n": 0}, conn=late_conn, commit=False)
        with db.conn.cursor() as cur:
            cur.execute(f'INSERT INTO "{db.schema}".events (topic, payload) '
                        "SELECT 'backlog', '{}' FROM generate_series(1, 600)")
        db.conn.commit()
        relay(receiver, "--concurrency", "4", "--sweep-interval", "1h")
        assert receiver.wait_for(100, timeout=30)
        late_conn.commit()
        # The lease (30 s) or the sweep would be far later than this.
        assert db.wait_empty(timeout=10), db.count_events()
        assert late in {r.event_id for r in receiver.snapshot()}
        assert not duplicates([r.event_id for r in receiver.snapshot()])
    finally:
        late_conn.close()


@claims_only("window reads are not leases: a relay reads ahead up to its queue, whatever its connections")
def test_a_backlog_is_claimed_ahead_of_the_connections_when_the_destination_keeps_up(db, receiver, relay):
    # Claiming ahead: with a destination that answers at once, the relay
    # claims many more events at a time than it has connections (the debug
    # log counts every claim), and sends each once. (That it never has more
    # requests open than --concurrency is test_guarantees' kill -9 test.)
    with db.conn.cursor() as cur:
        cur.execute(f'INSERT INTO "{db.schema}".events (topic, payload) '
                    "SELECT 'backlog', jsonb_build_object('n', g) FROM generate_series(1, 3000) AS g")
    db.conn.commit()
    r = relay(receiver, "--concurrency", "4", "--sweep-interval", "1h")
    assert db.wait_empty(timeout=60), db.count_events()
    got = [x.event_id for x in receiver.snapshot()]
    assert len(got) == 3000 and not duplicates(got)
    assert {x.headers.get("outbox-attempt") for x in receiver.snapshot()} == {"1"}
    claims = [int(n) for n in re.findall(r'msg=claimed count=(\d+)', r.log())]
    assert max(claims) > 4, f"never claimed ahead: {sorted(set(claims))}"


def test_a_slow_destination_is_not_claimed_ahead_past_what_the_lease_allows(db, relay):
    # 10 requests a second over 2 connections, and a lease that leaves
    # 500 ms to wait before an attempt must start (4 s - 500 ms connect -
    # 3 s request; the request timeout is 15 times what the receiver takes,
    # so a busy machine does not turn a slow answer into a retry). Had the
    # relay claimed ahead as for a fast destination,
    # events would wait seconds in the relay, outlive their leases and be
    # claimed (and attempted) twice. Each must go out once, at attempt 1.
    def slow(req):
        time.sleep(0.2)
        return 200, {}, b"ok"

    with Receiver(slow) as rx:
        ids = [db.enqueue("slow", {"n": n}) for n in range(40)]
        r = relay(rx, "--concurrency", "2", "--lease", "4s", "--connect-timeout", "500ms",
                  "--request-timeout", "3s", "--sweep-interval", "1h")
        assert wait_delivered(rx, ids, timeout=30)
        assert db.wait_empty(timeout=10), db.events()
        got = rx.snapshot()
    assert not duplicates([x.event_id for x in got]), sorted(x.event_id for x in got)
    assert {x.headers.get("outbox-attempt") for x in got} == {"1"}
    assert "waited too long" not in r.log()


def test_requests_hanging_to_their_timeout_give_up_their_slots_and_claimed_ahead_events_go_out(db, relay, tmp_path):
    """A fast backlog makes the relay claim ahead; then the destination hangs
    two requests to their 3 s timeout, with only two delivery slots. Before,
    the events claimed ahead waited behind them until their lease could no
    longer fit an attempt (and were left for their lease). Now a request not
    answered within 250 ms gives up its delivery slot: the backlog goes on
    meanwhile, nothing waits too long, and only the two hung events are sent
    twice. (The "waited too long" path itself, now hard to reach end to end,
    is checked by the engine's own test "a claimed event whose lease would end
    before its attempt is not sent".)"""
    release = threading.Event()
    lock = threading.Lock()
    seen = {"n": 0}
    fast_first = 300
    hung_at: dict = {}

    def responder(req):
        with lock:
            seen["n"] += 1
            n = seen["n"]
        if fast_first < n <= fast_first + 2:
            hung_at[req.event_id] = time.monotonic()
            release.wait(4)  # hangs past the relay's 3 s request timeout
        return 200, {}, b"ok"

    with Receiver(responder) as rx:
        with db.conn.cursor() as cur:
            cur.execute(f'INSERT INTO "{db.schema}".events (topic, payload) '
                        "SELECT 'backlog', jsonb_build_object('n', g) FROM generate_series(1, 600) AS g")
        db.conn.commit()
        ids = [row["id"] for row in db.query("SELECT id FROM {s}.events ORDER BY id")]
        try:
            # Two delivery slots, more connections than that to the destination.
            config = tmp_path / "outboxd.toml"
            config.write_text(f'[destinations.rx]\nurl = "{rx.url}"\nmax_concurrency = 8\n\n'
                              '[[routes]]\ntopics = [">"]\ndestinations = ["rx"]\n')
            r = relay(None, "--config", str(config), "--concurrency", "2", "--lease", "4s",
                      "--connect-timeout", "500ms", "--request-timeout", "3s", "--retry-base", "100ms",
                      "--sweep-interval", "1h")
            assert wait_until(lambda: len(hung_at) == 2, 15), f"{seen['n']} requests, none hung"
            # While both still hang, the rest of the backlog goes out through
            # the slots they gave up.
            rest = set(ids) - set(hung_at)
            assert rx.wait_until(lambda reqs: rest <= {q.event_id for q in reqs if q.status == 200}, 3), \
                f"the backlog stalled behind the two hung requests: {seen}\n{r.log()[-4000:]}"
            assert not release.is_set() and len(hung_at) == 2
        finally:
            release.set()
        assert wait_delivered(rx, ids, timeout=30), f"missing {len(set(ids) - set(rx.delivered_ids()))}"
        assert db.wait_empty(timeout=10), db.count_events()
        got = rx.snapshot()
    assert "waited too long" not in r.log(), r.log()[-3000:]
    twice = set(duplicates(q.event_id for q in got))
    assert twice <= set(hung_at), (twice, hung_at)


def test_many_events_committed_late_during_a_drain_all_go_out_when_it_ends(db, relay):
    # As above, with more late events than any claim takes (1,024): the claim
    # that looks behind the watermark when the drain ends comes back full,
    # and the drain must go on from there. It once stopped: the rest waited
    # for the next wake-up (here the lease's end, 30 s).
    def slowish(req):
        time.sleep(0.01)
        return 200, {}, b"ok"

    import psycopg2
    late_conn = psycopg2.connect(db.url)
    try:
        with late_conn.cursor() as cur:
            cur.execute(f'INSERT INTO "{db.schema}".events (topic, payload) '
                        "SELECT 'late', '{}' FROM generate_series(1, 1500)")
        with db.conn.cursor() as cur:
            cur.execute(f'INSERT INTO "{db.schema}".events (topic, payload) '
                        "SELECT 'backlog', '{}' FROM generate_series(1, 600)")
        db.conn.commit()
        with Receiver(slowish) as rx:
            relay(rx, "--concurrency", "4", "--sweep-interval", "1h", "--lease", "30s")
            assert rx.wait_for(100, timeout=30)
            late_conn.commit()  # mid-drain: 500 backlog events still to go
            assert db.wait_empty(timeout=20), db.count_events()
            got = [r.event_id for r in rx.snapshot()]
            assert len(got) == 2100 and not duplicates(got)
    finally:
        late_conn.close()
