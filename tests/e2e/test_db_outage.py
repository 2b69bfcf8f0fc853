"""The database vanishes from the network without closing anything.

What this models: a network partition between outboxd and PostgreSQL, or a
failover that moves the database to another machine. Nothing closes the old
TCP connections: no FIN, no RST, no reply ever again. Queries written to them
are never answered, and new connections to the old address get nowhere.

How: outboxd reaches PostgreSQL through a TCP proxy in this file. On
``blackhole()`` the proxy stops forwarding on every open connection but keeps
the sockets open, and new connections it accepts are never forwarded either.
On ``restore()`` new connections are forwarded again (the database is back,
or reachable at its new address); the old ones stay silent forever, as a
partitioned connection does.

What it does not model: the kernel on outboxd's side still sees a live peer
(the proxy's kernel ACKs everything), so TCP keepalive and tcp_user_timeout
never fire here. A real partition lets the kernel notice too; through the
proxy only outboxd's own clocks can (the deadline on every database call and
the listener's ping). The test therefore proves the part that does not rely
on the kernel.
"""

from __future__ import annotations

import re
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import pytest

from conftest import EXIT_OK
from helpers import claims_only, wait_delivered, wait_until
from receiver import Receiver

EXIT_FORCED = 130

# Short timeouts so a silent database is noticed in a second or two. Given as
# environment variables: an outboxd that does not know them still starts
# (and then shows what happens without them).
FAST_TIMEOUTS = {
    "OUTBOXD_DATABASE_CONNECT_TIMEOUT": "2s",
    "OUTBOXD_DATABASE_STATEMENT_TIMEOUT": "1s",
    "OUTBOXD_DATABASE_KEEPALIVE_TIMEOUT": "2s",
}


