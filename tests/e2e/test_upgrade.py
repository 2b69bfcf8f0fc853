"""Upgrading an outbox that an older release installed, while it holds live
work: undelivered events, a retry, a lease held by a relay of the old
release, an event waiting behind that lease's key, dead letters and (from
0002 on) a destination's delivery state. `outboxd migrate` brings it to the
current version and a current relay delivers all of it: the old lease is
respected to its end, key order holds, attempts carry on."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import EXIT_OK, REPO, Db, clean_env
from helpers import claims_only, wait_delivered

# The newest migration this tree ships: an upgrade ends there.
LATEST = max(int(p.name[:4]) for p in (REPO / "sql").glob("[0-9][0-9][0-9][0-9]_*.sql"))

BOOTSTRAP = """CREATE SCHEMA IF NOT EXISTS :"schema";
CREATE TABLE IF NOT EXISTS :"schema".schema_migrations (
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
"""
NAMES = {1: "outbox", 2: "destinations", 3: "validate_on_write"}


def _install_old(database_url: str, schema: str, upto: int) -> None:
    """What `outboxd migrate` of an older release left: its bootstrap table,
    the migrations up to ``upto``, each recorded."""
    psql = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
    files = sorted((REPO / "sql").glob("[0-9][0-9][0-9][0-9]_*.sql"))[:upto]
    script = BOOTSTRAP
    for i, f in enumerate(files, 1):
        script += f.read_text() + "\n"
        script += f"INSERT INTO :\"schema\".schema_migrations (version, name) VALUES ({i}, '{NAMES[i]}');\n"
    p = subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", f"schema={schema}", "-d", database_url,
                        "-1", "-f", "-"], input=script, capture_output=True, text=True, timeout=30, env=clean_env())
    assert p.returncode == 0, p.stderr


@claims_only("windows refuse to start while events from before 0009 remain (step 6 drains them first)")
@pytest.mark.parametrize("upto", [1, 2], ids=["from_0001", "from_0002"])
def test_migrating_an_older_outbox_with_live_rows_and_leases_loses_nothing(outboxd, database_url, make_schema,
                                                                          receiver, relay, request, upto):
    schema = make_schema(migrate=False)
    _install_old(database_url, schema, upto)
    db = Db(database_url, schema)
    request.addfinalizer(db.close)

    def insert(columns: str, values: str, args=None) -> int:
        return db.scalar(f"INSERT INTO {{s}}.events (topic, payload, {columns}) VALUES ('up', '{{{{}}}}', {values}) "
                         "RETURNING id", args)

    # Leased by a relay of the old release for 3 more seconds, and one of its key behind it.
    leased = insert("ordering_key, attempts, lease_owner, available_at",
                    "'k', 1, 'old-release:1:abc', now() + interval '3 seconds'")
    behind = insert("ordering_key", "'k'")
    retry = insert("attempts, last_error", "2, 'HTTP 500'")
    plain = insert("headers", "'{{\"x-tenant\": \"acme\"}}'")
    expected = {leased: "2", behind: "1", retry: "3", plain: "1"}
    lease_end = db.scalar("SELECT extract(epoch FROM available_at)::float8 FROM {s}.events WHERE id = %s", (leased,))
    db.query("INSERT INTO {s}.dead_letters (id, topic, payload, headers, created_at, attempts, last_error) "
             "VALUES (900, 'up', '{{\"dead\": true}}', '{{}}', now(), 5, 'HTTP 500') RETURNING id")
    if upto >= 2:
        # Fanned out by the old release: destination "default" owes it, attempt 2 next.
        fanned = insert("attempts, fanned_out, available_at", "1, true, 'infinity'")
        db.query("INSERT INTO {s}.deliveries (event_id, destination, available_at, attempts, last_error) "
                 "VALUES (%s, 'default', now(), 1, 'HTTP 503') RETURNING event_id", (fanned,))
        expected[fanned] = "2"

    m = outboxd("--database-url", database_url, "--schema", schema, "migrate")
    assert m.rc == EXIT_OK, m
    versions = [r["version"] for r in db.query("SELECT version FROM {s}.schema_migrations ORDER BY 1")]
    assert versions == list(range(1, LATEST + 1)), versions
    assert db.count_events() == len(expected), db.events()

    relay(receiver, "--sweep-interval", "1h", schema=schema)
    assert wait_delivered(receiver, expected, timeout=15), (receiver.ids(), db.events())
    assert db.wait_empty(timeout=5), (db.events(), db.deliveries())
    reqs = {q.event_id: q for q in receiver.snapshot()}
    assert len(receiver.snapshot()) == len(expected), receiver.ids()
    assert {i: q.headers["outbox-attempt"] for i, q in reqs.items()} == expected
    assert reqs[leased].t_wall >= lease_end - 0.05, \
        f"the old release's lease was taken {lease_end - reqs[leased].t_wall:.2f}s early"
    assert reqs[behind].t_monotonic > reqs[leased].t_monotonic, "key order broken across the upgrade"
    assert reqs[plain].headers.get("x-tenant") == "acme"
    assert reqs[plain].headers["webhook-id"] == db.message_id(plain)

    # The old dead letter replays through the new relay.
    r = outboxd("--database-url", database_url, "--schema", schema, "dead", "replay", "--id", "900")
    assert r.rc == EXIT_OK, r
    assert wait_delivered(receiver, [900], timeout=10)
    assert db.wait_empty(timeout=5) and db.count_dead_letters() == 0
