"""Routing to several destinations from a TOML configuration: wildcards,
independent per-destination delivery (a failing or stalled destination
neither blocks nor duplicates the others), per-key order per destination,
events that match no route, per-destination dead letters and settings."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import threading
import time

from helpers import claims_only, duplicates, wait_delivered, wait_until
from receiver import Receiver


def write_config(tmp_path, text: str, name: str = "outboxd.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def two_destinations(a: Receiver, b: Receiver, extra_a: str = "", extra_b: str = "",
                     routes: str = '[[routes]]\ntopics = ["orders.>"]\ndestinations = ["a", "b"]\n') -> str:
    return (f'[defaults.retry]\nbase = "100ms"\ncap = "200ms"\n\n'
            f'[destinations.a]\nurl = "{a.url}"\n{extra_a}\n'
            f'[destinations.b]\nurl = "{b.url}"\n{extra_b}\n' + routes)


def ok(rx: Receiver) -> list:
    return [r.event_id for r in rx.snapshot() if 200 <= r.status < 300]


def test_an_event_routed_to_two_destinations_reaches_each_once(db, relay, tmp_path):
    with Receiver() as a, Receiver() as b:
        relay(None, "--config", write_config(tmp_path, two_destinations(a, b)))
        ids = [db.enqueue("orders.created", {"n": n}) for n in range(5)]
        assert wait_delivered(a, ids, 10) and wait_delivered(b, ids, 10)
        assert db.wait_empty(timeout=5), db.events()
        assert sorted(ok(a)) == ids and sorted(ok(b)) == ids
        assert db.deliveries() == []  # the fast path wrote no delivery rows


def test_wildcards_pick_destinations_by_topic(db, relay, tmp_path):
    routes = ('[[routes]]\ntopics = ["orders.*"]\ndestinations = ["a"]\n\n'
              '[[routes]]\ntopics = ["orders.>", "billing.invoice"]\ndestinations = ["b"]\n')
    with Receiver() as a, Receiver() as b:
        relay(None, "--config", write_config(tmp_path, two_destinations(a, b, routes=routes)))
        one_level = db.enqueue("orders.created", {})
        two_levels = db.enqueue("orders.eu.created", {})
        exact = db.enqueue("billing.invoice", {})
        assert wait_delivered(b, [one_level, two_levels, exact], 10)
        assert wait_delivered(a, [one_level], 10)
        assert db.wait_empty(timeout=5), db.events()
        assert sorted(ok(a)) == [one_level]
        assert sorted(ok(b)) == [one_level, two_levels, exact]


def test_a_failing_destination_neither_blocks_nor_duplicates_the_other(db, relay, tmp_path):
    a_broken = threading.Event()
    a_broken.set()

    def flaky(req):
        return (503, {}, b"down") if a_broken.is_set() else (200, {}, b"ok")

    with Receiver(flaky) as a, Receiver() as b:
        relay(None, "--config", write_config(tmp_path, two_destinations(a, b)), "--concurrency", "8")
        ids = [db.enqueue("orders.updated", {"n": n}, key=f"order-{n % 3}") for n in range(30)]
        # b gets everything, in order per key, while a keeps failing.
        assert wait_delivered(b, ids, 15), f"b got {len(ok(b))} of 30 while a was down"
        assert not duplicates(ok(b)), duplicates(ok(b))
        assert not ok(a)
        assert db.count_events() == 30, "events left the outbox before a had them"

        a_broken.clear()
        assert wait_delivered(a, ids, 20), f"a got {len(set(ok(a)))} of 30 after recovering"
        assert db.wait_empty(timeout=5), (db.events(), db.deliveries())
        assert not duplicates(ok(a)), duplicates(ok(a))
        assert not duplicates(ok(b)), "b was sent again while a retried"
        for rx in (a, b):
            for key in range(3):
                mine = [i for i in ok(rx) if (i - ids[0]) % 3 == key]
                assert mine == sorted(mine), f"key order broken at {rx.url}: {mine}"


def test_a_stalled_destination_does_not_stall_the_others(db, relay, tmp_path):
    release = threading.Event()

    def stalled(req):
        release.wait(20)
        return 200, {}, b"late"

    with Receiver(stalled) as a, Receiver() as b:
        config = two_destinations(
            a, b, extra_a='max_concurrency = 2\nrequest_timeout = "20s"\n',
            routes=('[[routes]]\ntopics = ["slow.>"]\ndestinations = ["a"]\n\n'
                    '[[routes]]\ntopics = ["fast.>"]\ndestinations = ["b"]\n'))
        relay(None, "--config", write_config(tmp_path, config), "--concurrency", "4", "--lease", "60s")
        slow = [db.enqueue("slow.thing", {"n": n}) for n in range(10)]
        # a's two connections are stuck (the receiver records on arrival), the rest of slow waits
        assert a.wait_until(lambda reqs: len(reqs) >= 2, 10), "a's two connections never filled"
        fast = [db.enqueue("fast.thing", {"n": n}) for n in range(20)]
        t0 = time.monotonic()
        assert wait_delivered(b, fast, 10), f"b got {len(ok(b))} of 20 while a stalled"
        assert time.monotonic() - t0 < 5
        release.set()
        assert wait_delivered(a, slow, 20)
        assert db.wait_empty(timeout=10), (db.events(), db.deliveries())
        assert not duplicates(ok(a)) and not duplicates(ok(b))


@claims_only("a window event no route matches is dead-lettered at once (no row of its own to wait in)")
def test_an_event_no_route_matches_stays_in_the_outbox_with_the_reason(db, relay, outboxd, tmp_path):
    with Receiver() as a, Receiver() as b:
        only_orders = write_config(tmp_path, two_destinations(a, b), "v1.toml")
        r = relay(None, "--config", only_orders)
        stray = db.enqueue("invoices.sent", {"n": 1})
        routed = db.enqueue("orders.created", {"n": 2})
        assert wait_delivered(a, [routed], 10) and wait_delivered(b, [routed], 10)
        assert wait_until(lambda: (db.event(stray) or {}).get("last_error"), 10), db.event(stray)
        assert "no route matches topic 'invoices.sent'" in db.event(stray)["last_error"]
        # Stopped first: a running relay may be trying the stray again at the
        # moment `status` reads it (in flight, not retrying).
        r.stop()
        status = outboxd("status", "--json", "--database-url", db.url, "--schema", db.schema)
        assert status.rc == 0, status
        topics = {t["topic"]: t for t in map(json.loads, status.stdout.splitlines()) if "topic" in t}
        assert topics["invoices.sent"]["retrying"] == 1, topics
        assert "no route" in topics["invoices.sent"]["last_error"]
        assert stray not in ok(a) + ok(b)

        # A configuration that routes it: delivered on the next attempt.
        routes = '[[routes]]\ntopics = ["orders.>", "invoices.*"]\ndestinations = ["a", "b"]\n'
        relay(None, "--config", write_config(tmp_path, two_destinations(a, b, routes=routes), "v2.toml"))
        db.query("UPDATE {s}.events SET available_at = now() WHERE id = %s RETURNING id", (stray,))
        assert wait_delivered(a, [stray], 10) and wait_delivered(b, [stray], 10)
        assert db.wait_empty(timeout=5)


def test_a_dead_letter_belongs_to_its_destination_and_replays_there_only(db, relay, outboxd, tmp_path):
    a_gone = threading.Event()
    a_gone.set()

    with Receiver(lambda req: (410, {}, b"gone") if a_gone.is_set() else (200, {}, b"ok")) as a, \
            Receiver() as b:
        relay(None, "--config", write_config(tmp_path, two_destinations(a, b)))
        event_id = db.enqueue("orders.created", {"n": 1})
        assert wait_delivered(b, [event_id], 10)
        assert wait_until(lambda: db.count_dead_letters() == 1, 10)
        assert db.wait_empty(timeout=5), (db.events(), db.deliveries())
        dead = outboxd("dead", "list", "--json", "--database-url", db.url, "--schema", db.schema)
        [row] = [json.loads(line) for line in dead.stdout.splitlines()]
        assert row["id"] == event_id and row["destination"] == "a" and row["last_status"] == 410

        a_gone.clear()
        replay = outboxd("dead", "replay", "--id", str(event_id), "--database-url", db.url, "--schema", db.schema)
        assert replay.rc == 0, replay
        assert wait_delivered(a, [event_id], 10)
        assert db.wait_empty(timeout=5)
        assert ok(b) == [event_id], "the replay went to b as well"
        [again] = [r for r in a.snapshot() if r.status == 200]
        assert again.headers["webhook-id"] == db.message_id(event_id)


def _verifies(secret: str, req) -> bool:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = b".".join([req.headers["webhook-id"].encode(), req.headers["webhook-timestamp"].encode(), req.body])
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest("v1," + expected, s) for s in req.headers["webhook-signature"].split(" "))


def test_each_destination_has_its_own_secrets_and_headers(db, relay, tmp_path):
    secret_a = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    secret_b = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    with Receiver() as a, Receiver() as b:
        config = two_destinations(
            a, b,
            extra_a=f'signing_secrets = ["{secret_a}"]\nheaders = {{ X-Team = "alpha" }}\n',
            extra_b='signing_secrets_env = "B_SECRETS"\nheaders = { Authorization = "Bearer b-token" }\n')
        relay(None, "--config", write_config(tmp_path, config), env={"B_SECRETS": secret_b})
        event_id = db.enqueue("orders.created", {"n": 1}, headers={"Authorization": "from-event"})
        assert wait_delivered(a, [event_id], 10) and wait_delivered(b, [event_id], 10)
        [ra], [rb] = a.snapshot(), b.snapshot()
        assert _verifies(secret_a, ra) and not _verifies(secret_b, ra)
        assert _verifies(secret_b, rb) and not _verifies(secret_a, rb)
        assert ra.headers["x-team"] == "alpha" and "x-team" not in rb.headers
        assert ra.headers["authorization"] == "from-event"
        assert rb.headers["authorization"] == "Bearer b-token"


def test_a_relay_leaves_alone_deliveries_for_destinations_it_does_not_know(db, relay, tmp_path):
    """A rolling deploy: relays with an older configuration (no destination b)
    run beside relays that know b. The old relay must not claim b's delivery
    (it would burn its attempts on "not in this relay's configuration"); a
    relay that knows b delivers it at its first attempt."""
    with Receiver() as a, Receiver() as b:
        event_id = db.enqueue("orders.created", {"n": 1})
        # The state a fan-out leaves when b still owes the event.
        db.query("UPDATE {s}.events SET fanned_out = true, available_at = 'infinity' WHERE id = %s "
                 "RETURNING id", (event_id,))
        db.query("INSERT INTO {s}.deliveries (event_id, destination, available_at, attempts) "
                 "VALUES (%s, 'b', now(), 0) RETURNING event_id", (event_id,))
        only_a = ('[defaults.retry]\nbase = "100ms"\ncap = "200ms"\n\n'
                  f'[destinations.a]\nurl = "{a.url}"\n\n'
                  '[[routes]]\ntopics = ["orders.>"]\ndestinations = ["a"]\n')
        old = relay(None, "--config", write_config(tmp_path, only_a, "old.toml"), "--sweep-interval", "200ms")
        # Several sweeps of the old relay, each a chance to claim it.
        time.sleep(1.5)
        [row] = db.deliveries(event_id)
        assert row["attempts"] == 0 and row["lease_owner"] is None and row["last_error"] is None, row
        assert a.snapshot() == [] and b.snapshot() == []

        relay(None, "--config", write_config(tmp_path, two_destinations(a, b), "new.toml"))
        assert wait_delivered(b, [event_id], 10)
        assert db.wait_empty(timeout=5), (db.events(), db.deliveries())
        assert [r.headers["outbox-attempt"] for r in b.snapshot()] == ["1"]
        assert a.snapshot() == [], "a had delivered it already before the fan-out"
        assert old.alive()


@claims_only("a window event no route matches is dead-lettered at once (no row of its own to wait in)")
def test_an_unroutable_event_does_not_hold_back_its_key_and_follows_the_configured_retries(db, relay, outboxd,
                                                                                        tmp_path):
    """`cart` has no route. Keyed, it would block every later event of its
    key until its attempts run out: it goes to dead letters at once, with
    the reason, and the routed event of the same key goes out. Unkeyed, it
    harms nobody: it stays for a relay whose routes match, on the configured
    retry schedule (here 2 attempts), not a built-in one."""
    config = ('[defaults.retry]\nbase = "100ms"\ncap = "100ms"\nmax_attempts = 2\n\n'
              '[destinations.a]\nurl = "{url}"\n\n'
              '[[routes]]\ntopics = ["order.*"]\ndestinations = ["a"]\n')
    with Receiver() as a:
        relay(None, "--config", write_config(tmp_path, config.format(url=a.url)), "--sweep-interval", "1h")
        poison = db.enqueue("cart", {"n": 1}, key="cust-1")
        routed = db.enqueue("order.created", {"n": 2}, key="cust-1")
        assert wait_delivered(a, [routed], 10), "the routed event waited behind the unroutable one of its key"
        dead = {d["id"]: d for d in db.dead_letters()}
        assert poison in dead, dead
        assert "no route matches topic 'cart'" in dead[poison]["last_error"], dead[poison]
        assert dead[poison]["attempts"] == 1, dead[poison]

        stray = db.enqueue("cart", {"n": 3})
        assert wait_until(lambda: stray in {d["id"] for d in db.dead_letters()}, 10), db.events()
        assert {d["id"]: d["attempts"] for d in db.dead_letters()}[stray] == 2
        assert db.wait_empty(timeout=5), db.events()

        # Re-routing a poison event: replay it once a route matches.
        replay = outboxd("dead", "replay", "--id", str(poison), "--database-url", db.url, "--schema", db.schema)
        assert replay.rc == 0, replay


def test_a_replayed_event_owed_to_a_destination_no_relay_knows_holds_back_its_key_there_only(db, relay, tmp_path):
    """A dead letter of a destination since removed from every configuration
    is replayed: the event comes back owed to that destination alone. It
    waits there, in a delivery row of its own, and the later events of its
    key still reach the destinations that exist. A destination may even be
    called "null" (an array's text form quotes that word)."""
    def insert(topic, key, destinations):
        return db.scalar("INSERT INTO {s}.events (topic, ordering_key, payload, destinations) "
                         "VALUES (%s, %s, '{{}}', %s) RETURNING id", (topic, key, destinations))

    gone = insert("orders.old", "K", ["gone"])
    later = db.enqueue("orders.new", {"n": 2}, key="K")
    to_null = insert("orders.other", None, ["null"])
    config = ('[defaults.retry]\nbase = "100ms"\ncap = "200ms"\n\n'
              '[destinations.a]\nurl = "{a}"\n\n[destinations.null]\nurl = "{n}"\n\n'
              '[[routes]]\ntopics = [">"]\ndestinations = ["a", "null"]\n')
    with Receiver() as a, Receiver() as n:
        relay(None, "--config", write_config(tmp_path, config.format(a=a.url, n=n.url)), "--sweep-interval", "1h")
        assert wait_delivered(a, [later], 10) and wait_delivered(n, [later, to_null], 10), \
            (a.snapshot(), n.snapshot(), db.events(), db.deliveries())
        assert wait_until(lambda: db.deliveries(gone), 10), db.events()
        [row] = db.deliveries(gone)
        assert row["destination"] == "gone" and row["attempts"] == 0 and row["last_error"] is None, row
        assert gone not in ok(a) + ok(n) and to_null not in ok(a)


def test_an_event_naming_a_destination_that_cannot_exist_is_dead_lettered_and_the_relay_goes_on(db, relay, receiver):
    """events.destinations is written by replays, but a producer could write
    it too: a name no destination can have must not jam the relay's outcome
    writes (no delivery row may carry it)."""
    bad = db.scalar("INSERT INTO {s}.events (topic, payload, destinations) "
                    "VALUES ('t', '{{}}', ARRAY['no such name!']) RETURNING id")
    relay(receiver, "--sweep-interval", "1h")
    assert wait_until(lambda: bad in {d["id"] for d in db.dead_letters()}, 10), (db.events(), db.deliveries())
    [dead] = [d for d in db.dead_letters() if d["id"] == bad]
    assert "cannot exist" in dead["last_error"], dead
    after = db.enqueue("t", {"n": 1})
    assert wait_delivered(receiver, [after], 10)
    assert db.wait_empty(timeout=5), (db.events(), db.deliveries())
