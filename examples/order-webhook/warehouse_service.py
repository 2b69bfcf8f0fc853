#!/usr/bin/python3
"""The warehouse: an idempotent webhook consumer, the receiving side of the
order-webhook example.

POST /webhooks/orders with an order.placed event from outboxd:
  1. verify the Standard Webhooks signature (webhook-id, webhook-timestamp,
     webhook-signature; HMAC-SHA256 with the secret in
     WAREHOUSE_WEBHOOK_SECRET) and refuse anything else with 401;
  2. in ONE transaction of its own database: inbox.receive(webhook-id) and,
     only when that says the id is new, the change the event asks for
     (a pick per order line, stock reserved);
  3. answer 200 after the commit, whether applied now or before.
So an event delivered again (outboxd delivers at least once) is applied
once, also when this process dies between its commit and its answer.

Each request is logged as one JSON line to --log (result: applied,
duplicate, rejected, error).

Faults, to show the point (each once, on the first event this process applies):
  --crash-after-commit      exit(70) after the commit, before answering
  --slow-answer SECONDS     answer that much later (after outboxd gave up)

    WAREHOUSE_WEBHOOK_SECRET=whsec_... warehouse_service.py \\
        --port 8026 --database-url postgresql://.../warehouse --log requests.jsonl
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import http.server
import json
import os
import signal
import sys
import threading
import time

import psycopg2
import psycopg2.pool

# Standard Webhooks: refuse timestamps further than this from now, so a
# captured request cannot be replayed later.
TIMESTAMP_TOLERANCE_S = 300


class BadSignature(Exception):
    pass


def parse_secrets(text: str) -> list[bytes]:
    """Space-separated whsec_<base64> secrets (several during a key rotation)."""
    keys = []
    for s in text.split():
        if not s.startswith("whsec_"):
            raise ValueError("a signing secret starts with whsec_")
        keys.append(base64.b64decode(s[len("whsec_"):], validate=True))
    if not keys:
        raise ValueError("no signing secret")
    return keys


def verify(keys: list[bytes], headers, body: bytes, now: float) -> str:
    """Check a Standard Webhooks signature; returns the webhook-id."""
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        raise BadSignature("webhook-id, webhook-timestamp or webhook-signature missing")
    try:
        ts = int(timestamp)
    except ValueError:
        raise BadSignature("webhook-timestamp is not a number") from None
    if abs(now - ts) > TIMESTAMP_TOLERANCE_S:
        raise BadSignature("webhook-timestamp too far from now")
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = [base64.b64encode(hmac.new(k, signed, hashlib.sha256).digest()) for k in keys]
    # One "v1,<base64>" per secret the sender signs with, space-separated.
    for sig in signatures.split():
        version, _, value = sig.partition(",")
        if version == "v1" and any(hmac.compare_digest(value.encode(), e) for e in expected):
            return msg_id
    raise BadSignature("no valid signature")


def apply_order(cur, order: dict, msg_id: str) -> None:
    """The warehouse's own change for an order.placed event."""
    for line in order["lines"]:
        cur.execute("INSERT INTO warehouse.picks (order_id, sku, qty, message_id) VALUES (%s, %s, %s, %s)",
                    (order["order_id"], line["sku"], line["qty"], msg_id))
        cur.execute("UPDATE warehouse.stock SET reserved = reserved + %s WHERE sku = %s",
                    (line["qty"], line["sku"]))


class Service(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, args, keys: list[bytes]):
        self.keys = keys
        self.pool = psycopg2.pool.ThreadedConnectionPool(1, 8, args.database_url)
        self.log_path = args.log
        self.lock = threading.Lock()
        self.crash_after_commit = args.crash_after_commit
        self.slow_answer = args.slow_answer
        super().__init__(("127.0.0.1", args.port), Handler)

    def log(self, record: dict) -> None:
        with self.lock, open(self.log_path, "a") as f:
            f.write(json.dumps(dict(record, t=time.monotonic(), pid=os.getpid())) + "\n")

    def take_fault(self) -> str | None:
        """The fault to act out now, if one is still armed (each fires once)."""
        with self.lock:
            if self.crash_after_commit:
                self.crash_after_commit = False
                return "crash"
            if self.slow_answer:
                delay, self.slow_answer = self.slow_answer, None
                return f"slow:{delay}"
        return None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format, *args):  # noqa: A002 - the JSON log is enough
        pass

    def do_POST(self):  # noqa: N802
        svc: Service = self.server
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        attempt = self.headers.get("outbox-attempt")
        try:
            msg_id = verify(svc.keys, self.headers, body, time.time())
            order = json.loads(body)
        except (BadSignature, ValueError) as e:
            svc.log({"result": "rejected", "why": str(e), "webhook_id": self.headers.get("webhook-id")})
            return self.answer(401, {"error": "invalid signature"})

        conn = svc.pool.getconn()
        try:
            with conn, conn.cursor() as cur:   # one transaction: commit, or roll back on error
                cur.execute("SELECT inbox.receive(%s, %s)", (msg_id, self.headers.get("outbox-topic")))
                first = cur.fetchone()[0]
                if first:
                    apply_order(cur, order, msg_id)
        except psycopg2.Error as e:
            svc.log({"result": "error", "webhook_id": msg_id, "attempt": attempt, "why": str(e).strip()})
            return self.answer(500, {"error": "not applied; send it again"})
        finally:
            svc.pool.putconn(conn)

        svc.log({"result": "applied" if first else "duplicate", "webhook_id": msg_id, "attempt": attempt,
                 "order_id": order.get("order_id")})
        fault = svc.take_fault() if first else None
        if fault == "crash":
            os._exit(70)   # committed, never answered: outboxd will send it again
        if fault and fault.startswith("slow:"):
            time.sleep(float(fault[5:]))
        self.answer(200, {"applied": first})

    def answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8026)
    p.add_argument("--database-url", required=True, help="the warehouse's database (with the inbox)")
    p.add_argument("--log", required=True, help="JSON lines, one per request")
    p.add_argument("--crash-after-commit", action="store_true")
    p.add_argument("--slow-answer", type=float, metavar="SECONDS")
    args = p.parse_args()
    try:
        keys = parse_secrets(os.environ.get("WAREHOUSE_WEBHOOK_SECRET", ""))
    except ValueError as e:   # never print the secret itself
        sys.exit(f"warehouse_service.py: WAREHOUSE_WEBHOOK_SECRET: {e}")
    svc = Service(args, keys)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"warehouse listening on http://127.0.0.1:{svc.server_address[1]}/webhooks/orders", flush=True)
    try:
        svc.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
