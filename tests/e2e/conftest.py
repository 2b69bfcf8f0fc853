"""Fixtures for the end-to-end suite: the real outboxd binary, a real PostgreSQL
and a real HTTP receiver (receiver.py).

Environment:
  OUTBOXD_TEST_DATABASE_URL  a throwaway cluster (superuser); every test makes
                             and drops its own schema in it          (required)
  OUTBOXD_BIN                the built binary                        (required)
  OUTBOXD_TEST_PG_SCRIPT     scripts/pg.sh, for tests that restart PostgreSQL
                             (default: scripts/pg.sh of this checkout)

Run: OUTBOXD_BIN=build/outboxd OUTBOXD_TEST_DATABASE_URL=postgresql://... \
     /usr/bin/python3 -m pytest -q tests/e2e

Rules the tests follow: every wait is a condition with a deadline (the
receiver's Condition, or a short-interval poll of the database with an overall
deadline); a fixed sleep is only ever used to *create* a situation (an outage
of a given length), never to synchronise with the relay.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import psycopg2
import psycopg2.extras
import pytest
from psycopg2 import sql

from helpers import suite_consume_mode, wait_until
from receiver import Receiver

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# outboxd exit codes (see the CLI help)
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_DB_UNAVAILABLE = 3
EXIT_SCHEMA_MISSING = 4
EXIT_SCHEMA_NEWER = 5
EXIT_INVALID_INPUT = 6
EXIT_PERMISSION_DENIED = 7
EXIT_DB_UNSUITABLE = 8

# How long a one-shot CLI command may take before the test calls it hung.
CLI_TIMEOUT = 20

# application_name of the tests' own connections, so queries on
# pg_stat_activity can tell them apart from the relay's.
TEST_APP = "outboxd-e2e"


# --------------------------------------------------------------------------
# failure reporting: let fixtures know whether the test failed
# --------------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def _test_failed(request) -> bool:
    for when in ("setup", "call"):
        rep = getattr(request.node, "rep_" + when, None)
        if rep is not None and rep.failed:
            return True
    return False


def clean_env(extra: Optional[dict] = None) -> dict:
    """The environment for an outboxd child: ours minus everything that could
    configure outboxd or libpq behind the test's back."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("OUTBOXD_") or k.startswith("PG") or k == "DATABASE_URL")
    }
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)  # not set at all (e.g. to leave a setting to the file)
        else:
            env[k] = v
    return env


def _slug(text: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:limit] or "t"


# --------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------
@pytest.fixture(scope="session")
def database_url() -> str:
    url = os.environ.get("OUTBOXD_TEST_DATABASE_URL")
    if not url:
        pytest.fail(
            "OUTBOXD_TEST_DATABASE_URL is not set: point it at a throwaway PostgreSQL 15 "
            "cluster (superuser), e.g. postgresql://postgres@127.0.0.1:54329/postgres",
            pytrace=False,
        )
    try:
        psycopg2.connect(url, connect_timeout=5).close()
    except psycopg2.Error as e:
        pytest.fail(f"OUTBOXD_TEST_DATABASE_URL is not reachable: {e}", pytrace=False)
    return url


@pytest.fixture(scope="session")
def outboxd_bin() -> str:
    path = os.environ.get("OUTBOXD_BIN")
    if not path:
        pytest.fail("OUTBOXD_BIN is not set: point it at the built binary (build/outboxd)",
                    pytrace=False)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"OUTBOXD_BIN={path!r} is not an executable file", pytrace=False)
    return os.path.abspath(path)


# --------------------------------------------------------------------------
# one-shot CLI
# --------------------------------------------------------------------------
class CliResult:
    def __init__(self, args, rc, stdout, stderr, elapsed):
        self.args, self.rc, self.stdout, self.stderr, self.elapsed = args, rc, stdout, stderr, elapsed

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def __repr__(self):
        return (f"<outboxd {' '.join(map(str, self.args))}: rc={self.rc} in {self.elapsed:.2f}s\n"
                f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}>")


