"""A real HTTP/1.1 webhook receiver for the end-to-end tests.

It listens on 127.0.0.1 with an ephemeral port, keeps connections alive the
way outboxd's pool expects, records every request the moment it has been
read (in arrival order, ``status`` 0), then answers what a test-supplied
``responder`` says, setting ``status`` before the answer is written. So a
request the relay has had an answer to is always recorded with that answer,
and a request still held by a responder is already visible (status 0).

Usage::

    with Receiver() as rx:
        ...                       # start outboxd with --url rx.url
        assert rx.wait_for(1, timeout=5)
        assert rx.requests[0].event_id == event_id

Nagle: the handler sets ``disable_nagle_algorithm``; without it every
keep-alive response stalls ~40 ms on Nagle plus the client's delayed ACK.

HTTPS: ``Receiver(tls=(certfile, keyfile))`` (see tls_certs.py) serves the
same over TLS; ``url`` is then ``https://localhost:<port>/hook``, the name a
certificate is usually issued for. Each connection's handshake runs in its
handler thread, so a client that fails or stalls it holds up no one else;
failed handshakes are counted in ``tls_failures``, never recorded as
requests.
"""

from __future__ import annotations

import http.server
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

__all__ = ["Receiver", "Received"]


@dataclass
class Received:
    """One request as the receiver saw it."""

    event_id: Optional[int]          # from the webhook-id header, None if absent/not a number
    headers: dict                    # lower-case header names -> value (last one wins)
    body: bytes
    t_monotonic: float               # time.monotonic() when the request line arrived
    status: int = 0                  # what the receiver answers (0 while the responder runs)
    method: str = "POST"
    path: str = ""
    header_list: list = field(default_factory=list)  # [(lower-case name, value)] incl. repeats
    t_wall: float = 0.0              # time.time() when the request line arrived (to compare with the database)

    def json(self):
        import json
        return json.loads(self.body)


Responder = Callable[[Received], tuple]


def _default_responder(_req: Received):
    return 200, {}, b"ok"


