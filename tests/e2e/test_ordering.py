"""Per-key ordering under concurrency, and no head-of-line blocking across keys."""

from __future__ import annotations

import random
import threading
import time

from helpers import claims_only, duplicates, suite_reads_windows, wait_delivered, wait_until
from receiver import Receiver


def test_events_of_one_key_arrive_in_order_with_concurrency(db, relay):
    rng = random.Random(1234)
    lock = threading.Lock()
    inflight = {"now": 0, "max": 0}

    def jittery(req):
        with lock:
            inflight["now"] += 1
            inflight["max"] = max(inflight["max"], inflight["now"])
            pause = rng.random() * 0.02
        time.sleep(pause)
        with lock:
            inflight["now"] -= 1
        return 200, {}, b"ok"

    with Receiver(jittery) as rx:
        relay(rx, "--concurrency", "8", "--sweep-interval", "1h")
        by_key: dict = {}
        unkeyed = []
        for i in range(60):
            key = f"agg-{i % 4}" if i % 5 else None
            event_id = db.enqueue("ordered", {"i": i}, key=key)
            (by_key.setdefault(key, []) if key else unkeyed).append(event_id)
        everything = unkeyed + [i for ids in by_key.values() for i in ids]
        assert wait_delivered(rx, everything, timeout=20), \
            f"missing: {sorted(set(everything) - set(rx.delivered_ids()))}"
        assert db.wait_empty(timeout=5), db.events()

        arrivals = rx.snapshot()
        assert not duplicates(r.event_id for r in arrivals), duplicates(r.event_id for r in arrivals)
        for key, ids in by_key.items():
            seen = [r.event_id for r in arrivals if r.headers.get("outbox-ordering-key") == key]
            assert seen == ids, f"key {key}: delivered {seen}, enqueued {ids}"
        # --concurrency is in effect: more than one request was open at a time.
        assert inflight["max"] > 1, inflight


def test_a_failing_key_blocks_only_itself(db, relay):
    def responder(req):
        if req.headers.get("outbox-ordering-key") == "stuck":
            return 503, {}, b"down for this key"
        return 200, {}, b"ok"

    with Receiver(responder) as rx:
        relay(rx, "--concurrency", "4", "--sweep-interval", "1h", "--retry-base", "200ms",
              "--retry-cap", "500ms", "--max-attempts", "100")
        stuck = [db.enqueue("hol", {"i": i}, key="stuck") for i in range(3)]
        others = [db.enqueue("hol", {"i": i}, key=f"free-{i % 3}") for i in range(9)]
        others += [db.enqueue("hol", {"i": i}) for i in range(3)]
        assert wait_delivered(rx, others, timeout=10), \
            f"other keys blocked by a failing key: missing {sorted(set(others) - set(rx.delivered_ids()))}"
        # the stuck key's head was retried, its followers never sent (order kept)
        assert rx.wait_until(lambda reqs: sum(r.event_id == stuck[0] for r in reqs) >= 2, 10)
        sent = {r.event_id for r in rx.snapshot()}
        assert stuck[1] not in sent and stuck[2] not in sent, \
            "events behind a failing head of their key were sent out of order"
        remaining = {row["id"] for row in db.events()}
        assert set(stuck) <= remaining


def test_slow_delivery_does_not_block_other_keys(db, relay):
    release = threading.Event()

    def responder(req):
        if req.headers.get("outbox-ordering-key") == "slow":
            release.wait(10)
        return 200, {}, b"ok"

    with Receiver(responder) as rx:
        relay(rx, "--concurrency", "4", "--sweep-interval", "1h", "--request-timeout", "20s")
        slow = db.enqueue("hol", {"slow": True}, key="slow")
        fast = [db.enqueue("hol", {"i": i}, key=f"k{i}") for i in range(5)]
        try:
            assert wait_delivered(rx, fast, timeout=10), "an in-flight event blocked other keys"
        finally:
            release.set()
        assert wait_delivered(rx, [slow], timeout=10)
        assert db.wait_empty(timeout=5), db.events()