@pytest.fixture(scope="session")
def outboxd(outboxd_bin):
    """outboxd(*args, timeout=, input=, env=) -> CliResult. Runs the binary with a
    scrubbed environment; a command that hangs fails the test."""

    def run(*args, timeout: float = CLI_TIMEOUT, input: Optional[str] = None,
            env: Optional[dict] = None) -> CliResult:
        argv = [outboxd_bin, *map(str, args)]
        t0 = time.monotonic()
        try:
            p = subprocess.run(argv, input=input, capture_output=True, text=True,
                               timeout=timeout, env=clean_env(env))
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"outboxd {' '.join(map(str, args))} did not finish within {timeout}s\n"
                        f"stdout: {e.stdout!r}\nstderr: {e.stderr!r}")
        result = CliResult(args, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
        return result

    return run


# --------------------------------------------------------------------------
# processes started by a test (relays); schema teardown stops them first
# --------------------------------------------------------------------------
class Relay:
    """A running `outboxd run` process."""

    def __init__(self, argv, log_path: Path, out_path: Path, env: dict):
        self.argv = argv
        self.log_path = log_path
        self.out_path = out_path
        self._log = open(log_path, "wb")
        self._out = open(out_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=self._log, env=env, start_new_session=True)
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self):
        return self.proc.poll()

    def send_signal(self, sig=signal.SIGTERM) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig=signal.SIGTERM, timeout: float = 10.0) -> int:
        """Send ``sig`` and wait up to ``timeout`` s; returns the exit code.
        A relay that does not exit in time is killed and the test fails."""
        if self.alive():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"outboxd did not exit within {timeout}s after {signal.Signals(sig).name}; "
                    f"killed.\n--- log ---\n{self.log()}")
        self._close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)
        self._close()

    def _close(self) -> None:
        for f in (self._log, self._out):
            if not f.closed:
                f.close()

    def log(self) -> str:
        """stderr so far."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")


class ProcessRegistry:
    def __init__(self):
        self.relays: list[Relay] = []

    def stop_all(self) -> None:
        for r in self.relays:
            if r.alive():
                try:
                    r.stop(signal.SIGTERM, timeout=10)
                except AssertionError:
                    pass  # killed; the log is printed by the relay fixture on failure
            r._close()


@pytest.fixture
def _procs():
    reg = ProcessRegistry()
    yield reg
    for r in reg.relays:
        r.kill()


# --------------------------------------------------------------------------
# schemas
# --------------------------------------------------------------------------
def admin_execute(url: str, statement, args=None) -> None:
    conn = psycopg2.connect(url, connect_timeout=5)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SET lock_timeout = '10s'")
            cur.execute(statement, args)
    finally:
        conn.close()


def apply_printed_sql(url: str, script: str) -> None:
    """Runs what a `--print` of outboxd wrote (BEGIN ... COMMIT), as a
    migration tool would, in one transaction."""
    conn = psycopg2.connect(url, connect_timeout=5)
    try:
        conn.cursor().execute(script.replace("BEGIN;", "").replace("COMMIT;", ""))
        conn.commit()
    finally:
        conn.close()


def install_sql_files(url: str, schema: str, upto: int, after: int = 0) -> None:
    """The migration files of sql/ after number `after` up to number `upto`,
    each applied with psql as a user's migration tool would (each records
    itself)."""
    psql = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
    for f in sorted((REPO / "sql").glob("[0-9][0-9][0-9][0-9]_*.sql"))[after:upto]:
        p = subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", f"schema={schema}", "-d", url,
                            "-1", "-f", str(f)], capture_output=True, text=True, timeout=30, env=clean_env())
        assert p.returncode == 0, f"{f.name}: {p.stderr}"


def schema_exists(url: str, name: str) -> bool:
    conn = psycopg2.connect(url, connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (name,))
            return cur.fetchone() is not None
    finally:
        conn.close()


@pytest.fixture
def make_schema(request, database_url, outboxd, _procs):
    """make_schema(migrate=True, name=None, url=None) -> name. A unique schema,
    migrated with `outboxd migrate` unless migrate=False; dropped (CASCADE) at
    teardown after every relay of the test was stopped."""
    made: list[tuple[str, str]] = []
    base = "e2e_" + _slug(request.node.name, 28)

    def make(migrate: bool = True, name: Optional[str] = None, url: Optional[str] = None) -> str:
        url = url or database_url
        name = name or f"{base}_{secrets.token_hex(3)}"
        made.append((url, name))
        if migrate:
            r = outboxd("--database-url", url, "--schema", name, "migrate")
            assert r.rc == EXIT_OK, f"outboxd migrate failed: {r!r}"
            # Set up for the suite's consume mode before any event is
            # written: migrate leaves an outbox set up for windows (sql/0016);
            # the claims suite takes that away, as its users would.
            if suite_consume_mode() == "claims":
                r = outboxd("--database-url", url, "--schema", name, "consume-setup", "claims")
                assert r.rc == EXIT_OK, f"outboxd consume-setup claims failed: {r!r}"
        return name

    yield make
    _procs.stop_all()
    for url, name in made:
        try:
            admin_execute(url, sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        except psycopg2.OperationalError:
            pass  # its cluster is gone already (pg_cluster tests)


@pytest.fixture
def schema(make_schema) -> str:
    """A fresh, migrated schema in OUTBOXD_TEST_DATABASE_URL."""
    return make_schema()


# --------------------------------------------------------------------------
# database helper
# --------------------------------------------------------------------------
# An event row is due: its time has come and no lease runs (a lease's end is
# in leased_until since sql/0014).
EVENT_DUE = "available_at <= now() AND (leased_until IS NULL OR leased_until <= now())"


class Db:
    """psycopg2 connection (autocommit off) to one outbox schema, plus helpers.

    Every helper commits (or rolls back) its own statement, so no snapshot or
    lock is held between calls; use ``conn`` directly for multi-statement
    transactions a test controls.
    """

    def __init__(self, url: str, schema: str):
        self.url = url
        self.schema = schema
        self.s = sql.Identifier(schema)
        self.conn = psycopg2.connect(url, connect_timeout=5, application_name=TEST_APP)
        self.conn.autocommit = False
        self._others: list = []

    def close(self) -> None:
        for c in [self.conn, *self._others]:
            try:
                c.rollback()
            except psycopg2.Error:
                pass
            c.close()

    def connect(self):
        """Another connection (autocommit off), closed with this helper."""
        c = psycopg2.connect(self.url, connect_timeout=5, application_name=TEST_APP)
        c.autocommit = False
        self._others.append(c)
        return c

    def t(self, name: str) -> sql.Composed:
        """Qualified identifier schema.name."""
        return sql.SQL("{}.{}").format(self.s, sql.Identifier(name))

    # -- raw queries ------------------------------------------------------
    def query(self, statement, args=None, conn=None) -> list:
        """Run one statement in its own transaction; returns all rows (dicts)."""
        conn = conn or self.conn
        try:
            with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
                if isinstance(statement, str):
                    statement = sql.SQL(statement).format(s=self.s)
                cur.execute(statement, args)
                rows = cur.fetchall() if cur.description else []
            conn.commit()
            return rows
        except Exception:
            conn.rollback()
            raise

    def scalar(self, statement, args=None, conn=None):
        rows = self.query(statement, args, conn)
        return next(iter(rows[0].values())) if rows else None

    # -- outbox -----------------------------------------------------------
    def enqueue(self, topic: str, payload, key: Optional[str] = None,
                idempotency_key: Optional[str] = None, headers: Optional[dict] = None,
                available_at=None, conn=None, commit: bool = True) -> int:
        """SELECT S.enqueue(...) and commit (unless commit=False: then the
        caller's transaction on ``conn`` stays open). Returns the event id."""
        conn = conn or self.conn
        # Positional arguments, only as many as needed: the later parameters
        # have defaults (headers '{}', available_at now()).
        args = [topic, json.dumps(payload), key, idempotency_key,
                json.dumps(headers if headers is not None else {}), available_at]
        casts = ["text", "jsonb", "text", "text", "jsonb", "timestamptz"]
        given = [True, True, key is not None, idempotency_key is not None,
                 headers is not None, available_at is not None]
        n = max(i + 1 for i, g in enumerate(given) if g)
        placeholders = sql.SQL(", ").join(sql.SQL("%s::" + casts[i]) for i in range(n))
        stmt = sql.SQL("SELECT {}.enqueue({})").format(self.s, placeholders)
        try:
            with conn.cursor() as cur:
                cur.execute(stmt, args[:n])
                event_id = cur.fetchone()[0]
            if commit:
                conn.commit()
        except Exception:
            conn.rollback()
            raise
        return event_id

    def events(self) -> list:
        return self.query(f"SELECT *, {EVENT_DUE} AS due FROM {{s}}.events ORDER BY id")

    def event(self, event_id: int) -> Optional[dict]:
        rows = self.query(f"SELECT *, {EVENT_DUE} AS due FROM {{s}}.events WHERE id = %s",
                          (event_id,))
        return rows[0] if rows else None

    def deliveries(self, event_id: Optional[int] = None) -> list:
        """Per-destination delivery state of fanned-out events (sql/0002)."""
        if event_id is None:
            return self.query("SELECT *, available_at <= now() AS due FROM {s}.deliveries "
                              "ORDER BY event_id, destination")
        return self.query("SELECT *, available_at <= now() AS due FROM {s}.deliveries "
                          "WHERE event_id = %s ORDER BY destination", (event_id,))

    def retry_state(self, event_id: int, destination: str = "default") -> Optional[dict]:
        """Where a failing event's retry state lives: its delivery row for
        ``destination`` once fanned out (after any failed attempt), else the
        event row itself (never tried, in flight, or no route)."""
        rows = self.query("SELECT d.attempts, d.last_error, d.lease_owner, d.available_at, "
                          "d.available_at <= now() AS due FROM {s}.deliveries d "
                          "WHERE d.event_id = %s AND d.destination = %s", (event_id, destination))
        if rows:
            return rows[0]
        row = self.event(event_id)
        return None if row is None or row["fanned_out"] else row

    def message_id(self, event_id: int) -> str:
        """The event's webhook-id (sql/0005)."""
        return self.scalar("SELECT {s}.message_id(%s)", (event_id,))

    def count_events(self) -> int:
        return self.scalar("SELECT count(*) FROM {s}.events")

    def count_dead_letters(self) -> int:
        return self.scalar("SELECT count(*) FROM {s}.dead_letters")

    def dead_letters(self) -> list:
        return self.query("SELECT * FROM {s}.dead_letters")

    def relay_sessions(self) -> list:
        """The relays' sessions on this database, with what each ran last:
        those with the relay's default application_name, ``outboxd``. (Not
        "whose last statement names the schema": pg_stat_activity keeps a
        statement's first 1024 bytes, and the claim's comments fill them, so
        the claim connection would go unseen.) e2e suites run one at a time
        and every test stops its relays, so these are the running test's."""
        return self.query(
            """SELECT pid, state, state_change, query, now() - state_change AS idle_for
                 FROM pg_stat_activity
                WHERE backend_type = 'client backend' AND datname = current_database()
                  AND application_name = 'outboxd' AND pid <> pg_backend_pid()""")

    def wait_relay_quiet(self, quiet: float = 0.3, timeout: float = 5.0) -> bool:
        """Until every session of the relay(s) has been idle for ``quiet``
        seconds: the relay has finished what it was doing (e.g. the claim
        that follows a completed delivery) and sleeps until its next
        wake-up."""
        def quiet_now():
            rows = self.relay_sessions()
            return rows and all(r["state"] == "idle" and r["idle_for"].total_seconds() >= quiet for r in rows)
        return bool(wait_until(quiet_now, timeout, interval=0.05))

    def relay_statements_during(self, seconds: float) -> int:
        """How many times, sampled every 10 ms for ``seconds``, a session of
        the relay(s) was seen to have started or finished a statement since
        the last sample. Counts the relay's own work only, unlike
        pg_stat_database's counters, which autovacuum moves too. A relay that
        stays asleep scores 0; one that spins scores about one per sample."""
        def seen():
            return {(r["pid"], r["state_change"]) for r in self.relay_sessions()}
        last = seen()
        changes = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.01)
            now = seen()
            changes += len(now - last)
            last = now
        return changes

    def wait_empty(self, timeout: float = 5.0) -> bool:
        """Until the hot table holds no rows (everything delivered and acked)."""
        return bool(wait_until(lambda: self.count_events() == 0, timeout))


