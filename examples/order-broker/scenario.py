#!/usr/bin/python3
"""The order-broker example, step by step: orders created with their
OrderCreated event in one transaction, delivered by outboxd to a NATS
JetStream stream, read in order per order by a durable consumer.

Run it with run.sh (a throwaway PostgreSQL and nats-server). It needs a
database of its own (it installs the outbox with `outboxd migrate`, and
shop.sql) and a nats-server with JetStream (it creates the ORDERS stream and
the consumer "billing").

Steps, each printed as it happens:
  1. orders placed and paid, each call its own transaction, while no relay
     runs; two requests are retried by their client: the same event ids
     come back and nothing is added;
  2. outboxd starts and drains the backlog into the stream (many orders at
     once, one order's events one at a time); the consumer reads them;
  3. the same requests retried again after their events were delivered,
     and one more order: only the new order's events reach the stream, and
     the restarted consumer gets only those;
  4. the check: every order's events in the stream once each, in order,
     each processed once by the consumer.
Exit status 0 when the check passes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg2

from nats_client import Client, NatsError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONFIG_URL = "nats://127.0.0.1:4226"    # the server's address in outboxd.toml
STREAM, SUBJECTS, DURABLE = "ORDERS", ["shop.orders.>"], "billing"


def say(text: str = "") -> None:
    print(text, flush=True)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f} s: {what}")
        time.sleep(interval)


class Scenario:
    def __init__(self, args):
        self.args = args
        self.dir = Path(args.workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, DATABASE_URL=args.database_url)
        self.relay = None
        self.db = None
        self.nats = None
        self.events: dict[str, dict[str, int]] = {}   # order id -> event type -> event id
        self.retries: list = []                       # (call, first id, id on retry)

    def outboxd(self, *args: str) -> str:
        p = subprocess.run([self.args.outboxd, *args, "--config", str(self.config)], env=self.env,
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise RuntimeError(f"outboxd {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
        return p.stdout

    def install(self) -> None:
        text = (HERE / "outboxd.toml").read_text()
        assert CONFIG_URL in text, f"{CONFIG_URL} not found in outboxd.toml"
        self.config = self.dir / "outboxd.toml"
        self.config.write_text(text.replace(CONFIG_URL, self.args.nats_url))
        self.outboxd("migrate")
        subprocess.run(["psql", self.args.database_url, "-q", "-1", "-v", "ON_ERROR_STOP=1",
                        "-f", self.args.shop_sql], check=True, timeout=30)
        self.db = psycopg2.connect(self.args.database_url)
        self.db.autocommit = True   # each call below is its own transaction, as in an API
        self.nats = Client(self.args.nats_url)
        self.nats.create_stream(STREAM, SUBJECTS)
        self.nats.create_durable(STREAM, DURABLE)

    def call(self, function: str, *args) -> int:
        with self.db.cursor() as cur:
            cur.execute(f"SELECT shop.{function}({', '.join(['%s'] * len(args))})", args)
            return cur.fetchone()[0]

    def place(self, order_id: str, customer: str, total_cents: int) -> None:
        self.events.setdefault(order_id, {})["OrderCreated"] = self.call("place_order", order_id, customer,
                                                                         total_cents)

    def pay(self, order_id: str) -> None:
        self.events[order_id]["OrderPaid"] = self.call("pay_order", order_id)

    def retry(self, function: str, order_id: str, *args) -> None:
        kind = "OrderCreated" if function == "place_order" else "OrderPaid"
        again = self.call(function, order_id, *args)
        self.retries.append((f"{function}({order_id!r})", self.events[order_id][kind], again))
        say(f"   {function}({order_id!r}) retried: event {again} "
            f"({'the same' if again == self.events[order_id][kind] else 'A NEW ONE'})")

    def outbox_count(self) -> int:
        with self.db.cursor() as cur:
            cur.execute("SELECT count(*) FROM outbox.events")
            return cur.fetchone()[0]

    def start_relay(self) -> None:
        log = open(self.dir / "outboxd.log", "ab")
        self.relay = subprocess.Popen([self.args.outboxd, "run", "--config", str(self.config)], env=self.env,
                                      stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()

    def drained(self) -> bool:
        if self.relay.poll() is not None:
            raise RuntimeError(f"outboxd run exited {self.relay.returncode}; see {self.dir}/outboxd.log")
        return self.outbox_count() == 0

    def consume(self) -> list:
        """Runs the billing consumer over what is in the stream; its log lines of this run."""
        log = self.dir / "billing.jsonl"
        before = len(log.read_text().splitlines()) if log.exists() else 0
        p = subprocess.run([sys.executable, str(HERE / "order_consumer.py"), "--nats-url", self.args.nats_url,
                            "--durable", DURABLE, "--state", str(self.dir / "billing-state.json"),
                            "--log", str(log)], capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"order_consumer.py exited {p.returncode}: {p.stderr.strip()}")
        return [json.loads(ln) for ln in log.read_text().splitlines()[before:]]

    def run(self) -> bool:
        self.install()
        t = self.args.timeout

        say("1. Orders placed and paid, no relay running yet")
        customers = ["ada", "grace", "alan", "edsger", "barbara", "donald", "margaret", "ken"]
        for i, who in enumerate(customers):
            self.place(f"ord-{1001 + i}", who, 1000 + 250 * i)
            if i >= 2:   # pay an earlier order between placements: the orders' events interleave
                self.pay(f"ord-{999 + i}")
        say(f"   {len(self.events)} orders, {sum(map(len, self.events.values()))} events in the outbox")
        say("   the client retries two requests (it lost the answers):")
        self.retry("place_order", "ord-1002", "grace", 1250)
        self.retry("pay_order", "ord-1003")
        say(f"   events in the outbox: {self.outbox_count()}")

        say("\n2. outboxd starts; the backlog goes to the stream; the consumer reads it")
        self.start_relay()
        wait_until(self.drained, t, "outboxd drained the outbox into the stream")
        first = self.consume()
        say(f"   the stream holds {self.nats.stream_info(STREAM)['state']['messages']} messages; "
            f"the consumer processed {len(first)}")
        for order_id in sorted(self.events):
            seen = [m["type"] for m in first if m["order_id"] == order_id]
            say(f"   {order_id}: {' -> '.join(seen)}")

        say("\n3. Retried again after delivery, and one more order")
        self.retry("place_order", "ord-1001", "ada", 1000)
        self.retry("pay_order", "ord-1001")
        self.place("ord-1009", "niklaus", 3000)
        self.pay("ord-1009")
        wait_until(self.drained, t, "outboxd delivered the new order")
        second = self.consume()
        say(f"   the restarted consumer got {len(second)} messages: "
            f"{', '.join(m['order_id'] + ' ' + m['type'] for m in second)}")

        say("\n4. The check")
        messages = first + second
        want = {o: [k for k in ("OrderCreated", "OrderPaid") if k in ev] for o, ev in self.events.items()}
        got = {o: [m["type"] for m in messages if m["order_id"] == o] for o in want}
        wrong = {o: got[o] for o in want if got[o] != want[o]}
        bad = [m for m in messages if m["result"] != "applied"]
        ids = [m["msg_id"] for m in messages]
        stored = self.nats.stream_info(STREAM)["state"]["messages"]
        n_events = sum(map(len, want.values()))
        retried_anew = [c for c, a, b in self.retries if a != b]
        say(f"   events committed {n_events}, in the stream {stored}, processed by the consumer "
            f"{len(messages)} ({len(set(ids))} distinct Nats-Msg-Id)")
        say(f"   orders whose events did not arrive once each, in order: {wrong or 'none'}")
        say(f"   messages not applied (duplicate or out of order): {len(bad)}")
        say(f"   retried requests that made a new event: {retried_anew or 'none'}")
        ok = not wrong and not bad and stored == n_events == len(messages) == len(set(ids)) \
            and not retried_anew and [m["order_id"] for m in second] == ["ord-1009"] * 2
        (self.dir / "summary.json").write_text(json.dumps(
            {"events": self.events, "retries": self.retries, "first_run": len(first),
             "second_run": len(second)}, indent=1))
        return ok

    def close(self) -> int | None:
        status = None
        if self.relay is not None and self.relay.poll() is None:
            self.relay.send_signal(signal.SIGTERM)
            try:
                status = self.relay.wait(20)
            except subprocess.TimeoutExpired:
                self.relay.kill()
                self.relay.wait()
        if self.db is not None:
            self.db.close()
        if self.nats is not None:
            self.nats.close()
        return status


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    p.add_argument("--nats-url", required=True, help="a nats-server with JetStream enabled")
    p.add_argument("--outboxd", default=str(ROOT / "build" / "outboxd"))
    p.add_argument("--shop-sql", default=str(HERE / "shop.sql"))
    p.add_argument("--workdir", required=True, help="where the logs go")
    p.add_argument("--timeout", type=float, default=20.0, help="deadline of each wait, seconds (default 20)")
    args = p.parse_args()
    if not args.database_url:
        p.error("no database: set DATABASE_URL or pass --database-url")
    s = Scenario(args)
    ok = False
    try:
        ok = s.run()
    except (RuntimeError, TimeoutError, OSError, NatsError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(f"scenario.py: {e}", file=sys.stderr)
    finally:
        status = s.close()
    if status not in (0, None):
        print(f"outboxd run exited {status} after SIGTERM (expected 0)", file=sys.stderr)
        ok = False
    say("\nOK: every order's events in the stream once, in order" if ok else "\nFAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
