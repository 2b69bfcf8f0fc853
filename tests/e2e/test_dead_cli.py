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


def _bury_aged(db, event_id: int, topic: str, died: str) -> None:
    db.query("INSERT INTO {s}.dead_letters (id, topic, payload, headers, created_at, attempts, last_error, died_at) "
             "VALUES (%s, %s, '{{}}', '{{}}', now() - interval '4 days', 3, 'HTTP 500', now() - %s::interval) "
             "RETURNING id", (event_id, topic, died))


def test_dead_filters_select_by_topic_age_and_limit_and_purge_keeps_younger_letters(outboxd, db):
    """Every filter of `dead list/replay/purge` narrows what is touched:
    --topic, --older-than (by when the letter died), --limit, --all; a
    purge removes only letters older than asked and keeps the younger."""
    _bury_aged(db, 1, "a", "3 days")
    _bury_aged(db, 2, "a", "1 hour")
    _bury_aged(db, 3, "b", "3 days")
    _bury_aged(db, 4, "b", "1 second")
    _bury_aged(db, 5, "c", "3 days")

    def listed(*args):
        r = _dead(outboxd, db, "list", "--json", *args)
        assert r.rc == EXIT_OK, r
        return [json.loads(line)["id"] for line in r.stdout.splitlines()]

    assert listed() == [1, 2, 3, 4, 5]
    assert listed("--limit", "2") == [1, 2]
    assert listed("--older-than", "48h") == [1, 3, 5]
    assert listed("--older-than", "30m") == [1, 2, 3, 5]
    assert listed("--topic", "a", "--older-than", "48h") == [1]

    # replay: both filters at once; nothing else comes back.
    r = _dead(outboxd, db, "replay", "--topic", "b", "--older-than", "48h")
    assert r.rc == EXIT_OK, r
    assert r.stdout.split() == ["3"], r
    assert [e["id"] for e in db.events()] == [3]
    assert listed() == [1, 2, 4, 5]

    # purge: a dry run counts, the real one deletes the old letters only.
    r = _dead(outboxd, db, "purge", "--older-than", "48h", "--dry-run")
    assert r.rc == EXIT_OK and r.stdout.strip() == "2", r
    assert listed() == [1, 2, 4, 5]
    r = _dead(outboxd, db, "purge", "--older-than", "48h")
    assert r.rc == EXIT_OK and r.stdout.strip() == "2", r
    assert listed() == [2, 4], "a purge took younger letters than --older-than"

    # replay without a filter is refused; --all takes what is left.
    r = _dead(outboxd, db, "replay")
    assert r.rc == 2 and "--all" in r.stderr, r
    assert listed() == [2, 4]
    r = _dead(outboxd, db, "replay", "--all")
    assert r.rc == EXIT_OK and r.stdout.split() == ["2", "4"], r
    assert listed() == []
    assert [e["id"] for e in db.events()] == [2, 3, 4]


def test_dead_list_prints_one_readable_entry_per_letter(outboxd, db):
    _bury_aged(db, 7, "orders.created", "1 hour")
    r = _dead(outboxd, db, "list")
    assert r.rc == EXIT_OK, r
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    assert lines[0].startswith(f"7  {db.message_id(7)}  orders.created  destination=(all)  key=-  attempts=3"), lines
    assert lines[1].strip() == "HTTP 500", lines