class BlackholeProxy:
    """Forwards TCP between 127.0.0.1:<port> and PostgreSQL until told to go
    silent; see the module docstring."""

    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self._lock = threading.Lock()
        self._silent = False
        self._lose_answer: bytes | None = None
        self._conns: list[dict] = []  # {"client", "upstream", "live"}
        self._stop = threading.Event()
        self.accepted = 0
        self._threads = [threading.Thread(target=self._accept_loop, daemon=True)]
        self._threads[0].start()

    def url_for(self, database_url: str) -> str:
        parts = urlsplit(database_url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        netloc = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
        return urlunsplit(parts._replace(netloc=netloc))

    def blackhole(self) -> None:
        with self._lock:
            self._silent = True
            for c in self._conns:
                c["live"] = False

    def lose_answer_containing(self, marker: bytes) -> None:
        """The first answer from the database that carries `marker` never
        arrives, and its connection goes silent both ways from then on: the
        statement ran (and committed) at the server, its client never learns
        what it did. Other connections are untouched."""
        with self._lock:
            self._lose_answer = marker

    def restore(self) -> None:
        """New connections are forwarded again; old ones stay silent."""
        with self._lock:
            self._silent = False

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            r, _, _ = select.select([self.server], [], [], 0.1)
            if not r:
                continue
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                conn = {"client": client, "upstream": None, "live": not self._silent}
                self._conns.append(conn)
            if conn["live"]:
                try:
                    conn["upstream"] = socket.create_connection(self.upstream, timeout=5)
                except OSError:
                    client.close()
                    continue
            t = threading.Thread(target=self._pump, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _pump(self, conn: dict) -> None:
        client, upstream = conn["client"], conn["upstream"]
        while not self._stop.is_set():
            if not conn["live"] or upstream is None:
                # Silent: read nothing, write nothing, close nothing.
                self._stop.wait(0.1)
                continue
            r, _, _ = select.select([client, upstream], [], [], 0.1)
            with self._lock:
                if not conn["live"]:
                    continue
            for s in r:
                other = upstream if s is client else client
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self._close(conn)
                    return
                if s is upstream:
                    with self._lock:
                        if self._lose_answer is not None and self._lose_answer in data:
                            self._lose_answer = None
                            conn["live"] = False
                            break
                try:
                    other.sendall(data)
                except OSError:
                    self._close(conn)
                    return

    def _close(self, conn: dict) -> None:
        for s in (conn["client"], conn["upstream"]):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self.server.close()
        for t in self._threads:
            t.join(2)
        with self._lock:
            for c in self._conns:
                self._close(c)


@pytest.fixture
def proxy(database_url):
    parts = urlsplit(database_url)
    p = BlackholeProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    yield p
    p.close()


def _log_has(relay, pattern: str, after: int = 0) -> bool:
    return re.search(pattern, relay.log()[after:]) is not None


@claims_only("a delivered window event writes nothing: there is no outcome write to hang (windows: step 4 adds its own outage test)")
def test_a_silent_database_is_noticed_in_seconds_and_nothing_is_lost(db, proxy, relay, database_url):
    """Deliveries in flight when the database goes silent: their outcome
    writes hang on a dead connection, and the idle LISTEN connection is dead
    too. outboxd must notice both within a few seconds (not the ~15 minutes
    TCP takes to give up on unacknowledged data, or never for an idle
    socket), keep reconnecting while the database is unreachable, and once it
    is reachable again deliver everything committed before, during and after
    the outage, leaving the outbox empty."""
    gate = threading.Event()
    arrived = threading.Semaphore(0)

    def held(req):
        if req.headers.get("outbox-topic") == "held":
            arrived.release()
            gate.wait(30)
        return 200, {}, b"ok"

    with Receiver(held) as rx:
        r = relay(rx, "--sweep-interval", "1h", "--lease", "60s",
                  database_url=proxy.url_for(database_url), env=FAST_TIMEOUTS)
        before = db.enqueue("before", {"n": 0})
        assert wait_delivered(rx, [before], timeout=10), r.log()
        held_ids = [db.enqueue("held", {"n": i}) for i in range(3)]
        for _ in held_ids:
            assert arrived.acquire(timeout=10), "held deliveries never arrived"

        mark = len(r.log())
        proxy.blackhole()
        t_outage = time.monotonic()
        gate.set()  # the held deliveries finish now; recording them hangs
        during = [db.enqueue("during", {"n": i}) for i in range(5)]

        # Noticed: the outcome write is given up, the listener reconnects.
        assert wait_until(lambda: _log_has(r, r"recording outcomes failed", mark), timeout=8), \
            f"a hanging outcome write was not given up within 8s of the outage\n{r.log()[mark:]}"
        assert wait_until(lambda: _log_has(r, r"listen connection lost", mark), timeout=8), \
            f"the silent LISTEN connection was not noticed within 8s of the outage\n{r.log()[mark:]}"
        noticed = time.monotonic() - t_outage
        # ... and it keeps trying while the database stays unreachable.
        accepted = proxy.accepted
        assert wait_until(lambda: proxy.accepted > accepted, timeout=10), \
            "no reconnect attempt while the database was unreachable"

        proxy.restore()
        t_back = time.monotonic()
        after = [db.enqueue("after", {"n": i}) for i in range(5)]
        everything = [before, *held_ids, *during, *after]
        assert wait_delivered(rx, everything, timeout=30), \
            f"missing {sorted(set(everything) - set(rx.delivered_ids()))}\n{r.log()[mark:]}"
        assert db.wait_empty(timeout=15), (db.events(), r.log()[mark:])
        recovered = time.monotonic() - t_back
        assert r.alive(), r.log()
        print(f"noticed after {noticed:.1f}s, all delivered {recovered:.1f}s after the database came back")
        assert r.stop() == EXIT_OK, r.log()


@claims_only("window events are not leased")
def test_a_claim_whose_answer_is_lost_does_not_hold_its_events_until_the_lease_expires(
        db, proxy, relay, database_url):
    """A claim commits at the server, and its answer never reaches outboxd
    (the connection went silent in between). The events it leased are
    outboxd's own, but it never learned of them, and its previous session
    lives on at the server (nothing closed it), so no takeover frees them.
    Once it has a new claim connection it must hand back its leases that
    nothing of it holds, instead of leaving those events to wait out the
    lease (30 s here): delivered within seconds, once."""
    with Receiver() as rx:
        r = relay(rx, "--sweep-interval", "1h", "--lease", "30s",
                  database_url=proxy.url_for(database_url), env=FAST_TIMEOUTS)
        warm = db.enqueue("warm", {"n": 0})
        assert wait_delivered(rx, [warm], timeout=10), r.log()

        mark = len(r.log())
        proxy.lose_answer_containing(b"answer-lost-7f3a")
        t0 = time.monotonic()
        lost = db.enqueue("lost", {"marker": "answer-lost-7f3a"})
        assert wait_until(lambda: _log_has(r, r"claim failed", mark), timeout=8), \
            f"the claim whose answer was lost was not given up\n{r.log()[mark:]}"
        assert db.event(lost) is not None and db.event(lost)["lease_owner"] is not None, \
            f"the lost claim did not lease the event (the test set-up failed): {db.event(lost)}"
        after = db.enqueue("after", {"n": 1})
        assert wait_delivered(rx, [lost, after], timeout=10), \
            (f"{time.monotonic() - t0:.1f}s after the lost claim, not delivered: "
             f"{sorted({lost, after} - set(rx.delivered_ids()))}; outbox: {db.events()}\n{r.log()[mark:]}")
        assert rx.delivered_ids().count(lost) == 1, rx.delivered_ids()
        assert db.wait_empty(timeout=10), (db.events(), r.log()[mark:])

        # Its old session lives on at the server, holding the lock that binds
        # our leases: each claim tries for it once, it does not wait for it.
        # (A claim that waited would take 180 ms of retries, at least.)
        recovered = len(r.log())
        for n in range(9):
            one = db.enqueue("later", {"n": n})
            assert wait_delivered(rx, [one], timeout=10), r.log()[recovered:]
        claims = [int(us) for us in re.findall(r"msg=claimed .*?claim_us=(\d+)", r.log()[recovered:])]
        assert claims, r.log()[recovered:]
        median_ms = sorted(claims)[len(claims) // 2] / 1000
        assert median_ms < 100, f"claims took {claims} us while the old session held the lock"
        assert r.stop() == EXIT_OK, r.log()


def test_second_sigterm_exits_at_once_while_a_database_call_hangs(db, proxy, relay, database_url):
    """SIGTERM while an outcome write hangs on a silent database waits for it
    (graceful); a second SIGTERM must exit at once with the forced exit code,
    not wait for the database thread. Nothing is lost: the event whose
    outcome was not recorded stays in the outbox, leased until its lease
    expires, and is delivered again."""
    gate = threading.Event()
    arrived = threading.Event()

    def held(req):
        arrived.set()
        gate.wait(30)
        return 200, {}, b"ok"

    # A long statement timeout: the outcome write must still be hanging when
    # the signals come.
    slow_giveup = dict(FAST_TIMEOUTS, OUTBOXD_DATABASE_STATEMENT_TIMEOUT="60s")
    with Receiver(held) as rx:
        r = relay(rx, "--sweep-interval", "1h", "--shutdown-timeout", "60s",
                  database_url=proxy.url_for(database_url), env=slow_giveup)
        event_id = db.enqueue("held", {})
        assert arrived.wait(10), "delivery never arrived"
        proxy.blackhole()
        gate.set()
        assert wait_until(lambda: any(q.status == 200 for q in rx.snapshot()), timeout=10)
        r.send_signal(signal.SIGTERM)
        assert wait_until(lambda: _log_has(r, r"shutting down"), timeout=5), r.log()
        assert r.alive(), f"exited on the first signal although its outcome write hangs\n{r.log()}"
        t0 = time.monotonic()
        r.send_signal(signal.SIGTERM)
        rc = r.wait(3)
        took = time.monotonic() - t0
        if rc is None:
            r.kill()
        assert rc == EXIT_FORCED, f"exit {rc} {took:.1f}s after the second SIGTERM\n{r.log()}"
        assert db.event(event_id) is not None, "the event whose outcome was never recorded vanished"


def _relay_connections(pid: int, port: int) -> list:
    """The relay's established TCP connections to ``port``, as ``ss -o`` shows them."""
    out = subprocess.run(["ss", "-tnpoH", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True, timeout=10).stdout
    return [line for line in out.splitlines() if f"pid={pid}," in line]


def _keepalive_seconds(ss_line: str):
    """Seconds until the next keepalive probe (ss prints 119min, 1.984ms for
    1 s 984 ms, 12sec, 984ms); None without a keepalive timer."""
    m = re.search(r"timer:\(keepalive,(?:(\d+)min)?(?:(\d+)(?:\.|sec))?(?:(\d+)ms)?,", ss_line)
    if not m:
        return None
    minutes, secs, msecs = (int(g) if g else 0 for g in m.groups())
    return minutes * 60 + secs + msecs / 1000


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_every_relay_connection_to_the_database_probes_a_silent_peer_within_the_keepalive_timeout(
        db, receiver, relay, database_url):
    """What the proxy cannot show: the kernel side. libpq turns TCP keepalive
    on by default, but with the system's timing (first probe after 2 hours).
    Each of the relay's connections (claims, outcomes, LISTEN) must probe
    after half of database.keepalive_timeout (here 4s: after 2s idle), so on
    a real partition the kernel fails an idle connection in seconds."""
    port = urlsplit(database_url).port or 5432
    r = relay(receiver, "--sweep-interval", "1h", env={"OUTBOXD_DATABASE_KEEPALIVE_TIMEOUT": "4s"})
    probe = db.enqueue("probe", {})
    assert wait_delivered(receiver, [probe], timeout=10), r.log()
    # Sampled once every connection is idle: one with data in flight shows
    # its retransmission timer (timer:(on,200ms,0)) instead of keepalive's.
    def idle_connections():
        c = _relay_connections(r.pid, port)
        return c if len(c) >= 3 and all(_keepalive_seconds(x) is not None for x in c) else None

    conns = wait_until(idle_connections, timeout=10)
    assert conns, f"expected 3 idle connections of pid {r.pid} to port {port}: {_relay_connections(r.pid, port)}"
    slow = [c for c in conns if (_keepalive_seconds(c) or 1e9) > 2.0]
    assert not slow, "connections whose first keepalive probe is more than 2s away:\n" + "\n".join(slow)