def test_two_relays_share_one_outbox_without_duplicates(db, relay):
    def responder(req):
        time.sleep(0.005)
        return 200, {}, b"ok"

    with Receiver(responder) as rx:
        # One receiver, a query string per relay: the path tells who sent what.
        a = relay(rx.url + "?relay=a", "--concurrency", "4", "--sweep-interval", "1h")
        b = relay(rx.url + "?relay=b", "--concurrency", "4", "--sweep-interval", "1h")
        for r in (a, b):
            assert wait_until(lambda: "relay started" in r.log(), 10), r.log()
        if suite_reads_windows():
            # Windows are shared by cursor: the relay that started first holds
            # all 64 until it learns of the second and hands half over (within
            # seconds). Events written before then would all be the first's.
            assert wait_until(lambda: db.scalar(
                "SELECT count(DISTINCT owner) FROM {s}.cursors WHERE destination = '' AND owner IS NOT NULL") == 2,
                10), db.query("SELECT slot, owner FROM {s}.cursors ORDER BY slot")
        by_key: dict = {}
        everything = []
        for i in range(80):
            key = f"k{i % 5}" if i % 2 else None
            event_id = db.enqueue("shared", {"i": i}, key=key)
            everything.append(event_id)
            if key:
                by_key.setdefault(key, []).append(event_id)
        assert wait_delivered(rx, everything, timeout=20), \
            f"missing: {sorted(set(everything) - set(rx.delivered_ids()))}"
        assert db.wait_empty(timeout=5), db.events()
        arrivals = rx.snapshot()
        assert not duplicates(r.event_id for r in arrivals), duplicates(r.event_id for r in arrivals)
        for key, ids in by_key.items():
            seen = [r.event_id for r in arrivals if r.headers.get("outbox-ordering-key") == key]
            assert seen == ids, f"key {key} out of order across relays: {seen} != {ids}"
        # Sharing, not taking turns at the whole outbox: both relays delivered.
        per_relay = {name: sum(1 for r in arrivals if r.path.endswith(f"?relay={name}")) for name in "ab"}
        assert sum(per_relay.values()) == len(arrivals), [r.path for r in arrivals]
        assert per_relay["a"] > 0 and per_relay["b"] > 0, f"one relay delivered everything: {per_relay}"
        assert a.alive() and b.alive()
        assert a.stop() == 0 and b.stop() == 0
        print("deliveries per relay:", per_relay)


@claims_only("runs are a claim's; windows sequence a key in memory (test_windows_failures.py)")
def test_a_relay_killed_in_the_middle_of_a_run_hands_its_key_over_in_order_within_seconds(db, relay):
    """A claim takes a key's consecutive events as a run (sent one after the
    other, under one key hold that names the run's last event and its relay;
    only the run's first event is leased). Relay A is killed while its run
    is half sent, with one request open: its peer B takes A's leases and
    holds over and goes on with the key in order at once, not when A's 30 s
    lease runs out."""
    cond = threading.Condition()
    gate = {"open": False, "blocked": None}
    sent: list = []
    accepted: list = []

    ids: list = []

    def responder(req):
        with cond:
            sent.append(req.event_id)
            if not gate["open"] and len(ids) > 5 and req.event_id == ids[5]:
                gate["blocked"] = req.event_id
                cond.notify_all()
                cond.wait_for(lambda: gate["open"], timeout=60)
                return 200, {}, b"ok (to a relay that is gone)"
            accepted.append(req.event_id)
            cond.notify_all()
        return 200, {}, b"ok"

    with Receiver(responder) as rx:
        ids.extend(row["id"] for row in db.query(
            "SELECT {s}.enqueue('run', jsonb_build_object('n', g), 'k') AS id FROM generate_series(1, 40) g"))
        flags = ("--concurrency", "4", "--sweep-interval", "1h", "--lease", "30s")
        a = relay(rx, *flags)
        with cond:
            assert cond.wait_for(lambda: gate["blocked"] is not None, timeout=15), sent
        # A sent the key's first five events, one after the other, and waits
        # on the sixth; the rest of its run is held and unsent.
        assert sent == ids[:6], sent
        held = db.scalar("SELECT event_id FROM {s}.key_holds WHERE ordering_key = 'k' AND lease_owner IS NOT NULL")
        assert held is not None and held > ids[5], f"the claim took no run behind the key's first event: {held}"
        b = relay(rx, *flags)
        time.sleep(0.5)
        a.kill()
        t_kill = time.monotonic()
        with cond:
            gate["open"] = True
            cond.notify_all()
        assert wait_delivered(rx, ids, timeout=20), sorted(set(ids) - set(rx.delivered_ids()))
        took = time.monotonic() - t_kill
        assert db.wait_empty(timeout=5), db.events()
        assert b.alive()
    # Every event, in order; only the one open at the kill went out twice.
    assert accepted == ids, accepted
    assert not [(x, y) for x, y in zip(sent, sent[1:]) if y < x], sent
    assert sorted(duplicates(sent)) == [ids[5]], duplicates(sent)
    # The takeover looks every second: well before the lease's 30 s.
    assert took < 10, took
