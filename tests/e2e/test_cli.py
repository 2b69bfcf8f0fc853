"""The CLI at its edges: bad configuration, unreachable database, invalid input,
hostile schema names, and `outboxd sql` as a standalone migration."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess

import psycopg2
import pytest
from psycopg2 import sql

from conftest import (EXIT_DB_UNAVAILABLE, EXIT_INVALID_INPUT, EXIT_OK, EXIT_SCHEMA_MISSING,
                      EXIT_SCHEMA_NEWER, EXIT_USAGE, REPO, Db, admin_execute, clean_env, schema_exists)
from helpers import claims_only, closed_port, wait_delivered

PASSWORD = "s3cret-pw"


# ---------------------------------------------------------------- database down
@pytest.mark.parametrize("command", [
    ["run", "--url", "http://127.0.0.1:9/hook"],
    ["migrate"],
    ["enqueue", "--topic", "t", "--payload", "{}"],
], ids=["run", "migrate", "enqueue"])
def test_unreachable_database_exits_3_promptly_without_leaking_the_password(outboxd, command):
    url = f"postgresql://outboxd_user:{PASSWORD}@127.0.0.1:{closed_port()}/app"
    r = outboxd("--database-url", url, "--schema", "outbox", *command, timeout=30)
    assert r.rc == EXIT_DB_UNAVAILABLE, r
    assert r.elapsed < 10, f"took {r.elapsed:.1f}s to give up on a refused connection"
    assert r.stderr.strip(), "no error message"
    assert PASSWORD not in r.output, r


def test_password_from_the_environment_is_not_logged_either(outboxd):
    url = f"postgres://app:{PASSWORD}@127.0.0.1:{closed_port()}/app?sslmode=disable"
    r = outboxd("run", env={"DATABASE_URL": url, "OUTBOXD_WEBHOOK_URL": "http://127.0.0.1:9/h"},
                timeout=30)
    assert r.rc == EXIT_DB_UNAVAILABLE, r
    assert PASSWORD not in r.output, r


def test_unreachable_database_in_keyword_form_hides_the_password(outboxd):
    dsn = f"host=127.0.0.1 port={closed_port()} dbname=app user=app password={PASSWORD}"
    r = outboxd("--database-url", dsn, "migrate", timeout=30)
    # a keyword DSN may be refused as a usage error; either way, no password
    assert r.rc in (EXIT_DB_UNAVAILABLE, EXIT_USAGE), r
    assert PASSWORD not in r.output, r


# ---------------------------------------------------------------- usage errors
def test_run_without_url_exits_2(outboxd, database_url, schema):
    r = outboxd("--database-url", database_url, "--schema", schema, "run")
    assert r.rc == EXIT_USAGE, r
    assert r.stderr.strip(), r


@pytest.mark.parametrize("bad_url", [
    "ftp://127.0.0.1/hook",
    "file:///etc/passwd",
    "not a url",
    "http://",
    "127.0.0.1:8080/hook",
], ids=["ftp", "file", "garbage", "no-host", "no-scheme"])
def test_run_with_invalid_url_exits_2(outboxd, database_url, schema, bad_url):
    r = outboxd("--database-url", database_url, "--schema", schema, "run", "--url", bad_url)
    assert r.rc == EXIT_USAGE, r
    assert r.stderr.strip(), r


@pytest.mark.parametrize("args", [
    ["run", "--url", "http://127.0.0.1:9/h", "--lease", "soon"],
    ["run", "--url", "http://127.0.0.1:9/h", "--concurrency", "0"],
    ["run", "--url", "http://127.0.0.1:9/h", "--no-such-flag"],
    ["frobnicate"],
    ["enqueue", "--payload", "{}"],          # --topic missing
    ["--log-level", "chatty", "migrate"],
], ids=["bad-duration", "zero-concurrency", "unknown-flag", "unknown-command",
        "enqueue-no-topic", "bad-log-level"])
def test_usage_errors_exit_2(outboxd, database_url, schema, args):
    r = outboxd("--database-url", database_url, "--schema", schema, *args)
    assert r.rc == EXIT_USAGE, r


def test_an_integer_option_has_the_configuration_s_message(outboxd):
    """`dead replay --id` says what `--concurrency` says about a bad integer
    (one parser, one message); it is refused before any database is needed."""
    r = outboxd("--database-url", "postgresql://127.0.0.1:9/none", "dead", "replay", "--id", "x1")
    assert r.rc == EXIT_USAGE, r
    assert r.stderr == ('outboxd: --id: expected an integer from 1 to 9223372036854775807, got "x1"\n'), r


# ---------------------------------------------------------------- invalid input
@pytest.mark.parametrize("payload", ['{"a":', "not json", "{'single': 'quotes'}", ""],
                         ids=["truncated", "bare-word", "single-quotes", "empty"])
def test_enqueue_with_malformed_json_exits_6_and_inserts_nothing(outboxd, database_url, db, payload):
    r = outboxd("--database-url", database_url, "--schema", db.schema,
                "enqueue", "--topic", "t", "--payload", payload)
    assert r.rc == EXIT_INVALID_INPUT, r
    assert not r.stdout.strip(), f"printed an id for a rejected event: {r.stdout!r}"
    assert db.count_events() == 0


def test_enqueue_from_the_cli_is_delivered_with_key_and_headers(outboxd, database_url, db,
                                                                receiver, relay):
    r = outboxd("--database-url", database_url, "--schema", db.schema,
                "enqueue", "--topic", "cli.topic", "--payload", '{"from": "cli", "n": 1}',
                "--key", "cust-1", "--header", "X-Tenant=acme", "--header", "x-trace=abc=def")
    assert r.rc == EXIT_OK, r
    event_id = int(r.stdout.strip().splitlines()[-1])
    row = db.event(event_id)
    assert row is not None and row["topic"] == "cli.topic" and row["ordering_key"] == "cust-1", row

    relay(receiver, "--sweep-interval", "1h")
    assert wait_delivered(receiver, [event_id], timeout=10)
    req = receiver.snapshot()[0]
    assert json.loads(req.body) == {"from": "cli", "n": 1}
    assert req.headers.get("outbox-ordering-key") == "cust-1"
    assert req.headers.get("x-tenant") == "acme", req.headers
    assert req.headers.get("x-trace") == "abc=def", req.headers


def test_enqueue_stores_the_payload_text_exactly_numbers_included(outboxd, database_url, db):
    # Beyond a double's precision, and a scale a double forgets.
    payload = '{"big": 18446744073709551616, "price": 19.990, "tiny": 1e-400}'
    r = outboxd("--database-url", database_url, "--schema", db.schema,
                "enqueue", "--topic", "t", "--payload", payload)
    assert r.rc == EXIT_OK, r
    event_id = int(r.stdout.strip().splitlines()[-1])
    stored = db.scalar("SELECT payload::text FROM {s}.events WHERE id = %s", (event_id,))
    # jsonb's own rendering of the same text, as SQL enqueue() stores it.
    same = db.scalar("SELECT %s::jsonb::text", (payload,))
    assert stored == same, (stored, same)
    assert "18446744073709551616" in stored and "19.990" in stored, stored


@pytest.mark.parametrize("header", ["novalue", "=v", "bad name=v", "x=a\r\nInjected: 1"],
                         ids=["no-equals", "empty-name", "space-in-name", "crlf"])
def test_enqueue_with_a_bad_header_is_refused(outboxd, database_url, db, header):
    r = outboxd("--database-url", database_url, "--schema", db.schema,
                "enqueue", "--topic", "t", "--payload", "{}", "--header", header)
    assert r.rc in (EXIT_USAGE, EXIT_INVALID_INPUT), r
    assert db.count_events() == 0


# ---------------------------------------------------------------- schema versions
def test_run_against_a_schema_that_was_never_migrated_exits_4(outboxd, database_url, make_schema):
    missing = make_schema(migrate=False)
    r = outboxd("--database-url", database_url, "--schema", missing,
                "run", "--url", "http://127.0.0.1:9/hook")
    assert r.rc == EXIT_SCHEMA_MISSING, r
    assert not schema_exists(database_url, missing), "run must not create the schema"


def test_run_against_a_schema_newer_than_the_binary_exits_5(outboxd, database_url, db):
    cols = db.query("SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = 'schema_migrations' "
                    "ORDER BY ordinal_position", (db.schema,))
    version_col = cols[0]["column_name"]
    # a migration this binary does not know: copy the latest row with version + 1000
    names = [c["column_name"] for c in cols]
    db.query(sql.SQL("INSERT INTO {t} ({cols}) SELECT {v} + 1000, {rest} FROM {t} "
                     "ORDER BY {v} DESC LIMIT 1").format(
        t=db.t("schema_migrations"),
        cols=sql.SQL(", ").join(map(sql.Identifier, names)),
        v=sql.Identifier(version_col),
        rest=sql.SQL(", ").join(map(sql.Identifier, names[1:]))))
    r = outboxd("--database-url", database_url, "--schema", db.schema,
                "run", "--url", "http://127.0.0.1:9/hook")
    assert r.rc == EXIT_SCHEMA_NEWER, r
    r = outboxd("--database-url", database_url, "--schema", db.schema, "migrate")
    assert r.rc == EXIT_SCHEMA_NEWER, r


def test_migrate_twice_is_a_no_op(outboxd, database_url, db):
    before = db.query("SELECT * FROM {s}.schema_migrations")
    event_id = db.enqueue("keep", {"x": 1})
    r = outboxd("--database-url", database_url, "--schema", db.schema, "migrate")
    assert r.rc == EXIT_OK, r
    assert db.query("SELECT * FROM {s}.schema_migrations") == before
    assert db.event(event_id) is not None


# ---------------------------------------------------------------- hostile schema names
HOSTILE = [
    'x"; DROP TABLE {canary}.precious; --',
    "x'; DROP TABLE {canary}.precious; --",
    "has space",
    'we"ird',
    "Mixed Case",
    "semi;colon",
]


@pytest.fixture
def canary(database_url):
    name = f"e2e_canary_{secrets.token_hex(3)}"
    ident = sql.Identifier(name)
    admin_execute(database_url, sql.SQL("CREATE SCHEMA {}; CREATE TABLE {}.precious (v text); "
                                        "INSERT INTO {}.precious VALUES ('alive')")
                  .format(ident, ident, ident))
    yield name
    admin_execute(database_url, sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))


@pytest.mark.parametrize("template", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_hostile_schema_name_is_quoted_or_refused(outboxd, database_url, make_schema, canary,
                                                  receiver, relay, template):
    name = template.format(canary=canary)
    make_schema(migrate=False, name=name)  # registered for cleanup only
    r = outboxd("--database-url", database_url, "--schema", name, "migrate")

    # whatever happened, nothing was injected
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT v FROM {}.precious").format(sql.Identifier(canary)))
            assert cur.fetchall() == [("alive",)], "canary table was modified"
    except psycopg2.Error:
        pytest.fail(f"SQL injection: the canary table was dropped by migrate --schema {name!r}\n{r!r}")
    finally:
        conn.close()

    if r.rc == EXIT_USAGE:
        assert not schema_exists(database_url, name), "refused, yet the schema was created"
        return
    assert r.rc == EXIT_OK, r
    # migrated: under exactly that name, and it works end to end
    assert schema_exists(database_url, name), f"schema {name!r} not created (another name used?)"
    db = Db(database_url, name)
    try:
        via_sql = db.enqueue("hostile", {"via": "sql"})
        e = outboxd("--database-url", database_url, "--schema", name,
                    "enqueue", "--topic", "hostile", "--payload", '{"via": "cli"}')
        assert e.rc == EXIT_OK, e
        via_cli = int(e.stdout.strip().splitlines()[-1])
        relay(receiver, "--sweep-interval", "1h", schema=name)
        assert wait_delivered(receiver, [via_sql, via_cli], timeout=10), receiver.ids()
        assert db.wait_empty(timeout=5), db.events()
    finally:
        db.close()


# ---------------------------------------------------------------- outboxd sql
def _apply_with_psql(url: str, script: str) -> None:
    psql = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
    p = subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", "-"],
                       input=script, capture_output=True, text=True, timeout=30, env=clean_env())
    assert p.returncode == 0, f"psql failed ({p.returncode}):\n{p.stderr}"


def test_the_sql_files_applied_one_by_one_with_psql_yield_a_current_outbox(outboxd, database_url, make_schema,
                                                                         receiver, relay):
    """What the README offers to users of their own migration tools: the
    files of sql/, in order, each on its own. Each records itself, so
    `outboxd migrate` finds nothing to do and `outboxd run` starts."""
    name = make_schema(migrate=False)
    psql = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
    files = sorted((REPO / "sql").glob("[0-9][0-9][0-9][0-9]_*.sql"))
    assert len(files) >= 3, files
    for f in files:
        p = subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", f"schema={name}", "-d", database_url,
                            "-1", "-f", str(f)], capture_output=True, text=True, timeout=30, env=clean_env())
        assert p.returncode == 0, f"{f.name}: {p.stderr}"
    db = Db(database_url, name)
    try:
        versions = [r["version"] for r in db.query("SELECT version FROM {s}.schema_migrations ORDER BY 1")]
        assert versions == list(range(1, len(files) + 1)), versions
        m = outboxd("--database-url", database_url, "--schema", name, "migrate")
        assert m.rc == EXIT_OK and "up to date" in m.stderr, m
        relay(receiver, "--sweep-interval", "1h", schema=name)
        event_id = db.enqueue("t", {"n": 1})
        assert wait_delivered(receiver, [event_id], timeout=10)
    finally:
        db.close()


@pytest.mark.parametrize("apply_with", ["psql", "psycopg2"])
def test_sql_output_applied_by_hand_yields_a_working_outbox(outboxd, database_url, make_schema,
                                                            receiver, relay, apply_with):
    name = make_schema(migrate=False)
    r = outboxd("--schema", name, "sql")   # needs no database
    assert r.rc == EXIT_OK, r
    script = r.stdout
    assert name in script and "enqueue" in script, script[:500]
    assert not schema_exists(database_url, name), "`outboxd sql` must only print"

    if apply_with == "psql":
        _apply_with_psql(database_url, script)
    else:
        conn = psycopg2.connect(database_url)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(script)
        finally:
            conn.close()

    db = Db(database_url, name)
    try:
        applied = db.query("SELECT * FROM {s}.schema_migrations")
        assert applied, "the script did not record its migrations"
        # the binary agrees the schema is current: migrate has nothing to do
        m = outboxd("--database-url", database_url, "--schema", name, "migrate")
        assert m.rc == EXIT_OK, m
        assert db.query("SELECT * FROM {s}.schema_migrations") == applied

        event_id = db.enqueue("by.hand", {"applied_with": apply_with}, key="k")
        relay(receiver, "--sweep-interval", "1h", schema=name)
        probe = None
        assert wait_delivered(receiver, [event_id], timeout=10), receiver.ids()
        # and NOTIFY works too (the trigger came with the script)
        probe = db.enqueue("by.hand", {"probe": True})
        assert wait_delivered(receiver, [probe], timeout=5), "trigger/NOTIFY missing in `sql` output"
        assert db.wait_empty(timeout=5), db.events()
    finally:
        db.close()


@claims_only("in windows mode the suite sets every migrated outbox up for windows, which `outboxd sql` does not print")
def test_sql_output_is_the_same_as_what_migrate_applies(outboxd, database_url, make_schema):
    """Applying `outboxd sql` by hand and running `migrate` give the same objects."""
    a = make_schema(migrate=False)
    b = make_schema(migrate=False)
    # migrate itself, not make_schema's (which also sets up the suite's consume mode)
    r = outboxd("--database-url", database_url, "--schema", a, "migrate")
    assert r.rc == EXIT_OK, r
    r = outboxd("--schema", b, "sql")
    assert r.rc == EXIT_OK, r
    _apply_with_psql(database_url, r.stdout)

    def shape(schema):
        conn = psycopg2.connect(database_url)
        try:
            with conn.cursor() as cur:
                cur.execute("""
                    SELECT 'col', table_name || '.' || column_name || ':' || data_type
                             || ':' || is_nullable || ':' || coalesce(column_default, '')
                      FROM information_schema.columns WHERE table_schema = %(s)s
                    UNION ALL
                    SELECT 'idx', replace(indexdef, quote_ident(%(s)s) || '.', 'S.')
                      FROM pg_indexes WHERE schemaname = %(s)s
                    UNION ALL
                    SELECT 'fn', p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
                      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                     WHERE n.nspname = %(s)s
                    UNION ALL
                    SELECT 'trg', t.tgname || ' on ' || c.relname
                      FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                      JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = %(s)s AND NOT t.tgisinternal
                    ORDER BY 1, 2""", {"s": schema})
                rows = cur.fetchall()
        finally:
            conn.close()
        return [(k, v.replace(schema, "S")) for k, v in rows]

    assert shape(a) == shape(b)


def test_sql_takes_the_schema_from_the_configuration_like_migrate(outboxd, tmp_path):
    # No database needed to print SQL; the schema comes from the same places
    # `migrate` reads it from, the flag first.
    cfg = tmp_path / "outboxd.toml"
    cfg.write_text('[database]\nschema = "from_file"\n')
    r = outboxd("--config", cfg, "sql")
    assert r.rc == EXIT_OK, r
    assert 'CREATE SCHEMA IF NOT EXISTS "from_file";' in r.stdout
    assert '"outbox"' not in r.stdout
    r = outboxd("--config", cfg, "--schema", "flagged", "sql")
    assert r.rc == EXIT_OK and 'CREATE SCHEMA IF NOT EXISTS "flagged";' in r.stdout, r
    r = outboxd("sql", env={"OUTBOXD_SCHEMA": "from_env"})
    assert r.rc == EXIT_OK and 'CREATE SCHEMA IF NOT EXISTS "from_env";' in r.stdout, r
    cfg.write_text('[database]\nschema = "pg_nope"\n')
    r = outboxd("--config", cfg, "sql")
    assert r.rc == EXIT_USAGE and r.stdout == "", r
    assert "database.schema" in r.stderr, r.stderr


# ---------------------------------------------------------------- messages
def test_command_line_errors_are_plain_lines_not_log_records(outboxd, database_url):
    r = outboxd("--database-url", database_url, "status", "--bogus")
    assert r.rc == EXIT_USAGE, r
    assert r.stderr == "outboxd: unknown option --bogus (see `outboxd --help`)\n", r


def test_an_empty_topic_is_refused_with_the_rule_not_the_sql(outboxd, database_url, db):
    r = outboxd("--database-url", database_url, "--schema", db.schema, "enqueue", "--topic", "", "--payload", "{}")
    assert r.rc == EXIT_INVALID_INPUT, r
    assert r.stderr == ("outboxd: event refused: outbox event topic must be 1 to 255 bytes without control "
                        "characters\n"), r
    assert db.count_events() == 0


def test_a_connection_error_is_one_readable_line(outboxd):
    r = outboxd("--database-url", f"postgresql://u:pw-secret@127.0.0.1:{closed_port()}/x", "status")
    assert r.rc == EXIT_DB_UNAVAILABLE, r
    assert r.stderr.count("\n") == 1 and "\\n" not in r.stderr and "\\t" not in r.stderr, r
    assert "Connection refused" in r.stderr and "pw-secret" not in r.stderr, r
