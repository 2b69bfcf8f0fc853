"""Real nats-server processes for the NATS JetStream tests, and a tiny NATS
protocol client (no NATS package for Python is installed here, and the
protocol is plain text): enough to create streams and read them back
through JetStream's request/reply JSON API ($JS.API.*).

Servers listen on free loopback ports with their JetStream store under the
test's temporary directory; every server a test starts is stopped at teardown.
"""

from __future__ import annotations

import base64
import itertools
import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

from helpers import free_port, wait_until

NATS_SERVER = "/usr/sbin/nats-server"


class NatsError(Exception):
    pass


class Client:
    """One NATS connection: publish, subscribe-by-request, and JetStream API
    calls. Synchronous; replies are matched by their inbox subject."""

    def __init__(self, port: int, timeout: float = 5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sids = itertools.count(1)
        self.info = json.loads(self._line().split(b" ", 1)[1])
        self._send(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
                   b'"protocol":1,"name":"outboxd-e2e"}\r\nPING\r\n')
        self._until_pong()
        self.inbox = f"_INBOX.e2e{port}x{time.monotonic_ns()}"
        self._send(f"SUB {self.inbox}.* 1\r\n".encode())
        self.next_sid = 2
        self.seq = itertools.count(1)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- wire -------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise NatsError("connection closed by the server")
        self.buf += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _bytes(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _until_pong(self) -> None:
        while True:
            line = self._line()
            if line == b"PONG":
                return
            if line.startswith(b"-ERR"):
                raise NatsError(line.decode())

    def _next_message(self):
        """(subject, headers bytes, payload) of the next MSG/HMSG; answers PINGs."""
        while True:
            line = self._line()
            if line == b"PING":
                self._send(b"PONG\r\n")
                continue
            if line in (b"PONG", b"+OK") or line.startswith(b"INFO"):
                continue
            if line.startswith(b"-ERR"):
                raise NatsError(line.decode())
            parts = line.split()
            if parts[0] == b"MSG":
                n = int(parts[-1])
                return parts[1].decode(), b"", self._bytes(n)
            if parts[0] == b"HMSG":
                hlen, total = int(parts[-2]), int(parts[-1])
                data = self._bytes(total)
                return parts[1].decode(), data[:hlen], data[hlen:]
            raise NatsError(f"unexpected protocol line {line!r}")

    # -- requests ---------------------------------------------------------
    def request(self, subject: str, payload: bytes = b"", timeout: float = 5.0,
                headers: Optional[dict] = None):
        """Returns (headers bytes, payload) of the reply."""
        reply = f"{self.inbox}.{next(self.seq)}"
        if headers:
            h = b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n"
            self._send(f"HPUB {subject} {reply} {len(h)} {len(h) + len(payload)}\r\n".encode() + h + payload + b"\r\n")
        else:
            self._send(f"PUB {subject} {reply} {len(payload)}\r\n".encode() + payload + b"\r\n")
        self.sock.settimeout(timeout)
        try:
            while True:
                subj, hdrs, data = self._next_message()
                if subj == reply:
                    if b"503" in hdrs.split(b"\r\n", 1)[0]:
                        raise NatsError(f"no responders for {subject}")
                    return hdrs, data
        except socket.timeout:
            raise NatsError(f"no reply to {subject} within {timeout}s") from None

    def api(self, subject: str, body: Optional[dict] = None, timeout: float = 5.0) -> dict:
        """A JetStream API call ($JS.API.<subject>); raises on its error."""
        _, data = self.request(f"$JS.API.{subject}", json.dumps(body).encode() if body is not None else b"",
                               timeout)
        reply = json.loads(data)
        if "error" in reply:
            raise NatsError(f"{subject}: {reply['error']}")
        return reply

    # -- streams ----------------------------------------------------------
    def create_stream(self, name: str, subjects: list, replicas: int = 1,
                      duplicate_window_s: float = 120.0) -> dict:
        return self.api(f"STREAM.CREATE.{name}", {
            "name": name, "subjects": subjects, "num_replicas": replicas, "storage": "file",
            "duplicate_window": int(duplicate_window_s * 1e9)})

    def stream_info(self, name: str) -> dict:
        return self.api(f"STREAM.INFO.{name}")

    def stream_messages(self, name: str, from_seq: int = 1) -> list:
        """Every message of the stream from `from_seq` on, in stream order:
        dicts with seq, subject, headers (dict), data (bytes)."""
        state = self.stream_info(name)["state"]
        out = []
        for seq in range(max(from_seq, state["first_seq"]), state["last_seq"] + 1):
            try:
                m = self.api(f"STREAM.MSG.GET.{name}", {"seq": seq})["message"]
            except NatsError as e:
                if "no message found" in str(e):
                    continue
                raise
            out.append({"seq": m["seq"], "subject": m["subject"],
                        "headers": parse_headers(base64.b64decode(m.get("hdrs", ""))),
                        "data": base64.b64decode(m.get("data", ""))})
        return out


def parse_headers(raw: bytes) -> dict:
    headers = {}
    for line in raw.decode().split("\r\n")[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip()] = v.strip()
    return headers


class Server:
    """One nats-server process with JetStream (optionally one node of a cluster)."""

    def __init__(self, store: Path, name: str, log: Path, cluster_port: Optional[int] = None,
                 routes: Optional[list] = None):
        self.name = name
        self.store = store
        self.log_path = log
        self.port = free_port()
        self.monitor_port = free_port()
        self.cluster_port = cluster_port
        self.routes = routes or []
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> "Server":
        argv = [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor_port),
                "-n", self.name, "-js", "-sd", str(self.store)]
        if self.cluster_port is not None:
            argv += ["--cluster_name", "outboxd-e2e", "--cluster", f"nats://127.0.0.1:{self.cluster_port}",
                     "--routes", ",".join(self.routes)]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        assert wait_until(self._accepts, 10), f"nats-server {self.name} did not start:\n{self.log()}"
        return self

    def _accepts(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"nats-server {self.name} exited:\n{self.log()}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None:
            self._log.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def monitor(self, path: str) -> dict:
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/{path}", timeout=5) as r:
            return json.loads(r.read())


def published_by(servers: list, connection_name: str) -> int:
    """How many messages connections of that name published to these
    servers, closed connections included (their monitoring endpoint keeps the
    last closed ones)."""
    total = 0
    for s in servers:
        if not s.alive():
            continue
        conns = s.monitor("connz?state=all&limit=10000")["connections"] or []
        total += sum(c.get("in_msgs", 0) for c in conns if c.get("name") == connection_name)
    return total


def cluster(tmp: Path, size: int = 3) -> list:
    """A JetStream cluster of `size` nodes on loopback (not yet started)."""
    cluster_ports = [free_port() for _ in range(size)]
    routes = [f"nats://127.0.0.1:{p}" for p in cluster_ports]
    return [Server(tmp / f"js{i}", f"n{i}", tmp / f"nats-n{i}.log", cluster_ports[i],
                   [r for j, r in enumerate(routes) if j != i]) for i in range(size)]


def wait_jetstream_ready(port: int, timeout: float = 15.0) -> None:
    """Until JetStream answers account info (in a cluster: a meta leader is elected)."""
    def ready():
        c = None
        try:
            c = Client(port, timeout=1)
            c.api("INFO", timeout=1)
            return True
        except (NatsError, OSError):
            return False
        finally:
            if c is not None:
                c.close()
    assert wait_until(ready, timeout, interval=0.1), "JetStream did not become ready"
