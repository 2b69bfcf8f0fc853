"""The examples in examples/ run as a user runs them (their scenario.py, SQL,
outboxd.toml and service script, the real binary), each in fresh databases
of the suite's cluster; then the test checks the outcome itself, from the
databases and the services' own records, rather than trusting the
scenario's verdict."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pytest

from conftest import REPO, admin_execute, clean_env
from helpers import wait_until

EXAMPLES = REPO / "examples"
INBOX_SQL = REPO / "sql" / "inbox" / "0001_inbox.sql"
SCENARIO_TIMEOUT = 90   # the whole scenario; each of its waits has its own 15 s deadline


@pytest.fixture
def make_database(request, database_url):
    """make_database() -> URL of a new, empty database in the suite's cluster;
    dropped at teardown. The examples install fixed schema names (outbox,
    ledger, shop, inbox, warehouse), so each run gets databases of its own."""
    made: list[str] = []
    base = "ex_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:30]

    def make() -> str:
        name = f"{base}_{secrets.token_hex(3)}"
        admin_execute(database_url, f'CREATE DATABASE "{name}"')
        made.append(name)
        return urlunsplit(urlsplit(database_url)._replace(path="/" + name))

    yield make
    for name in made:
        admin_execute(database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_scenario(example: str, args: list, workdir: Path) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, str(EXAMPLES / example / "scenario.py"), *map(str, args),
                        "--workdir", str(workdir), "--timeout", "15"],
                       capture_output=True, text=True, timeout=SCENARIO_TIMEOUT, env=clean_env())
    print(f"--- {example}/scenario.py (exit {p.returncode}) ---\n{p.stdout}\n{p.stderr}")
    for log in sorted(workdir.glob("*.log")) + sorted(workdir.glob("*.out")):
        print(f"--- {log.name} (last lines) ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
    return p


def read_jsonl(path: Path) -> list:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def query(url: str, statement: str, args=None) -> list:
    conn = psycopg2.connect(url, connect_timeout=5)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, args)
            return cur.fetchall()
    finally:
        conn.close()


# --------------------------------------------------------------------------
# 1. ledger deposit -> SMS
# --------------------------------------------------------------------------
def test_ledger_sms_example_texts_every_deposit_once_through_failures_an_outage_and_a_replay(
        make_database, outboxd_bin, tmp_path):
    url = make_database()
    p = run_scenario("ledger-sms", ["--database-url", url, "--outboxd", outboxd_bin], tmp_path)
    assert p.returncode == 0, "the scenario's own check failed (output above)"
    summary = json.loads((tmp_path / "summary.json").read_text())

    # The ledger: a retried request posted nothing twice.
    deposits = dict(query(url, "SELECT deposit_id, amount_cents FROM ledger.deposits"))
    assert set(deposits) == set(summary["deposits"]) and len(deposits) == 12
    mismatched = query(url, "SELECT a.id, a.balance_cents, sum(d.amount_cents) FROM ledger.accounts a "
                            "JOIN ledger.deposits d ON d.account_id = a.id GROUP BY a.id "
                            "HAVING a.balance_cents <> sum(d.amount_cents)")
    assert mismatched == [], f"balances do not match the deposits: {mismatched}"
    assert query(url, "SELECT count(*) FROM outbox.events")[0][0] == 0
    assert query(url, "SELECT count(*) FROM outbox.dead_letters")[0][0] == 0

    # The gateway: every deposit's text exactly once, though it got repeats.
    sent = read_jsonl(tmp_path / "sent.jsonl")
    per_deposit: dict = {}
    for s in sent:
        per_deposit[s["deposit_id"]] = per_deposit.get(s["deposit_id"], 0) + 1
    assert per_deposit == {d: 1 for d in deposits}, f"texts per deposit: {per_deposit}"
    requests = read_jsonl(tmp_path / "requests.jsonl")
    repeats = [r for r in requests if r["result"].startswith("duplicate")]
    assert repeats, "no delivery came twice: the lost answers were not re-delivered, nothing was de-duplicated"

    # The backoff: a message refused twice was retried after ~base, then ~2x base
    # (300ms; jitter takes off at most 20 %), never at once.
    by_id: dict = {}
    for r in requests:
        by_id.setdefault(r["webhook_id"], []).append(r)
    # Only messages whose third attempt reached the gateway: on a slow run
    # a message's retries can reach into the outage of step 3, where its
    # attempts fail to connect and leave no line in requests.jsonl (seen
    # in CI: logged attempts 1, 2, then 5). That no attempt number is
    # skipped without a request is checked against the relay's log below.
    flaky = [rs for rs in by_id.values()
             if [(r["status"], r["attempt"]) for r in rs[:3]] == [(503, 1), (503, 2), (200, 3)]]
    assert flaky, f"no message failed twice and then went through: {by_id}"
    for rs in flaky:
        first_gap, second_gap = rs[1]["t"] - rs[0]["t"], rs[2]["t"] - rs[1]["t"]
        assert first_gap >= 0.8 * 0.3 - 0.02, f"retried {first_gap * 1000:.0f} ms after a 503: {rs}"
        assert second_gap >= 0.8 * 0.6 - 0.02, f"second retry {second_gap * 1000:.0f} ms later: {rs}"

    # The outage: the first text of each account posted while the gateway was
    # down failed at least once and went out after it came back, none lost.
    sent_attempt = {s["deposit_id"]: s["attempt"] for s in sent}
    first_of_each_account = summary["outage"][:2]   # dep-1009 (account 1), dep-1010 (account 2)
    assert all(sent_attempt[d] >= 2 for d in first_of_each_account), sent_attempt

    # No attempt number skipped without a request: per event, the attempts
    # the gateway logged and those the relay logged as failed (a refused
    # connection reaches no gateway) make 1, 2, ... without a gap.
    attempts: dict = {}
    for r in requests:
        attempts.setdefault(int(r["webhook_id"].rsplit("_", 1)[1]), set()).add(r["attempt"])
    relay_log = (tmp_path / "outboxd.log").read_text()
    for m in re.finditer(r'msg="delivery failed[^"]*" event_id=(\d+) .*?\battempt=(\d+)', relay_log):
        attempts.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    gaps = {e: sorted(a) for e, a in attempts.items() if sorted(a) != list(range(1, max(a) + 1))}
    assert not gaps, f"attempt numbers skipped: {gaps}"

    # The dead letter: refused with 422 at once (one attempt), sent after the replay.
    blocked = [r for r in requests if r["deposit_id"] == summary["blocked"][0]]
    assert blocked[0]["status"] == 422 and blocked[0]["attempt"] == 1, blocked
    assert [r["result"].startswith("sent") for r in blocked[1:]].count(True) == 1, blocked


# --------------------------------------------------------------------------
# 3. order placed -> signed webhook -> idempotent consumer (the inbox)
# --------------------------------------------------------------------------
def run_order_webhook(make_database, outboxd_bin, workdir, inbox_sql=INBOX_SQL):
    shop, warehouse = make_database(), make_database()
    p = run_scenario("order-webhook", ["--shop-url", shop, "--warehouse-url", warehouse, "--outboxd",
                                       outboxd_bin, "--inbox-sql", inbox_sql], workdir)
    summary = json.loads((workdir / "summary.json").read_text())
    picks = dict(query(warehouse, "SELECT order_id, count(*) FROM warehouse.picks GROUP BY order_id"))
    return p, summary, shop, warehouse, picks


def test_order_webhook_example_applies_each_event_once_across_a_crash_after_commit_and_a_late_answer(
        make_database, outboxd_bin, tmp_path):
    p, summary, shop, warehouse, picks = run_order_webhook(make_database, outboxd_bin, tmp_path)
    assert p.returncode == 0, "the scenario's own check failed (output above)"
    orders = {int(k): v for k, v in summary["orders"].items()}
    assert picks == {o: len(lines) for o, lines in orders.items()}, f"picks per order: {picks}"
    reserved = dict(query(warehouse, "SELECT sku, reserved FROM warehouse.stock"))
    want: dict = {sku: 0 for sku in reserved}
    for lines in orders.values():
        for line in lines:
            want[line["sku"]] += line["qty"]
    assert reserved == want

    log = read_jsonl(tmp_path / "warehouse.jsonl")
    crashed, slow = summary["crashed_order"], summary["slow_order"]
    # The crash came after the commit and before the answer: the picks were
    # there when the process died, and outboxd sent the event again to the
    # restarted warehouse, which recognised it.
    assert summary["crash_exit"] == 70 and summary["picks_at_crash"] == len(orders[crashed])
    seen = [(r["pid"], r["result"]) for r in log if r.get("order_id") == crashed]
    assert [res for _, res in seen] == ["applied", "duplicate"], seen
    assert seen[0][0] != seen[1][0], "the repeat should have reached the restarted process"
    # The late answer: outboxd sent it again while the first answer was pending.
    assert [r["result"] for r in log if r.get("order_id") == slow] == ["applied", "duplicate"]

    # The inbox holds each event's webhook-id once: the outbox's message ids.
    received = sorted(r[0] for r in query(warehouse, "SELECT message_id FROM inbox.received_messages"))
    applied = sorted(r["webhook_id"] for r in log if r["result"] == "applied")
    assert received == applied and len(received) == len(orders)
    event_ids = [int(m.rsplit("_", 1)[1]) for m in received]
    assert received == sorted(r[0] for r in query(shop, "SELECT outbox.message_id(i) FROM unnest(%s) i",
                                                  (event_ids,)))

    # Forged requests: refused, nothing applied.
    assert sum(1 for r in log if r["result"] == "rejected") == 2
    assert 999 not in picks
    assert query(shop, "SELECT count(*) FROM outbox.events")[0][0] == 0


def test_order_webhook_example_catches_the_double_apply_of_an_inbox_without_its_key(
        make_database, outboxd_bin, tmp_path):
    """The check above can fail: an inbox whose table lost its primary key
    records every delivery as new, and the repeated events are applied again."""
    text = INBOX_SQL.read_text()
    assert text.count("PRIMARY KEY") == 1
    broken = tmp_path / "inbox_without_key.sql"
    broken.write_text(text.replace("PRIMARY KEY", ""))
    p, summary, _, _, picks = run_order_webhook(make_database, outboxd_bin, tmp_path / "run", broken)
    assert p.returncode == 1, "the scenario did not notice the double apply"
    crashed = summary["crashed_order"]
    assert picks[crashed] > len(summary["orders"][str(crashed)]), picks
    assert "not there exactly once" in p.stdout and "FAILED" in p.stdout


# --------------------------------------------------------------------------
# the inbox snippet on its own
# --------------------------------------------------------------------------
def test_inbox_receive_is_true_once_even_for_concurrent_transactions(make_database):
    """Two transactions receive one message id at once: the second waits for
    the first and gets false if it committed, true if it rolled back."""
    url = make_database()
    subprocess.run(["psql", url, "-q", "-1", "-v", "ON_ERROR_STOP=1", "-v", "schema=inbox", "-f", str(INBOX_SQL)],
                   check=True, timeout=30, env=clean_env())
    first, second = psycopg2.connect(url), psycopg2.connect(url)
    second_pid = second.get_backend_pid()
    try:
        for outcome, want in (("commit", False), ("rollback", True)):
            msg = f"msg_0123456789abcdef_{outcome}"
            with first.cursor() as cur:
                cur.execute("SELECT inbox.receive(%s, 'order.placed')", (msg,))
                assert cur.fetchone()[0] is True
            got: list = []

            def receive_again():
                with second.cursor() as cur:
                    cur.execute("SELECT inbox.receive(%s)", (msg,))
                    got.append(cur.fetchone()[0])
                second.commit()
            t = threading.Thread(target=receive_again)
            t.start()
            waiting = wait_until(lambda: query(url, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity "
                                                    "WHERE pid = %s", (second_pid,))[0][0], 10)
            assert waiting and not got, "the second transaction did not wait for the first"
            getattr(first, outcome)()
            t.join(10)
            assert got == [want], f"after the first's {outcome}: {got}"
        assert query(url, "SELECT count(*) FROM inbox.received_messages")[0][0] == 2
    finally:
        first.close()
        second.close()
