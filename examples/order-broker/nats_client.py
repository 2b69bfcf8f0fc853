"""A minimal NATS client for the order-broker example: enough JetStream to
create a stream and a durable pull consumer, fetch messages and acknowledge
them. The NATS protocol is plain text over TCP; in your service use an
official client (nats.py, nats.go, ...), which does the same calls.

    c = Client("nats://127.0.0.1:4222")
    c.create_stream("ORDERS", ["shop.orders.>"])
    c.create_durable("ORDERS", "billing")
    for m in c.fetch("ORDERS", "billing", batch=100):
        ...; c.ack(m)
"""

from __future__ import annotations

import itertools
import json
import os
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit


class NatsError(Exception):
    pass


@dataclass
class Message:
    subject: str
    reply: str                  # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>...
    headers: dict = field(default_factory=dict)
    data: bytes = b""
    status: str = ""            # "404", "408": JetStream's "no messages" / "request expired"

    @property
    def stream_seq(self) -> int:
        return int(self.reply.split(".")[5])

    @property
    def delivered(self) -> int:
        """How many times JetStream delivered this message to the consumer."""
        return int(self.reply.split(".")[4])


def parse_headers(raw: bytes) -> tuple[str, dict]:
    lines = raw.decode().split("\r\n")
    status = lines[0][len("NATS/1.0"):].strip().split(" ", 1)[0]
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip()] = v.strip()
    return status, headers


class Client:
    def __init__(self, url: str, timeout: float = 5.0):
        u = urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port or 4222), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self._line()   # INFO
        self._send(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
                   b'"protocol":1,"name":"order-broker example"}\r\nPING\r\n')
        while self._next() != "PONG":
            pass
        self.inbox = f"_INBOX.{os.urandom(8).hex()}"
        self._send(f"SUB {self.inbox}.* 1\r\n".encode())
        self.seq = itertools.count(1)

    def close(self) -> None:
        self.sock.close()

    # -- wire ---------------------------------------------------------------
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

    def _next(self):
        """The next Message, or "PONG"; answers the server's PINGs."""
        while True:
            line = self._line()
            if line == b"PING":
                self._send(b"PONG\r\n")
            elif line == b"PONG":
                return "PONG"
            elif line.startswith(b"-ERR"):
                raise NatsError(line.decode())
            elif line.startswith((b"MSG ", b"HMSG ")):
                parts = line.decode().split()
                reply = parts[3] if len(parts) == (5 if parts[0] == "MSG" else 6) else ""
                if parts[0] == "MSG":
                    return Message(parts[1], reply, data=self._bytes(int(parts[-1])))
                hlen, total = int(parts[-2]), int(parts[-1])
                raw = self._bytes(total)
                status, headers = parse_headers(raw[:hlen])
                return Message(parts[1], reply, headers, raw[hlen:], status)

    def _publish(self, subject: str, reply: str, payload: bytes) -> None:
        self._send(f"PUB {subject} {reply} {len(payload)}\r\n".encode() + payload + b"\r\n")

    def request(self, subject: str, payload: bytes = b"", timeout: float = 5.0) -> Message:
        reply = f"{self.inbox}.{next(self.seq)}"
        self._publish(subject, reply, payload)
        self.sock.settimeout(timeout)
        try:
            while True:
                m = self._next()
                if isinstance(m, Message) and m.subject == reply:
                    if m.status == "503":
                        raise NatsError(f"no responders for {subject} (is JetStream enabled?)")
                    return m
        except socket.timeout:
            raise NatsError(f"no reply to {subject} within {timeout} s") from None

    def api(self, subject: str, body: dict | None = None) -> dict:
        reply = json.loads(self.request(f"$JS.API.{subject}", json.dumps(body or {}).encode()).data)
        if "error" in reply:
            raise NatsError(f"{subject}: {reply['error']}")
        return reply

    # -- JetStream ------------------------------------------------------------
    def create_stream(self, name: str, subjects: list, duplicate_window_s: float = 300) -> dict:
        """`nats stream add NAME --subjects ... --dupe-window 5m`."""
        return self.api(f"STREAM.CREATE.{name}", {
            "name": name, "subjects": subjects, "storage": "file", "num_replicas": 1,
            "duplicate_window": int(duplicate_window_s * 1e9)})

    def stream_info(self, name: str) -> dict:
        return self.api(f"STREAM.INFO.{name}")

    def create_durable(self, stream: str, name: str) -> dict:
        """A durable pull consumer that reads the stream from its start and
        needs an explicit ack for each message (`nats consumer add --pull`)."""
        return self.api(f"CONSUMER.DURABLE.CREATE.{stream}.{name}", {
            "stream_name": stream,
            "config": {"durable_name": name, "ack_policy": "explicit", "deliver_policy": "all",
                       "ack_wait": int(30e9), "max_ack_pending": 1000}})

    def fetch(self, stream: str, consumer: str, batch: int = 100) -> list:
        """Up to `batch` messages the consumer has not had acknowledged; none
        when there are none now (no waiting)."""
        reply = f"{self.inbox}.{next(self.seq)}"
        self._publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}", reply,
                      json.dumps({"batch": batch, "no_wait": True}).encode())
        out = []
        while len(out) < batch:
            m = self._next()
            if not isinstance(m, Message):
                continue
            if m.subject == reply and m.status:   # 404 no messages, 408 expired: the batch is done
                break
            # JetStream hands the message to our inbox under its stream
            # subject; its reply subject is where the ack goes.
            if m.reply.startswith(f"$JS.ACK.{stream}.{consumer}."):
                out.append(m)
        return out

    def ack(self, m: Message) -> None:
        """Acknowledge and wait for JetStream to confirm it recorded the ack,
        so a restarted consumer does not get the message again."""
        self.request(m.reply, b"+ACK")
