"""PostgreSQL restarts under a running relay: nothing committed is lost."""

from __future__ import annotations

import time

import psycopg2

from conftest import Db
from helpers import duplicates, wait_delivered, wait_until

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


def test_events_committed_around_a_postgres_restart_are_all_delivered(
        pg_cluster, make_schema, receiver, relay, request):
    cluster = pg_cluster()
    schema = make_schema(url=cluster.url)
    db = Db(cluster.url, schema)
    request.addfinalizer(db.close)

    # The sweep is an hour away: what is delivered after the restart must come
    # from the relay's reconnect (LISTEN again, then drain), NOTIFY and its
    # timer for the next due row. A short lease bounds the wait for events
    # whose outcome could not be recorded while the server was down (claimed
    # before the outage: they become claimable again when the lease expires).
    r = relay(receiver, "--sweep-interval", "1h", "--retry-base", "100ms", "--lease", "5s",
              "--connect-timeout", "1s", "--request-timeout", "2s",
              database_url=cluster.url, schema=schema)

    before = [db.enqueue("restart", {"phase": "before", "i": i}) for i in range(5)]
    assert wait_delivered(receiver, before, timeout=10), receiver.ids()
    # Enqueue more and stop the server right away: some of these are likely
    # claimed or in flight while the server goes down.
    racing = [db.enqueue("restart", {"phase": "racing", "i": i}) for i in range(20)]
    db.close()

    cluster.stop()
    time.sleep(OUTAGE_SECONDS)
    assert r.alive(), f"relay exited while PostgreSQL was down (rc={r.returncode})"
    cluster.start()  # same directory, same port
    _connect_retrying(cluster.url, timeout=10)

    db = Db(cluster.url, schema)
    request.addfinalizer(db.close)
    after = [db.enqueue("restart", {"phase": "after", "i": i}) for i in range(5)]

    t_up = time.monotonic()
    everything = before + racing + after
    assert wait_delivered(receiver, everything, timeout=30), \
        f"not delivered after restart: {sorted(set(everything) - set(receiver.delivered_ids()))}; " \
        f"relay alive={r.alive()} rc={r.returncode}; rows: {db.events()}"
    assert db.wait_empty(timeout=10), f"rows left in events: {db.events()}; relay alive={r.alive()}"
    recovered = time.monotonic() - t_up

    # After the reconnect the relay is listening again: a new event arrives
    # promptly (the sweep is an hour away).
    probe = db.enqueue("restart", {"phase": "probe"})
    assert wait_delivered(receiver, [probe], timeout=5), "relay is not woken by NOTIFY after reconnect"
    assert db.wait_empty(timeout=5)

    delivered = receiver.delivered_ids()
    dups = duplicates([i for i in delivered if i in set(everything)])
    print(f"restart: {len(everything)} events, all delivered {recovered:.2f}s after the server "
          f"was back; {len(dups)} delivered more than once: {dups}")
    assert set(everything) <= set(delivered)
    assert db.count_dead_letters() == 0
    assert r.alive(), f"relay exited (rc={r.returncode})"
    assert r.stop() == 0
