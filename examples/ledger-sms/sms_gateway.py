#!/usr/bin/python3
"""A stand-in for an SMS gateway, the consumer of the ledger-sms example.

It receives outboxd's webhooks (POST, JSON body {"deposit_id", "to", "text"})
and "sends" each text by appending it to STATE/sent.jsonl. Like a real
gateway it misbehaves now and then, on purpose and predictably:

  * every --flaky-every'th new message is answered 503 on its first two
    attempts (outboxd retries it with backoff);
  * every --lose-answer-every'th new message is sent, and then the connection
    is closed without an answer, as when a response is lost on the way
    (outboxd sends it again: the gateway must not send the text twice);
  * a number listed in STATE/blocked.txt is refused with 422, which the
    example's outboxd.toml lists as permanent: a dead letter at once;
  * it goes down for a while when it is stopped (the example stops it and
    starts it again).

It de-duplicates on the webhook-id header: an id it has sent a text for is
answered 200 and sent nothing. The ids are kept in sent.jsonl, so they
survive a restart. (Here recording and sending are one write; a real gateway
records the id in the same transaction as it queues the text, see
sql/inbox/0001_inbox.sql and the order-webhook example.)

Every request is logged to STATE/requests.jsonl with its arrival time
(CLOCK_MONOTONIC), webhook-id, outbox-attempt and what was done.

    sms_gateway.py --port 8025 --state /tmp/sms
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


class Gateway(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, state: Path, flaky_every: int, lose_answer_every: int):
        self.state = state
        self.flaky_every = flaky_every
        self.lose_answer_every = lose_answer_every
        self.lock = threading.Lock()
        self.sent_path = state / "sent.jsonl"
        self.requests_path = state / "requests.jsonl"
        self.blocked_path = state / "blocked.txt"
        # webhook-id -> its text was sent. Loaded from disk: a restart
        # forgets nothing it has sent.
        self.sent: set[str] = set()
        if self.sent_path.exists():
            for line in self.sent_path.read_text().splitlines():
                if line.strip():
                    self.sent.add(json.loads(line)["webhook_id"])
        # webhook-id -> (its number among the messages this process has
        # seen, requests of it so far): decides the faults.
        self.seen: dict[str, list[int]] = {}
        super().__init__(("127.0.0.1", port), Handler)

    def blocked(self) -> set[str]:
        # Read on every request, so unblocking a number needs no restart.
        if not self.blocked_path.exists():
            return set()
        return {ln.strip() for ln in self.blocked_path.read_text().splitlines() if ln.strip()}

    @staticmethod
    def append(path: Path, record: dict) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive, as outboxd's connection pool expects
    disable_nagle_algorithm = True

    def log_message(self, format, *args):  # noqa: A002 - quiet; requests.jsonl is the log
        pass

    def do_POST(self):  # noqa: N802 - http.server's naming
        gw: Gateway = self.server
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        webhook_id = self.headers.get("webhook-id")
        try:
            msg = json.loads(body)
            to, text = msg["to"], msg["text"]
        except (ValueError, KeyError, TypeError):
            return self.answer(400, {"error": "expected JSON with to and text"})
        if not webhook_id:
            return self.answer(400, {"error": "webhook-id missing"})

        with gw.lock:
            seen = gw.seen.setdefault(webhook_id, [len(gw.seen) + 1, 0])
            seen[1] += 1
            number, tries = seen
            lose_answer = False
            if to in gw.blocked():
                status, result = 422, "refused: number blocked"
            elif webhook_id in gw.sent:
                status, result = 200, "duplicate: not sent again"
            elif number % gw.flaky_every == 0 and tries <= 2:
                status, result = 503, "failed: gateway busy"
            else:
                gw.append(gw.sent_path, {"webhook_id": webhook_id, "deposit_id": msg.get("deposit_id"),
                                         "attempt": int(self.headers.get("outbox-attempt", 0)),
                                         "to": to, "text": text})
                gw.sent.add(webhook_id)
                status, result = 200, "sent"
                if number % gw.lose_answer_every == 0 and tries == 1:
                    lose_answer, result = True, "sent, answer lost"
            gw.append(gw.requests_path, {
                "t": time.monotonic(), "webhook_id": webhook_id, "deposit_id": msg.get("deposit_id"),
                "attempt": int(self.headers.get("outbox-attempt", 0)), "status": None if lose_answer else status,
                "result": result})

        if lose_answer:
            self.close_connection = True   # no answer: outboxd sees the connection close
            return
        self.answer(status, {"result": result})

    def answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8025)
    p.add_argument("--state", required=True, help="directory for sent.jsonl, requests.jsonl, blocked.txt")
    p.add_argument("--flaky-every", type=int, default=4, help="every Nth new message fails twice (default 4)")
    p.add_argument("--lose-answer-every", type=int, default=5,
                   help="every Nth new message loses its answer (default 5)")
    args = p.parse_args()
    state = Path(args.state)
    state.mkdir(parents=True, exist_ok=True)
    gw = Gateway(args.port, state, args.flaky_every, args.lose_answer_every)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"sms-gateway listening on http://127.0.0.1:{gw.server_address[1]}/sms", flush=True)
    try:
        gw.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
