"""The LISTEN connection: lost on its own while the server stays up, and
NOTIFY for schema names that need quoting. The sweep is an hour away in
every test here, so a prompt delivery can only come from a wake-up."""

from __future__ import annotations

import time

from conftest import Db
from helpers import wait_delivered, wait_until


def _listener_pid(db, channel_sql: str):
    """The backend whose last statement was our LISTEN (pinged connections run
    SELECT 1; this is read right after the relay (re)connected)."""
    rows = [r for r in db.relay_sessions() if r["query"] == f"LISTEN {channel_sql}"]
    return rows[0]["pid"] if len(rows) == 1 else None


def _channel_sql(schema: str) -> str:
    # LISTEN "outboxd.<schema>", the identifier quoted the way PostgreSQL's quote_ident does.
    return '"' + ("outboxd." + schema).replace('"', '""') + '"'


def test_losing_only_the_listen_connection_is_noticed_and_notify_wakes_the_relay_again(db, receiver, relay):
    r = relay(receiver, "--sweep-interval", "1h")
    first = db.enqueue("t", {"n": 1})
    assert wait_delivered(receiver, [first], timeout=10)
    channel = _channel_sql(db.schema)
    old = wait_until(lambda: _listener_pid(db, channel), 10)
    assert old, f"no LISTEN session found: {db.relay_sessions()}"
    others = {row["pid"] for row in db.relay_sessions()} - {old}

    # Only the listener's backend; the server and the relay's other sessions stay.
    assert db.scalar("SELECT pg_terminate_backend(%s)", (old,))
    gap = db.enqueue("t", {"n": "while the listener is down"})
    assert wait_until(lambda: "listen connection lost" in r.log(), 10), r.log()
    new = wait_until(lambda: (p := _listener_pid(db, channel)) and p != old and p, 15)
    assert new, f"the relay did not LISTEN again: {db.relay_sessions()}\n{r.log()}"
    # What was committed while nobody listened comes with the drain after LISTEN.
    assert wait_delivered(receiver, [gap], timeout=10), r.log()

    # And a NOTIFY on the new connection wakes the relay.
    assert db.wait_relay_quiet(timeout=10), db.relay_sessions()
    t0 = time.monotonic()
    after = db.enqueue("t", {"n": "after"})
    assert wait_delivered(receiver, [after], timeout=5), f"no wake-up on the new LISTEN connection\n{r.log()}"
    print(f"woken {time.monotonic() - t0:.3f}s after the commit; sessions before {sorted(others)}, "
          f"after {sorted(row['pid'] for row in db.relay_sessions())}")
    assert r.alive()
    assert db.wait_empty(timeout=5), db.events()
    assert sorted(receiver.delivered_ids()) == sorted([first, gap, after])


def test_notify_wakes_the_relay_for_a_schema_name_that_needs_quoting(make_schema, database_url, receiver, relay,
                                                                     request):
    name = make_schema(name=f'E2e "Quoted" Schema.{int(time.time() * 1000) % 100000}')
    db = Db(database_url, name)
    request.addfinalizer(db.close)
    r = relay(receiver, "--sweep-interval", "1h", schema=name)
    assert wait_until(lambda: _listener_pid(db, _channel_sql(name)), 10), \
        f"no LISTEN {_channel_sql(name)}: {db.relay_sessions()}\n{r.log()}"
    # Past the startup drain: everything the relay does now, a wake-up started.
    probe = db.enqueue("t", {"n": 1})
    assert wait_delivered(receiver, [probe], timeout=10)
    assert db.wait_relay_quiet(timeout=10), db.relay_sessions()
    t0 = time.monotonic()
    woken = db.enqueue("t", {"n": 2})
    assert wait_delivered(receiver, [woken], timeout=5), \
        f"a NOTIFY for schema {name!r} did not wake the relay (sweep 1 h away)\n{r.log()}"
    print(f"woken {time.monotonic() - t0:.3f}s after the commit")
    assert db.wait_empty(timeout=5), db.events()