def _parse_event_id(value: Optional[str]) -> Optional[int]:
    """The event id in a webhook-id: "msg_<outbox>_<id>" (or a bare number)."""
    if value is None:
        return None
    try:
        return int(value.strip().rsplit("_", 1)[-1])
    except ValueError:
        return None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"      # keep-alive
    disable_nagle_algorithm = True     # see module docstring
    server_version = "outboxd-e2e-receiver"

    # Silence the default per-request stderr logging.
    def log_message(self, format, *args):  # noqa: A002 (stdlib signature)
        pass

    def _handle(self):
        t = time.monotonic()
        wall = time.time()
        receiver: Receiver = self.server.receiver  # type: ignore[attr-defined]
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = self._read_chunked()
        else:
            body = self.rfile.read(int(length)) if length else b""
        header_list = [(k.lower(), v) for k, v in self.headers.items()]
        req = Received(
            event_id=_parse_event_id(self.headers.get("webhook-id")),
            headers={k: v for k, v in header_list},
            body=body,
            t_monotonic=t,
            method=self.command,
            path=self.path,
            header_list=header_list,
            t_wall=wall,
        )
        # Recorded on arrival, before the responder runs and long before the
        # relay can read an answer: whatever the relay counts as sent is in
        # ``requests`` already (status 0 until the answer is decided).
        receiver._record(req)
        try:
            status, headers, out = receiver.responder(req)
        except Exception as e:  # a broken responder must not hang the client
            status, headers, out = 599, {}, f"responder raised {e!r}".encode()
        out = out or b""
        # The status is set before a byte of the answer is written, so a
        # relay never holds a 2xx the receiver has not counted as 2xx.
        receiver._answered(req, status)
        self.send_response(status)
        lower = {k.lower() for k in headers}
        for k, v in headers.items():
            self.send_header(k, str(v))
        if "content-length" not in lower:
            self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        if out and self.command != "HEAD":
            self.wfile.write(out)
        self.wfile.flush()

    def _read_chunked(self) -> bytes:
        parts = []
        while True:
            line = self.rfile.readline()
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                # trailers up to the empty line
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()  # CRLF after the chunk

    do_POST = _handle
    do_PUT = _handle
    do_GET = _handle
    do_HEAD = _handle
    do_DELETE = _handle
    do_PATCH = _handle


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a relay opening a burst of
    # connections (--concurrency 32) overflows it, dropped SYNs are resent
    # after 1 s, and deliveries fail with connect timeouts the receiver caused.
    request_queue_size = 1024

    def handle_error(self, request, client_address):
        # A client that goes away mid-request (a relay killed or shut down by
        # a test) is expected, and so is a TLS handshake the client rejects
        # (the point of the certificate tests); anything else keeps the
        # stdlib traceback.
        import sys
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLError):
            with self.receiver._cond:  # type: ignore[attr-defined]
                self.receiver.tls_failures += 1  # type: ignore[attr-defined]
            return
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class Receiver:
    """HTTP/1.1 receiver on 127.0.0.1:<ephemeral>, path /hook; HTTPS when
    ``tls=(certfile, keyfile)`` is given."""

    def __init__(self, responder: Optional[Responder] = None, tls: Optional[tuple] = None):
        self.responder: Responder = responder or _default_responder
        self.tls = tls
        self.tls_failures = 0  # TLS handshakes that failed (HTTPS only)
        self.requests: list[Received] = []
        self.on_request: Optional[Callable[[Received], None]] = None
        self._cond = threading.Condition()
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self.url: Optional[str] = None
        self.port: Optional[int] = None

    # -- lifecycle -------------------------------------------------------
    def start(self) -> "Receiver":
        if self._server is not None:
            return self
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.receiver = self  # type: ignore[attr-defined]
        self.port = self._server.server_address[1]
        if self.tls is not None:
            certfile, keyfile = self.tls
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(certfile), str(keyfile))
            # No handshake in accept() (the serving thread): it happens on
            # the first read, in the connection's own handler thread.
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True,
                                                      do_handshake_on_connect=False)
            self.url = f"https://localhost:{self.port}/hook"
        else:
            self.url = f"http://127.0.0.1:{self.port}/hook"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"receiver:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> "Receiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- recording -------------------------------------------------------
    def _record(self, req: Received) -> None:
        with self._cond:
            self.requests.append(req)
            self._cond.notify_all()

    def _answered(self, req: Received, status: int) -> None:
        with self._cond:
            req.status = status
            self._cond.notify_all()
        cb = self.on_request
        if cb is not None:
            cb(req)

    def wait_for(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` requests were answered (``status``
        set) or ``timeout`` s passed. ``wait_until`` sees requests on arrival."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while sum(1 for r in self.requests if r.status) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def wait_until(self, predicate: Callable[[list], bool], timeout: float) -> bool:
        """Block until ``predicate(snapshot of requests)`` is true or ``timeout`` s passed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(list(self.requests)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    # -- helpers for assertions -----------------------------------------
    def snapshot(self) -> list:
        with self._cond:
            return list(self.requests)

    def ids(self, status: Optional[int] = None) -> list:
        """Event ids in arrival order (optionally only those answered ``status``)."""
        return [r.event_id for r in self.snapshot() if status is None or r.status == status]

    def delivered_ids(self) -> list:
        """Event ids answered with a 2xx, in arrival order (repeats kept)."""
        return [r.event_id for r in self.snapshot() if 200 <= r.status < 300]


if __name__ == "__main__":
    # Standalone self-test: python3 tests/e2e/receiver.py
    import http.client
    import json
    import urllib.request

    calls = {"n": 0}

    def responder(req: Received):
        calls["n"] += 1
        if req.headers.get("x-fail") == "1":
            return 500, {"Retry-After": "1"}, b"nope"
        return 200, {"X-Echo": str(len(req.body))}, b"ok"

    seen = []
    with Receiver(responder) as rx:
        rx.on_request = seen.append
        assert rx.url.startswith("http://127.0.0.1:") and rx.url.endswith("/hook"), rx.url

        # urllib (connection: close)
        body = json.dumps({"a": 1}).encode()
        r = urllib.request.Request(rx.url, data=body, method="POST",
                                   headers={"webhook-id": "42", "Outbox-Topic": "t"})
        with urllib.request.urlopen(r, timeout=5) as resp:
            assert resp.status == 200 and resp.read() == b"ok"
        assert rx.wait_for(1, timeout=5)
        got = rx.requests[0]
        assert got.event_id == 42 and got.body == body, got
        assert got.headers["outbox-topic"] == "t" and got.status == 200

        # keep-alive: many requests on one connection, must be fast (no Nagle stall)
        conn = http.client.HTTPConnection("127.0.0.1", rx.port, timeout=5)
        t0 = time.monotonic()
        n = 50
        for i in range(n):
            conn.request("POST", "/hook", body=b"x" * (i * 100),
                         headers={"webhook-id": str(100 + i), "x-fail": "1" if i == 3 else "0"})
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == (500 if i == 3 else 200), resp.status
            assert data == (b"nope" if i == 3 else b"ok")
        elapsed = time.monotonic() - t0
        conn.close()
        assert rx.wait_for(1 + n, timeout=5)
        assert not rx.wait_for(2 + n, timeout=0.05)
        assert [r.event_id for r in rx.requests[1:]] == list(range(100, 100 + n))
        assert [len(r.body) for r in rx.requests[1:]] == [i * 100 for i in range(n)]
        assert rx.requests[4].status == 500
        assert len(seen) == 1 + n
        assert elapsed < 1.0, f"keep-alive too slow: {elapsed:.3f}s for {n} requests"
        ts = [r.t_monotonic for r in rx.requests]
        assert ts == sorted(ts)

        # chunked body
        conn = http.client.HTTPConnection("127.0.0.1", rx.port, timeout=5)
        conn.request("POST", "/hook", body=iter([b"ab", b"cd"]),
                     headers={"webhook-id": "7", "Transfer-Encoding": "chunked"}, encode_chunked=True)
        resp = conn.getresponse(); resp.read()
        assert rx.wait_for(2 + n, timeout=5)
        assert rx.requests[-1].body == b"abcd", rx.requests[-1].body
        conn.close()

    # HTTPS with a throwaway CA: trusted through the CA file, refused by the
    # system CAs, and a certificate for another name refused by name.
    import tempfile
    import urllib.error

    from tls_certs import make_tls_files

    def refusal(url, context) -> str:
        try:
            urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="POST"),
                                   timeout=5, context=context)
        except urllib.error.URLError as e:
            return str(e.reason)
        raise AssertionError(f"{url} was not refused")

    with tempfile.TemporaryDirectory(prefix="outboxd-receiver-tls-") as tmp:
        files = make_tls_files(tmp)
        trusted = ssl.create_default_context(cafile=str(files.ca_cert))
        with Receiver(tls=files.server) as rx:
            assert rx.url.startswith("https://localhost:") and rx.url.endswith("/hook"), rx.url
            r = urllib.request.Request(rx.url, data=b"{}", method="POST", headers={"webhook-id": "9"})
            with urllib.request.urlopen(r, timeout=5, context=trusted) as resp:
                assert resp.status == 200 and resp.read() == b"ok"
            conn = http.client.HTTPSConnection("localhost", rx.port, timeout=5, context=trusted)
            for i in range(3):  # keep-alive over TLS
                conn.request("POST", "/hook", body=b"{}", headers={"webhook-id": str(10 + i)})
                resp = conn.getresponse()
                assert resp.status == 200 and resp.read() == b"ok"
            conn.close()
            assert rx.wait_for(4, timeout=5)
            assert [q.event_id for q in rx.requests] == [9, 10, 11, 12]
            reason = refusal(rx.url, ssl.create_default_context())
            assert "CERTIFICATE_VERIFY_FAILED" in reason, reason
            deadline = time.monotonic() + 5
            while rx.tls_failures < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert rx.tls_failures == 1 and len(rx.requests) == 4, (rx.tls_failures, rx.requests)
        with Receiver(tls=files.wrong_host) as rx:
            reason = refusal(rx.url, trusted)
            assert "Hostname mismatch" in reason, reason
            assert not rx.requests
    print(f"receiver self-test ok ({n} keep-alive requests in {elapsed * 1000:.1f} ms; https ok)")
