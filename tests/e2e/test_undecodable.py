"""A claimed row the relay cannot decode is one dead letter, not a stranded
batch: the rest of the claim is delivered, the bad one is moved to dead
letters with the reason, and no lease is left behind."""

from __future__ import annotations

import secrets

import psycopg2
from psycopg2 import sql

from conftest import EXIT_OK, Db, admin_execute
from helpers import wait_delivered, wait_until


def test_an_event_whose_headers_are_not_utf8_is_dead_lettered_and_the_rest_delivered(
        database_url, outboxd, relay, receiver):
    # Only a SQL_ASCII database stores bytes that are not UTF-8 in jsonb.
    name = f"e2e_sqlascii_{secrets.token_hex(3)}"
    admin_execute(database_url, sql.SQL(
        "CREATE DATABASE {} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
        .format(sql.Identifier(name)))
    url = database_url.rsplit("/", 1)[0] + "/" + name
    db = None
    try:
        assert outboxd("--database-url", url, "--schema", "outbox", "migrate").rc == EXIT_OK
        db = Db(url, "outbox")
        before = db.enqueue("fine", {"n": 1})
        # {"x-bad": "<0xff>"}: jsonb keeps the byte, nlohmann refuses it.
        bad = db.scalar(sql.SQL("SELECT outbox.enqueue('fine', %s::jsonb, "
                                "headers => convert_from(%s, 'SQL_ASCII')::jsonb)"),
                        ('{"n": 2}', psycopg2.Binary(b'{"x-bad": "\xff"}')))
        after = db.enqueue("fine", {"n": 3})

        r = relay(receiver, "--sweep-interval", "1h", "--lease", "20s", database_url=url, schema="outbox")
        assert wait_delivered(receiver, [before, after], timeout=10), \
            f"the good events of the batch were not delivered: {receiver.requests}"
        assert wait_until(lambda: db.count_events() == 0, 10), db.events()
        # Not the headers: psycopg2 cannot decode them either.
        dead = db.query("SELECT id, last_error, destination FROM {s}.dead_letters")
        assert [d["id"] for d in dead] == [bad], dead
        assert "header" in dead[0]["last_error"] and "UTF-8" in dead[0]["last_error"], dead[0]["last_error"]
        assert dead[0]["destination"] is None, dead[0]
        assert bad not in {rq.event_id for rq in receiver.snapshot()}
        assert r.alive()
        r.stop()
    finally:
        if db is not None:
            db.close()
        admin_execute(database_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