@pytest.fixture
def db(database_url, schema):
    d = Db(database_url, schema)
    yield d
    d.close()


# --------------------------------------------------------------------------
# receiver
# --------------------------------------------------------------------------
@pytest.fixture
def receiver():
    """A running receiver that answers 200 to everything."""
    with Receiver() as rx:
        yield rx


# --------------------------------------------------------------------------
# relay factory
# --------------------------------------------------------------------------
@pytest.fixture
def relay(request, outboxd_bin, database_url, _procs, tmp_path):
    """relay(url_or_receiver, *extra_args, database_url=None, schema=None,
    env=None, log_level="debug") -> Relay.

    Starts `outboxd --log-level L run --database-url U --schema S --url URL
    [extra args]` with stderr in a per-test log file (printed when the test
    fails). Every relay is stopped at teardown (SIGTERM, then SIGKILL).
    ``schema`` defaults to the test's `schema` fixture.
    """
    default_database_url = database_url
    started: list[Relay] = []

    def start(target, *extra, database_url: Optional[str] = None, schema: Optional[str] = None,
              env: Optional[dict] = None, log_level: str = "debug") -> Relay:
        url = target.url if isinstance(target, Receiver) else target
        if schema is None:
            schema = request.getfixturevalue("schema")
        argv = [outboxd_bin, "--log-level", log_level, "run",
                "--database-url", database_url or default_database_url,
                "--schema", schema]
        if url is not None:
            argv += ["--url", url]
        argv += [str(a) for a in extra]
        n = len(started) + 1
        # The suite's relays run in its consume mode (relay.consume), unless
        # a test sets one itself (the default, "auto", is test_consume_auto's;
        # None: not in the environment).
        env = {"OUTBOXD_CONSUME": suite_consume_mode(), **(env or {})}
        r = Relay(argv, tmp_path / f"relay{n}.log", tmp_path / f"relay{n}.out", clean_env(env))
        started.append(r)
        _procs.relays.append(r)
        return r

    yield start

    failed = _test_failed(request)
    for i, r in enumerate(started, 1):
        if r.alive():
            try:
                r.stop(signal.SIGTERM, timeout=10)
            except AssertionError as e:
                print(e)
        r._close()
        if failed:
            print(f"\n===== relay {i} (pid {r.pid}, exit {r.returncode}): "
                  f"{' '.join(r.argv)}\n{r.log()}"
                  + (f"\n----- stdout -----\n{r.stdout()}" if r.stdout() else ""))


