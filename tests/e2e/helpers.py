"""Small helpers shared by the end-to-end tests (no fixtures here; see conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import time
from typing import Callable, Iterable

import pytest
from psycopg2 import sql


def suite_consume_mode() -> str:
    """The consume mode the suite runs its relays in and sets its outboxes up
    for (OUTBOXD_TEST_CONSUME: "claims", the default, or "windows"; see
    conftest.py)."""
    mode = os.environ.get("OUTBOXD_TEST_CONSUME", "claims")
    if mode not in ("claims", "windows"):
        raise ValueError(f"OUTBOXD_TEST_CONSUME must be claims or windows, not {mode!r}")
    return mode


def suite_reads_windows() -> bool:
    """Whether the suite runs its relays reading windows."""
    return suite_consume_mode() == "windows"


def consume_setup(outboxd, db, mode: str):
    """`outboxd consume-setup MODE` on db's outbox; it must succeed."""
    r = outboxd("consume-setup", mode, "--database-url", db.url, "--schema", db.schema)
    assert r.rc == 0, r
    return r


def live_relays(outboxd, db) -> dict:
    """The live relays by mode, as `outboxd status --json` counts them."""
    status = outboxd("status", "--json", "--database-url", db.url, "--schema", db.schema)
    assert status.rc == 0, status
    return next(row["relays"] for row in map(json.loads, status.stdout.splitlines()) if "relays" in row)


def claims_only(why: str):
    """Marks a test of something only claims have (relay.consume = "claims"):
    skipped when the suite runs its relays reading windows."""
    return pytest.mark.skipif(suite_reads_windows(), reason=why)


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05):
    """Poll ``predicate`` every ``interval`` s until it returns a truthy value or
    ``timeout`` s passed. Returns the last value (falsy on timeout).

    For conditions outside the receiver (database rows, process state). The
    receiver has its own Condition-based ``wait_for``/``wait_until``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return value
        time.sleep(min(interval, remaining))


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free loopback port for a server the test starts, below the kernel's
    ephemeral range. A port the kernel hands out (bind to 0) is free only
    until the server binds it, and any outgoing connection may take it
    meanwhile as its local port: a NATS cluster node's route dialling a node
    not yet listening did, and that node failed with "address already in
    use"."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10000, max(low, 10001))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between 10000 and {low}")


def closed_port() -> int:
    """A loopback TCP port nobody listens on right now (connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ok_ids(rx) -> list:
    """Event ids the receiver answered with a 2xx, in arrival order (repeats kept)."""
    return rx.delivered_ids()


def wait_delivered(rx, ids: Iterable[int], timeout: float) -> bool:
    """Wait until every id in ``ids`` has at least one 2xx-answered request."""
    want = set(ids)
    return rx.wait_until(
        lambda reqs: want <= {r.event_id for r in reqs if 200 <= r.status < 300},
        timeout,
    )


def duplicates(ids: Iterable[int]) -> dict:
    """{id: count} for ids that occur more than once."""
    counts: dict = {}
    for i in ids:
        counts[i] = counts.get(i, 0) + 1
    return {i: c for i, c in counts.items() if c > 1}


@contextlib.contextmanager
def two_phase_transaction(db, gid: str):
    """A connection in a two-phase transaction named `gid` (tpc_begin; the
    caller prepares and commits it). Never left prepared: a forgotten one
    would hold back the whole cluster for every later test."""
    conn = db.connect()
    conn.tpc_begin(gid)
    try:
        yield conn
    finally:
        if db.scalar("SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,)):
            cleanup = db.connect()
            cleanup.autocommit = True
            with cleanup.cursor() as cur:
                cur.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
