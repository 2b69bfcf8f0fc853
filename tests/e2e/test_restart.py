"""PostgreSQL restarts under a running relay: nothing committed is lost."""

from __future__ import annotations

import threading
import time

import psycopg2

from conftest import Db
from helpers import claims_only, duplicates, wait_delivered, wait_until
from receiver import Receiver

# How long the server stays down. This creates the outage; it is not used to
# synchronise with the relay (every wait below is a condition with a deadline).
OUTAGE_SECONDS = 1.5


def _connect_retrying(url: str, timeout: float):
    """The first connection after `pg.sh start` (it returns once the server
    accepts connections, but be tolerant of a slow start)."""
    last = []

    def attempt():
        try:
            return psycopg2.connect(url, connect_timeout=2)
        except psycopg2.OperationalError as e:
            last[:] = [e]
            return None

    conn = wait_until(attempt, timeout, interval=0.1)
    assert conn, f"cannot connect to {url} after restart: {last}"
    conn.close()


@claims_only("inspects leases of the events in flight")
def test_events_committed_around_a_postgres_restart_are_all_delivered_and_in_flight_outcomes_recorded(
        pg_cluster, make_schema, relay, request):
    """Three deliveries are in flight when the server stops (the receiver
    holds them; checked, not hoped for) and are answered 200 while it is
    down. The relay keeps them and records their outcomes once the server is
    back: each is delivered exactly once, and the rows leave the outbox long
    before their 20 s lease would have made them claimable again. Events
    committed before, around and after the restart are all delivered."""
    gate = threading.Event()
    held_arrived = threading.Semaphore(0)

    def responder(req):
        if req.headers.get("outbox-topic") == "held":
            held_arrived.release()
            gate.wait(30)
        return 200, {}, b"ok"

    cluster = pg_cluster()
    schema = make_schema(url=cluster.url)
    db = Db(cluster.url, schema)
    request.addfinalizer(db.close)
    rx = Receiver(responder).start()
    request.addfinalizer(rx.stop)
    request.addfinalizer(gate.set)

    # The sweep is an hour away: what is delivered after the restart must come
    # from the relay's reconnect (LISTEN again, then drain), NOTIFY and its
    # timer for the next due row.
    r = relay(rx, "--sweep-interval", "1h", "--retry-base", "100ms", "--lease", "20s",
              "--connect-timeout", "1s", "--request-timeout", "10s",
              database_url=cluster.url, schema=schema)

    before = [db.enqueue("restart", {"phase": "before", "i": i}) for i in range(5)]
    assert wait_delivered(rx, before, timeout=10), rx.ids()
    held = [db.enqueue("held", {"i": i}) for i in range(3)]
    for _ in held:
        assert held_arrived.acquire(timeout=10), f"held deliveries never arrived: {rx.ids()}"
    leased = db.scalar("SELECT count(*) FROM {s}.events WHERE lease_owner IS NOT NULL AND leased_until > now() "
                       "AND id = ANY(%s)", (held,))
    assert leased == len(held), f"held events not in flight at the stop: {db.events()}"
    # More right before the stop: some are likely claimed or in flight too.
    racing = [db.enqueue("restart", {"phase": "racing", "i": i}) for i in range(20)]
    db.close()

    cluster.stop()
    gate.set()  # the held deliveries succeed while the server is down
    assert rx.wait_until(lambda reqs: all(any(q.event_id == i and q.status == 200 for q in reqs) for i in held), 5)
    time.sleep(OUTAGE_SECONDS)
    assert r.alive(), f"relay exited while PostgreSQL was down (rc={r.returncode})"
    cluster.start()  # same directory, same port
    _connect_retrying(cluster.url, timeout=10)

    db = Db(cluster.url, schema)
    request.addfinalizer(db.close)
    after = [db.enqueue("restart", {"phase": "after", "i": i}) for i in range(5)]

    t_up = time.monotonic()
    everything = before + held + racing + after
    assert wait_delivered(rx, everything, timeout=30), \
        f"not delivered after restart: {sorted(set(everything) - set(rx.delivered_ids()))}; " \
        f"relay alive={r.alive()} rc={r.returncode}; rows: {db.events()}"
    # Within the held events' lease (20 s from their claim, before the stop):
    # gone from the outbox means their outcome was recorded, not re-sent.
    assert db.wait_empty(timeout=10), f"rows left in events: {db.events()}; relay alive={r.alive()}"
    recovered = time.monotonic() - t_up
    sent_held = [q.event_id for q in rx.snapshot() if q.event_id in set(held)]
    assert sorted(sent_held) == sorted(held), \
        f"held deliveries not recorded after the restart (sent again): {sent_held}"

    # After the reconnect the relay is listening again: a new event arrives
    # promptly (the sweep is an hour away).
    probe = db.enqueue("restart", {"phase": "probe"})
    assert wait_delivered(rx, [probe], timeout=5), "relay is not woken by NOTIFY after reconnect"
    assert db.wait_empty(timeout=5)

    delivered = rx.delivered_ids()
    dups = duplicates([i for i in delivered if i in set(everything)])
    print(f"restart: {len(everything)} events, all delivered {recovered:.2f}s after the server "
          f"was back; {len(dups)} delivered more than once: {dups}")
    assert set(everything) <= set(delivered)
    assert db.count_dead_letters() == 0
    assert r.alive(), f"relay exited (rc={r.returncode})"
    assert r.stop() == 0