# --------------------------------------------------------------------------
# private PostgreSQL clusters (for tests that stop/restart the server)
# --------------------------------------------------------------------------
class PgCluster:
    """A throwaway cluster managed by scripts/pg.sh (start DIR [PORT] / stop DIR /
    restart DIR). ``url`` is the URL pg.sh printed on its last stdout line."""

    def __init__(self, script: str, directory: str, port: Optional[int] = None):
        self.script = script
        self.dir = directory
        self.port = port
        self.url: Optional[str] = None

    def _run(self, *args, timeout: float = 60) -> str:
        p = subprocess.run(["bash", self.script, *map(str, args)], capture_output=True,
                           text=True, timeout=timeout, cwd="/tmp", env=clean_env())
        if p.returncode != 0:
            raise AssertionError(f"pg.sh {' '.join(map(str, args))} failed (rc={p.returncode})\n"
                                 f"stdout: {p.stdout}\nstderr: {p.stderr}")
        return p.stdout

    def start(self) -> str:
        # --fast: fsync off; a clean (fast) shutdown still writes everything committed
        args = ["--fast", "start", self.dir] + ([self.port] if self.port else [])
        out = self._run(*args)
        lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
        assert lines, "pg.sh start printed no URL"
        url = lines[-1]
        assert url.startswith(("postgres://", "postgresql://")), f"pg.sh start printed {url!r}"
        if self.url is not None:
            assert url == self.url, f"cluster came back on another URL: {url} != {self.url}"
        self.url = url
        if self.port is None:
            m = re.search(r":(\d+)/", url)
            if m:
                self.port = int(m.group(1))
        return url

    def stop(self) -> None:
        self._run("stop", self.dir)

    def restart(self) -> None:
        self._run("restart", self.dir)


@pytest.fixture
def pg_cluster(request):
    """pg_cluster() -> PgCluster, started; stopped and removed at teardown."""
    script = os.environ.get("OUTBOXD_TEST_PG_SCRIPT") or str(REPO / "scripts" / "pg.sh")
    clusters: list[PgCluster] = []

    def make() -> PgCluster:
        if not os.path.isfile(script):
            pytest.fail(f"PostgreSQL helper script {script!r} not found "
                        "(set OUTBOXD_TEST_PG_SCRIPT)", pytrace=False)
        d = tempfile.mkdtemp(prefix="outboxd-e2e-pg-", dir="/tmp")
        os.chmod(d, 0o755)  # the postgres OS user must be able to use it
        c = PgCluster(script, d)
        clusters.append(c)
        c.start()
        return c

    yield make

    # relays of the test are stopped by the relay fixture (set up after this one)
    for c in clusters:
        try:
            c.stop()
        except Exception as e:  # noqa: BLE001 - best effort, then remove the files
            print(f"pg.sh stop {c.dir}: {e}")
        shutil.rmtree(c.dir, ignore_errors=True)
