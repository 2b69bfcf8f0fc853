"""Least-privilege roles, as config/grants.sql sets them up: a migration
owner, a producer that may only enqueue, a relay that delivers. A role that
lacks a privilege gets its own exit code and a message naming what it lacks."""

from __future__ import annotations

import secrets
import subprocess

import psycopg2
import pytest
from psycopg2 import sql

from conftest import EXIT_OK, EXIT_PERMISSION_DENIED, REPO, Db, admin_execute
from helpers import wait_delivered


def _as(url: str, role: str) -> str:
    # The test cluster trusts every local role: the URL names the user only.
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{role}@{rest.split('@', 1)[1]}"


@pytest.fixture
def roles(database_url):
    tag = secrets.token_hex(3)
    names = {k: f"e2e_{k}_{tag}" for k in ("owner", "producer", "relay", "stranger")}
    schema = f"e2e_priv_{tag}"
    for name in names.values():
        admin_execute(database_url, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    admin_execute(database_url, sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
        sql.Identifier(database_url.rsplit("/", 1)[1]), sql.Identifier(names["owner"])))
    yield schema, names
    admin_execute(database_url, sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    for name in names.values():
        admin_execute(database_url, sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
        admin_execute(database_url, sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_the_documented_grants_are_enough_and_nothing_more_is_needed(database_url, outboxd, relay, receiver, roles):
    schema, r = roles
    owner_url = _as(database_url, r["owner"])
    assert outboxd("--database-url", owner_url, "--schema", schema, "migrate").rc == EXIT_OK
    p = subprocess.run(["psql", owner_url, "-v", "ON_ERROR_STOP=1", "-q", "-v", f"schema={schema}",
                        "-v", f"producer={r['producer']}", "-v", f"relay={r['relay']}",
                        "-f", str(REPO / "config" / "grants.sql")], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr

    producer = Db(_as(database_url, r["producer"]), schema)
    try:
        ids = [producer.enqueue("t", {"n": 1}), producer.enqueue("t", {"n": 2}, idempotency_key="k1"),
               producer.enqueue("t", {"n": 3}, key="cust-1")]
        assert producer.message_id(ids[0]).startswith("msg_")
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            producer.query("DELETE FROM {s}.events")
    finally:
        producer.close()
    cli = outboxd("--database-url", _as(database_url, r["producer"]), "--schema", schema,
                  "enqueue", "--topic", "t", "--payload", "{}")
    assert cli.rc == EXIT_OK, cli
    ids.append(int(cli.stdout.strip()))

    relay_url = _as(database_url, r["relay"])
    relay(receiver, "--sweep-interval", "1h", database_url=relay_url, schema=schema)
    assert wait_delivered(receiver, ids, 10)
    for args in (["status"], ["dead", "list"]):
        assert outboxd("--database-url", relay_url, "--schema", schema, *args).rc == EXIT_OK


@pytest.mark.parametrize("args", [["status"], ["enqueue", "--topic", "t", "--payload", "{}"], ["dead", "list"],
                                  ["run", "--url", "stdout"]], ids=["status", "enqueue", "dead", "run"])
def test_a_role_without_privileges_gets_exit_7_and_the_missing_privilege(database_url, outboxd, roles, args):
    schema, r = roles
    assert outboxd("--database-url", _as(database_url, r["owner"]), "--schema", schema, "migrate").rc == EXIT_OK
    res = outboxd("--database-url", _as(database_url, r["stranger"]), "--schema", schema, *args)
    assert res.rc == EXIT_PERMISSION_DENIED, res
    assert f"permission denied for schema {schema}" in res.stderr, res
    assert "grants" in res.stderr, res
