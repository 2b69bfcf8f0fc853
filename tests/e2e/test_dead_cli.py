"""`outboxd dead ...` as an operator uses it: what it prints is what is
stored, topics filter with the same patterns as routes, a replay or purge
that matches nothing says so, and a purge can be tried first."""

from __future__ import annotations

import json

from conftest import EXIT_INVALID_INPUT, EXIT_OK


def _bury(db, event_id: int, topic: str, payload: str = '{"n": 1}', destination=None) -> None:
    db.query("INSERT INTO {s}.dead_letters (id, topic, payload, headers, created_at, attempts, last_error, "
             "destination) VALUES (%s, %s, %s::jsonb, '{{}}', now(), 3, 'HTTP 500', %s) RETURNING id",
             (event_id, topic, payload, destination))


def _dead(outboxd, db, *args):
    return outboxd("dead", *args, "--database-url", db.url, "--schema", db.schema)


def test_dead_list_json_prints_the_payload_as_stored(outboxd, db):
    _bury(db, 1, "t", '{"big": 12345678901234567890123, "price": 19.990}')
    r = _dead(outboxd, db, "list", "--json")
    assert r.rc == EXIT_OK, r
    [line] = r.stdout.splitlines()
    assert '"big": 12345678901234567890123' in line and '"price": 19.990' in line, line
    assert json.loads(line)["payload"]["big"] == 12345678901234567890123


def test_replaying_a_dead_letter_that_does_not_exist_says_so_and_fails(outboxd, db):
    _bury(db, 1, "t")
    r = _dead(outboxd, db, "replay", "--id", "999")
    assert r.rc == EXIT_INVALID_INPUT, r
    assert "no dead letter" in r.stderr and "999" in r.stderr, r
    assert db.count_dead_letters() == 1 and db.count_events() == 0


def test_dead_commands_filter_topics_with_route_patterns(outboxd, db):
    _bury(db, 1, "orders.created")
    _bury(db, 2, "orders.eu.created")
    _bury(db, 3, "billing.paid")
    _bury(db, 4, "orders")

    def listed(pattern):
        r = _dead(outboxd, db, "list", "--json", "--topic", pattern)
        assert r.rc == EXIT_OK, r
        return sorted(json.loads(line)["id"] for line in r.stdout.splitlines())

    assert listed("orders.*") == [1]
    assert listed("orders.>") == [1, 2]
    assert listed("*.paid") == [3]
    assert listed("orders") == [4]
    assert listed(">") == [1, 2, 3, 4]
    bad = _dead(outboxd, db, "list", "--topic", "orders.#")
    assert bad.rc == 2 and "orders.#" in bad.stderr, bad

    r = _dead(outboxd, db, "replay", "--topic", "orders.>")
    assert r.rc == EXIT_OK, r
    assert sorted(int(x) for x in r.stdout.split()) == [1, 2]
    assert sorted(e["id"] for e in db.events()) == [1, 2]


def test_dead_purge_dry_run_counts_and_deletes_nothing(outboxd, db):
    _bury(db, 1, "a")
    _bury(db, 2, "b")
    r = _dead(outboxd, db, "purge", "--older-than", "0s", "--dry-run")
    assert r.rc == EXIT_OK, r
    assert r.stdout.strip() == "2", r
    assert "would purge" in r.stderr, r
    assert db.count_dead_letters() == 2
    r = _dead(outboxd, db, "purge", "--older-than", "0s", "--topic", "a")
    assert r.rc == EXIT_OK and r.stdout.strip() == "1", r
    assert db.count_dead_letters() == 1
