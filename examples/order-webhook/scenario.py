#!/usr/bin/python3
"""The order-webhook example, step by step: orders placed with their
order.placed event in one transaction, delivered by outboxd as signed
webhooks to a warehouse that applies each event once (the inbox).

Run it with run.sh (a throwaway PostgreSQL). It needs two databases of its
own, the shop's and the warehouse's: it installs the outbox (`outboxd
migrate`) and shop.sql into the first, the inbox (sql/inbox/0001_inbox.sql)
and warehouse.sql into the second.

Steps, each printed as it happens:
  1. the warehouse dies after committing an order's picks, before answering:
     outboxd sends the order again to the restarted warehouse, which
     recognises it and changes nothing;
  2. the warehouse answers too late (outboxd gave up waiting and sends it
     again while the first answer is still on its way): applied once;
  3. a few more orders, delivered as usual;
  4. forged requests (wrong secret, a stale timestamp) refused with 401;
  5. the check: every order's picks exactly once, stock reserved exactly once.
Exit status 0 when the check passes.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg2

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONFIG_PORT = "127.0.0.1:8026"      # the warehouse's address in outboxd.toml
CRASH_EXIT = 70                     # warehouse_service.py --crash-after-commit
SLOW_ANSWER_S = 1.5                 # longer than request_timeout in outboxd.toml


def say(text: str = "") -> None:
    print(text, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f} s: {what}")
        time.sleep(interval)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret[len("whsec_"):])
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


class Scenario:
    def __init__(self, args):
        self.args = args
        self.dir = Path(args.workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        # Made here for the example; in production it comes from your secret store.
        self.secret = os.environ.get("WAREHOUSE_WEBHOOK_SECRET") or \
            "whsec_" + base64.b64encode(os.urandom(32)).decode()
        self.env = dict(os.environ, DATABASE_URL=args.shop_url, WAREHOUSE_WEBHOOK_SECRET=self.secret)
        self.port = free_port()
        self.service = None
        self.relay = None
        self.shop = None
        self.warehouse = None
        self.orders: dict[int, list] = {}   # order id -> lines
        self.log_path = self.dir / "warehouse.jsonl"

    def outboxd(self, *args: str) -> str:
        p = subprocess.run([self.args.outboxd, *args, "--config", str(self.config)], env=self.env,
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise RuntimeError(f"outboxd {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
        return p.stdout

    @staticmethod
    def psql(url: str, path: Path, *variables: str) -> None:
        argv = ["psql", url, "-q", "-1", "-v", "ON_ERROR_STOP=1"]
        for v in variables:
            argv += ["-v", v]
        subprocess.run(argv + ["-f", str(path)], check=True, timeout=30)

    def install(self) -> None:
        text = (HERE / "outboxd.toml").read_text()
        assert CONFIG_PORT in text, f"{CONFIG_PORT} not found in outboxd.toml"
        self.config = self.dir / "outboxd.toml"
        self.config.write_text(text.replace(CONFIG_PORT, f"127.0.0.1:{self.port}"))
        self.outboxd("migrate")
        self.psql(self.args.shop_url, HERE / "shop.sql")
        self.psql(self.args.warehouse_url, Path(self.args.inbox_sql), "schema=inbox")
        self.psql(self.args.warehouse_url, HERE / "warehouse.sql")
        self.shop = psycopg2.connect(self.args.shop_url)
        self.warehouse = psycopg2.connect(self.args.warehouse_url)

    def start_service(self, *faults: str) -> None:
        out = open(self.dir / "warehouse.out", "ab")
        self.service = subprocess.Popen(
            [sys.executable, str(HERE / "warehouse_service.py"), "--port", str(self.port),
             "--database-url", self.args.warehouse_url, "--log", str(self.log_path), *faults],
            env=self.env, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        out.close()

        def listening():
            if self.service.poll() is not None:
                raise RuntimeError(f"warehouse_service.py exited {self.service.returncode}; "
                                   f"see {self.dir}/warehouse.out")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_until(listening, 10, "the warehouse listens")

    def start_relay(self) -> None:
        log = open(self.dir / "outboxd.log", "ab")
        self.relay = subprocess.Popen([self.args.outboxd, "run", "--config", str(self.config)], env=self.env,
                                      stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()

    def check_relay(self) -> None:
        if self.relay.poll() is not None:
            raise RuntimeError(f"outboxd run exited {self.relay.returncode}; see {self.dir}/outboxd.log")

    def place_order(self, customer: str, lines: list) -> int:
        """What the shop's checkout does: one transaction."""
        with self.shop, self.shop.cursor() as cur:
            cur.execute("SELECT shop.place_order(%s, %s)", (customer, json.dumps(lines)))
            order_id = cur.fetchone()[0]
        self.orders[order_id] = lines
        return order_id

    @staticmethod
    def query(conn, statement: str, args=None) -> list:
        with conn, conn.cursor() as cur:
            cur.execute(statement, args)
            return cur.fetchall()

    def in_outbox(self, order_id: int) -> bool:
        return bool(self.query(self.shop, "SELECT 1 FROM outbox.events WHERE payload->>'order_id' = %s",
                               (str(order_id),)))

    def picks(self, order_id: int) -> int:
        return self.query(self.warehouse, "SELECT count(*) FROM warehouse.picks WHERE order_id = %s",
                          (order_id,))[0][0]

    def log(self) -> list[dict]:
        if not self.log_path.exists():
            return []
        return [json.loads(ln) for ln in self.log_path.read_text().splitlines() if ln.strip()]

    def show_log(self, order_id: int) -> None:
        for r in self.log():
            if r.get("order_id") == order_id:
                say(f"   | warehouse pid {r['pid']}: {r['webhook_id']} attempt {r['attempt']}: {r['result']}")

    def delivered(self, order_id: int) -> bool:
        self.check_relay()
        return not self.in_outbox(order_id)

    def run(self) -> bool:
        a = self.args
        self.install()
        self.start_service("--crash-after-commit")
        self.start_relay()
        say(f"warehouse    http://127.0.0.1:{self.port}/webhooks/orders   (files in {self.dir})")
        say(f"outboxd      pid {self.relay.pid}, log {self.dir}/outboxd.log\n")

        say("1. The warehouse dies between committing an order and answering")
        first = self.place_order("ada", [{"sku": "mug", "qty": 2}, {"sku": "tee", "qty": 1}])
        say(f"   shop.place_order -> order {first}")
        crashed = self.service.wait(a.timeout)
        picks_at_crash = self.picks(first)
        still_owed = self.in_outbox(first)
        say(f"   warehouse exited {crashed} after its commit: {picks_at_crash} picks of order {first} committed, "
            f"event still in the outbox: {still_owed}")
        self.start_service("--slow-answer", str(SLOW_ANSWER_S))
        say("   warehouse restarted")
        wait_until(lambda: self.delivered(first), a.timeout, f"order {first} delivered")
        self.show_log(first)
        ok = crashed == CRASH_EXIT and picks_at_crash == 2 and still_owed

        say(f"\n2. The warehouse answers {SLOW_ANSWER_S} s late; outboxd gave up after 1 s and sends it again")
        second = self.place_order("grace", [{"sku": "cap", "qty": 3}])
        say(f"   shop.place_order -> order {second}")
        wait_until(lambda: self.delivered(second), a.timeout, f"order {second} delivered")
        self.show_log(second)

        say("\n3. More orders")
        batch = [self.place_order(c, lines) for c, lines in [
            ("linus", [{"sku": "tee", "qty": 2}]),
            ("barbara", [{"sku": "mug", "qty": 1}, {"sku": "cap", "qty": 1}]),
            ("ken", [{"sku": "mug", "qty": 4}])]]
        wait_until(lambda: all(self.delivered(o) for o in batch), a.timeout, "the orders delivered")
        say(f"   orders {', '.join(map(str, batch))} delivered")

        say("\n4. Forged requests")
        body = json.dumps({"order_id": 999, "customer": "mallory", "lines": [{"sku": "mug", "qty": 50}]}).encode()
        now = int(time.time())
        wrong = "whsec_" + base64.b64encode(os.urandom(32)).decode()
        forged = [("signed with another secret", "msg_forged_1", now, sign(wrong, "msg_forged_1", now, body)),
                  ("a captured request replayed 10 minutes later", "msg_forged_2", now - 600,
                   sign(self.secret, "msg_forged_2", now - 600, body))]
        refused = 0
        for what, msg_id, ts, signature in forged:
            req = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/webhooks/orders", data=body, method="POST",
                headers={"content-type": "application/json", "webhook-id": msg_id,
                         "webhook-timestamp": str(ts), "webhook-signature": signature})
            try:
                status = urllib.request.urlopen(req, timeout=10).status
            except urllib.error.HTTPError as e:
                status = e.code
            refused += status == 401
            say(f"   {what}: HTTP {status}")
        ok = ok and refused == len(forged)

        say("\n5. The check")
        wrong_picks = {o: self.picks(o) for o in self.orders if self.picks(o) != len(self.orders[o])}
        want_reserved: dict[str, int] = {}
        for lines in self.orders.values():
            for line in lines:
                want_reserved[line["sku"]] = want_reserved.get(line["sku"], 0) + line["qty"]
        reserved = dict(self.query(self.warehouse, "SELECT sku, reserved FROM warehouse.stock WHERE reserved > 0"))
        received = self.query(self.warehouse, "SELECT count(*) FROM inbox.received_messages")[0][0]
        duplicates = sum(1 for r in self.log() if r["result"] == "duplicate")
        stray = self.picks(999)
        [(events, dead)] = self.query(self.shop, "SELECT (SELECT count(*) FROM outbox.events), "
                                                 "(SELECT count(*) FROM outbox.dead_letters)")
        say(f"   orders placed {len(self.orders)}, applied in the warehouse {received}, "
            f"deliveries recognised as repeats {duplicates}")
        say(f"   orders whose picks are not there exactly once: {wrong_picks or 'none'}")
        say(f"   stock reserved {reserved}, expected {want_reserved}")
        say(f"   forged order applied: {'yes' if stray else 'no'}; left in the outbox: {events} events, "
            f"{dead} dead letters")
        ok = ok and not wrong_picks and reserved == want_reserved and received == len(self.orders) \
            and duplicates >= 2 and not stray and events == 0 and dead == 0
        (self.dir / "summary.json").write_text(json.dumps(
            {"orders": self.orders, "crashed_order": first, "slow_order": second, "crash_exit": crashed,
             "picks_at_crash": picks_at_crash, "port": self.port}, indent=1))
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
        if self.service is not None and self.service.poll() is None:
            self.service.send_signal(signal.SIGTERM)
            self.service.wait(10)
        for c in (self.shop, self.warehouse):
            if c is not None:
                c.close()
        return status


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shop-url", required=True, help="the shop's database (gets the outbox)")
    p.add_argument("--warehouse-url", required=True, help="the warehouse's database (gets the inbox)")
    p.add_argument("--outboxd", default=str(ROOT / "build" / "outboxd"))
    p.add_argument("--inbox-sql", default=str(ROOT / "sql" / "inbox" / "0001_inbox.sql"))
    p.add_argument("--workdir", required=True, help="where the logs go")
    p.add_argument("--timeout", type=float, default=20.0, help="deadline of each wait, seconds (default 20)")
    args = p.parse_args()
    s = Scenario(args)
    ok = False
    try:
        ok = s.run()
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(f"scenario.py: {e}", file=sys.stderr)
    finally:
        status = s.close()
    if status not in (0, None):
        print(f"outboxd run exited {status} after SIGTERM (expected 0)", file=sys.stderr)
        ok = False
    say("\nOK: every order applied exactly once" if ok else "\nFAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
