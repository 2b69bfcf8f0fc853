#!/usr/bin/python3
"""The ledger-sms example, step by step: deposits posted with their SMS in one
transaction, delivered by outboxd to a flaky SMS gateway that also goes down.

Run it with run.sh (a throwaway PostgreSQL). It needs a database of its own:
it installs the outbox (`outboxd migrate`) and ledger.sql into it.

Steps, each printed as it happens:
  1. a deposit request sent twice (a client retry) posts once, one SMS;
  2. more deposits, the gateway failing now and then: the backoff at work,
     and a text to a number the gateway refuses parked as a dead letter;
  3. the gateway down for a few seconds while deposits are posted: retried
     until it is back, none lost;
  4. the refused number fixed at the gateway, the dead letter replayed;
  5. the check: every deposit's text sent exactly once, outbox empty.
Exit status 0 when the check passes. STATE (--workdir) keeps the gateway's
files, the relay's log and summary.json for a look afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg2

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONFIG_PORT = "127.0.0.1:8025"      # the gateway's address in outboxd.toml
ACCOUNTS = [(1, "Ada", "+15550101"), (2, "Grace", "+15550102"), (3, "Linus", "+15550103")]
BLOCKED_PHONE = "+15550103"         # the gateway refuses texts to it (422) until step 4
OUTAGE_S = 3.0


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


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


class Scenario:
    def __init__(self, args):
        self.args = args
        self.dir = Path(args.workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, DATABASE_URL=args.database_url)
        self.port = free_port()
        self.gateway = None
        self.relay = None
        self.conn = None
        self.deposits: dict[str, int] = {}   # deposit id -> SMS event id
        self.summary: dict = {}

    # -- the parts a user has: the binary, its config, psql ---------------
    def outboxd(self, *args: str) -> str:
        p = subprocess.run([self.args.outboxd, *args, "--config", str(self.config)], env=self.env,
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise RuntimeError(f"outboxd {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
        return p.stdout

    def install(self) -> None:
        # outboxd.toml with the port the gateway got.
        text = (HERE / "outboxd.toml").read_text()
        assert CONFIG_PORT in text, f"{CONFIG_PORT} not found in outboxd.toml"
        self.config = self.dir / "outboxd.toml"
        self.config.write_text(text.replace(CONFIG_PORT, f"127.0.0.1:{self.port}"))
        self.outboxd("migrate")
        subprocess.run(["psql", self.args.database_url, "-q", "-1", "-v", "ON_ERROR_STOP=1",
                        "-f", str(HERE / "ledger.sql")], check=True, timeout=30)
        self.conn = psycopg2.connect(self.args.database_url)
        with self.conn, self.conn.cursor() as cur:
            cur.executemany("INSERT INTO ledger.accounts (id, holder, phone) VALUES (%s, %s, %s)", ACCOUNTS)
        (self.dir / "blocked.txt").write_text(BLOCKED_PHONE + "\n")

    def start_gateway(self) -> None:
        log = open(self.dir / "gateway.log", "ab")
        self.gateway = subprocess.Popen(
            [sys.executable, str(HERE / "sms_gateway.py"), "--port", str(self.port), "--state", str(self.dir)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()

        def listening():
            if self.gateway.poll() is not None:
                raise RuntimeError(f"sms_gateway.py exited {self.gateway.returncode}; see {self.dir}/gateway.log")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_until(listening, 10, "the SMS gateway listens")

    def stop_gateway(self) -> None:
        self.gateway.send_signal(signal.SIGTERM)
        self.gateway.wait(10)

    def start_relay(self) -> None:
        log = open(self.dir / "outboxd.log", "ab")
        self.relay = subprocess.Popen([self.args.outboxd, "run", "--config", str(self.config)], env=self.env,
                                      stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()

    def post_deposit(self, deposit_id: str, account: int, cents: int) -> int:
        """What the application's API does for one request: one transaction."""
        with self.conn, self.conn.cursor() as cur:
            cur.execute("SELECT ledger.post_deposit(%s, %s, %s)", (deposit_id, account, cents))
            event_id = cur.fetchone()[0]
        self.deposits[deposit_id] = event_id
        return event_id

    def query(self, statement: str, args=None) -> list:
        with self.conn, self.conn.cursor() as cur:
            cur.execute(statement, args)
            return cur.fetchall()

    def sent(self) -> list[dict]:
        return read_jsonl(self.dir / "sent.jsonl")

    def requests(self) -> list[dict]:
        return read_jsonl(self.dir / "requests.jsonl")

    def texts_sent_for(self, deposit_ids) -> bool:
        done = {s["deposit_id"] for s in self.sent()}
        return set(deposit_ids) <= done

    def check_relay(self) -> None:
        if self.relay.poll() is not None:
            raise RuntimeError(f"outboxd run exited {self.relay.returncode}; see {self.dir}/outboxd.log")

    def attempts_of(self, deposit_id: str) -> list[dict]:
        return [r for r in self.requests() if r["deposit_id"] == deposit_id]

    def show_attempts(self, deposit_ids) -> None:
        for d in deposit_ids:
            reqs = self.attempts_of(d)
            if not reqs:
                continue
            t0 = reqs[0]["t"]
            line = "   ".join(f"+{(r['t'] - t0) * 1000:5.0f} ms attempt {r['attempt']}: {r['result']}" for r in reqs)
            say(f"   {d}  {line}")

    # -- the story -----------------------------------------------------------
    def run(self) -> bool:
        a = self.args
        self.install()
        self.start_gateway()
        self.start_relay()
        say(f"SMS gateway  http://127.0.0.1:{self.port}/sms   (files in {self.dir})")
        say(f"outboxd      pid {self.relay.pid}, log {self.dir}/outboxd.log\n")

        say("1. A deposit request sent twice (the client retried) posts once")
        first = self.post_deposit("dep-1001", 1, 2500)
        again = self.post_deposit("dep-1001", 1, 2500)
        [(rows, balance)] = self.query("SELECT (SELECT count(*) FROM ledger.deposits), balance_cents "
                                       "FROM ledger.accounts WHERE id = 1")
        say(f"   post_deposit('dep-1001') -> event {first}, again -> event {again}; "
            f"deposits {rows}, balance {balance / 100:.2f}")
        ok = first == again and rows == 1 and balance == 2500

        say("\n2. More deposits; the gateway fails now and then, and refuses Linus's number")
        batch = [("dep-1002", 2, 1000), ("dep-1003", 1, 750), ("dep-1004", 3, 5000), ("dep-1005", 2, 120),
                 ("dep-1006", 1, 9900), ("dep-1007", 2, 4200), ("dep-1008", 1, 310)]
        for d, acct, cents in batch:
            self.post_deposit(d, acct, cents)
        blocked = [d for d, acct, _ in batch if acct == 3]
        deliverable = ["dep-1001"] + [d for d, acct, _ in batch if acct != 3]
        dead_id = self.deposits[blocked[0]]

        def settled():
            # Sent by the gateway's log, and recorded by the relay: a text the
            # gateway sent just before it goes down (step 3) may lose its
            # answer, and the relay then retries it into the outage, which
            # holds back its account's next deposit there.
            self.check_relay()
            dead = self.query("SELECT count(*) FROM outbox.dead_letters WHERE id = %s", (dead_id,))[0][0]
            left = self.query("SELECT count(*) FROM outbox.events")[0][0]
            return dead == 1 and self.texts_sent_for(deliverable) and left == 0
        wait_until(settled, a.timeout, "texts of step 2 sent and the refused one dead-lettered")
        retried = [d for d in deliverable if len(self.attempts_of(d)) > 1]
        say(f"   {len(deliverable)} texts sent; the ones that needed more than one request "
            f"(retry base 300ms, doubling):")
        self.show_attempts(retried)
        say(f"   {blocked[0]} (to {BLOCKED_PHONE}): refused with 422, a permanent status here: a dead letter")

        say(f"\n3. The gateway goes down for {OUTAGE_S:.0f} s while deposits are posted")
        self.stop_gateway()
        outage = [("dep-1009", 1, 1500), ("dep-1010", 2, 800), ("dep-1011", 1, 60), ("dep-1012", 2, 2000)]
        for d, acct, cents in outage:
            self.post_deposit(d, acct, cents)
        time.sleep(OUTAGE_S)   # the outage itself, not a wait for something
        self.check_relay()
        say("   outboxd status during the outage:")
        for line in self.outboxd("status").splitlines():
            say("   | " + line)
        self.start_gateway()
        say("   the gateway is back")
        outage_ids = [d for d, _, _ in outage]
        wait_until(lambda: self.check_relay() or self.texts_sent_for(outage_ids), a.timeout,
                   "texts posted during the outage sent")
        sent_at = {s["deposit_id"]: s["attempt"] for s in self.sent()}
        for d in outage_ids:
            say(f"   {d} sent at attempt {sent_at[d]}")
        say("   the relay's retries of them (outboxd.log):")
        wanted = {f"event_id={self.deposits[d]} " for d in outage_ids}
        for line in (self.dir / "outboxd.log").read_text(errors="replace").splitlines():
            if "will retry" in line and any(w in line + " " for w in wanted):
                say("   | " + line[line.find("event_id="):][:160])

        say("\n4. The number is fixed at the gateway; the dead letter is replayed")
        for line in self.outboxd("dead", "list").splitlines():
            say("   | " + line)
        (self.dir / "blocked.txt").write_text("")
        say(f"   $ outboxd dead replay --id {dead_id}")
        for line in self.outboxd("dead", "replay", "--id", str(dead_id)).splitlines():
            say("   | " + line)
        wait_until(lambda: self.check_relay() or self.texts_sent_for(blocked), a.timeout,
                   "the replayed text sent")
        say(f"   {blocked[0]} sent")
        # Its row leaves the outbox once outboxd has recorded the answer.
        wait_until(lambda: self.query("SELECT count(*) FROM outbox.events")[0][0] == 0, a.timeout,
                   "the outbox empty")

        say("\n5. The check")
        sent = self.sent()
        per_deposit: dict[str, int] = {}
        for s in sent:
            per_deposit[s["deposit_id"]] = per_deposit.get(s["deposit_id"], 0) + 1
        twice = {d: n for d, n in per_deposit.items() if n > 1}
        missing = sorted(set(self.deposits) - set(per_deposit))
        duplicates = sum(1 for r in self.requests() if r["result"].startswith("duplicate"))
        [(deposits, events, dead)] = self.query(
            "SELECT (SELECT count(*) FROM ledger.deposits), (SELECT count(*) FROM outbox.events), "
            "(SELECT count(*) FROM outbox.dead_letters)")
        say(f"   deposits posted {deposits}, texts sent {len(sent)}, sent twice {len(twice)}, "
            f"missing {len(missing)}")
        say(f"   repeated deliveries the gateway recognised and did not send again: {duplicates}")
        say(f"   left in the outbox: {events} events, {dead} dead letters")
        ok = ok and not twice and not missing and deposits == len(self.deposits) == len(sent) \
            and events == 0 and dead == 0
        self.summary = {"deposits": self.deposits, "blocked": blocked, "dead_event_id": dead_id,
                        "outage": outage_ids, "port": self.port}
        (self.dir / "summary.json").write_text(json.dumps(self.summary, indent=1))
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
        if self.gateway is not None and self.gateway.poll() is None:
            self.stop_gateway()
        if self.conn is not None:
            self.conn.close()
        return status


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    p.add_argument("--outboxd", default=str(ROOT / "build" / "outboxd"))
    p.add_argument("--workdir", required=True, help="where the gateway's files and the relay's log go")
    p.add_argument("--timeout", type=float, default=20.0, help="deadline of each wait, seconds (default 20)")
    args = p.parse_args()
    if not args.database_url:
        p.error("no database: set DATABASE_URL or pass --database-url")
    s = Scenario(args)
    ok = False
    try:
        ok = s.run()
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as e:
        print(f"scenario.py: {e}", file=sys.stderr)
    finally:
        status = s.close()
    if status not in (0, None):
        print(f"outboxd run exited {status} after SIGTERM (expected 0)", file=sys.stderr)
        ok = False
    say("\nOK: every deposit texted exactly once" if ok else "\nFAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
