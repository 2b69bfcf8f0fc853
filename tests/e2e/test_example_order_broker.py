"""examples/order-broker run as a user runs it (its scenario.py, shop.sql,
outboxd.toml and consumer, the real binary) against a database of its own in
the suite's cluster and a nats-server of its own; then the test reads the
stream and the database itself rather than trusting the scenario's verdict."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pytest

from conftest import REPO, admin_execute, clean_env
from nats_support import Client, Server, wait_jetstream_ready

EXAMPLE = REPO / "examples" / "order-broker"


@pytest.fixture
def shop_database(database_url):
    name = f"ex_order_broker_{secrets.token_hex(3)}"
    admin_execute(database_url, f'CREATE DATABASE "{name}"')
    yield urlunsplit(urlsplit(database_url)._replace(path="/" + name))
    admin_execute(database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def nats_server(tmp_path):
    s = Server(tmp_path / "js", "orders", tmp_path / "nats.log").start()
    wait_jetstream_ready(s.port)
    yield s
    s.stop()


def query(url: str, statement: str, args=None) -> list:
    conn = psycopg2.connect(url, connect_timeout=5)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, args)
            return cur.fetchall()
    finally:
        conn.close()


def test_order_broker_example_every_orders_events_once_and_in_order_in_the_stream_retries_add_nothing(
        shop_database, nats_server, outboxd_bin, tmp_path):
    work = tmp_path / "state"
    p = subprocess.run([sys.executable, str(EXAMPLE / "scenario.py"), "--database-url", shop_database,
                        "--nats-url", nats_server.url, "--outboxd", outboxd_bin, "--workdir", str(work),
                        "--timeout", "15"], capture_output=True, text=True, timeout=90, env=clean_env())
    print(f"--- scenario.py (exit {p.returncode}) ---\n{p.stdout}\n{p.stderr}")
    if (work / "outboxd.log").exists():
        print("--- outboxd.log (last lines) ---\n" + "\n".join((work / "outboxd.log").read_text().splitlines()[-30:]))
    assert p.returncode == 0, "the scenario's own check failed (output above)"
    summary = json.loads((work / "summary.json").read_text())
    events = summary["events"]   # order id -> event type -> event id

    # The shop: one row per order although requests were retried, each
    # retry answered with the first event's id.
    assert sorted(r[0] for r in query(shop_database, "SELECT id FROM shop.orders")) == sorted(events)
    assert summary["retries"] and all(first == again for _, first, again in summary["retries"]), summary
    assert query(shop_database, "SELECT count(*) FROM outbox.events")[0][0] == 0
    assert query(shop_database, "SELECT count(*) FROM outbox.dead_letters")[0][0] == 0

    # The stream: each committed event exactly once (its Nats-Msg-Id is the
    # outbox message id of the event), and per order in the order committed.
    client = Client(nats_server.port)
    try:
        messages = client.stream_messages("ORDERS")
    finally:
        client.close()
    ids = [e for per_order in events.values() for e in per_order.values()]
    want_msg_ids = dict(query(shop_database, "SELECT outbox.message_id(i), i FROM unnest(%s::bigint[]) i", (ids,)))
    got_msg_ids = [m["headers"]["Nats-Msg-Id"] for m in messages]
    assert sorted(got_msg_ids) == sorted(want_msg_ids), "the stream does not hold each event exactly once"
    per_order: dict = {}
    for m in messages:   # stream order
        body = json.loads(m["data"])
        assert m["headers"]["outbox-ordering-key"] == f"Order/{body['order_id']}"
        assert m["subject"] == f"shop.orders.{body['type']}"
        per_order.setdefault(body["order_id"], []).append((body["type"], want_msg_ids[m["headers"]["Nats-Msg-Id"]]))
    for order_id, evs in events.items():
        want = sorted(((t, i) for t, i in evs.items()), key=lambda x: x[1])
        assert per_order[order_id] == want, f"{order_id}: {per_order[order_id]} in the stream, committed {want}"

    # The consumer: everything processed once, all in order; its second run
    # (the durable consumer resumed) got only the new order's events.
    log = [json.loads(ln) for ln in (work / "billing.jsonl").read_text().splitlines()]
    assert sorted(r["msg_id"] for r in log) == sorted(want_msg_ids)
    assert {r["result"] for r in log} == {"applied"}, log
    assert [r["order_id"] for r in log[summary["first_run"]:]] == ["ord-1009", "ord-1009"]
    assert all(r["delivered"] == 1 for r in log)
