"""Wake-up modes (README "Wake-up modes", issue 13): poll mode through a real
PgBouncer in transaction pooling, the NOTIFY self-test that notices a pooler
swallowing notifications, and the auto mode's busy -> idle transition raced by
a producer that read "busy" and commits after it. The sweep is an hour away in
every test here: a prompt delivery can only come from the wake-up under test."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from urllib.parse import urlparse

import psycopg2
import pytest
from psycopg2 import sql

from conftest import Db, install_sql_files
from helpers import claims_only, free_port, two_phase_transaction, wait_delivered, wait_until
from test_metrics import admin_port, scrape, value

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@pytest.fixture
def pgbouncer(database_url):
    """A PgBouncer in transaction pooling mode in front of the test database,
    two server connections per database and user (so a client's transactions
    land on different server connections). Yields its URL."""
    if not os.path.exists(PGBOUNCER):
        pytest.fail("pgbouncer is not installed (scripts/deps.sh installs it)", pytrace=False)
    u = urlparse(database_url)
    d = tempfile.mkdtemp(prefix="outboxd-pgbouncer-", dir="/tmp")
    os.chmod(d, 0o755)
    port = free_port()
    user = u.username or "postgres"
    with open(os.path.join(d, "users.txt"), "w") as f:
        f.write(f'"{user}" ""\n')
    with open(os.path.join(d, "pgbouncer.ini"), "w") as f:
        f.write(f"""[databases]
* = host={u.hostname or '127.0.0.1'} port={u.port or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {d}/users.txt
pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
ignore_startup_parameters = extra_float_digits,options
logfile = {d}/pgbouncer.log
pidfile = {d}/pgbouncer.pid
""")
    for name in os.listdir(d):
        os.chmod(os.path.join(d, name), 0o644)
    argv = [PGBOUNCER, os.path.join(d, "pgbouncer.ini")]
    if os.geteuid() == 0:
        argv[1:1] = ["-u", "postgres"]  # it refuses to run as root
        shutil.chown(d, "postgres")  # its log and pid file
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"postgresql://{user}@127.0.0.1:{port}{u.path or '/postgres'}"

    def up():
        try:
            psycopg2.connect(url, connect_timeout=2).close()
            return True
        except psycopg2.Error:
            return False
    try:
        assert wait_until(up, 10), f"pgbouncer did not come up: {proc.stderr.read1().decode() if proc.poll() is not None else ''}"
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(d, ignore_errors=True)


def _remove_trigger(outboxd, db):
    r = outboxd("wake-trigger", "remove", "--database-url", db.url, "--schema", db.schema)
    assert r.rc == 0, r.output()
    assert db.scalar("SELECT count(*) FROM pg_trigger WHERE tgname IN ('events_notify', 'deliveries_notify') "
                     "AND tgrelid::regclass::text LIKE %s", (f"%{db.schema}%",)) == 0


def test_two_phase_commit_producers_need_a_mode_without_the_trigger(outboxd, db, receiver, relay):
    """PostgreSQL refuses to PREPARE a transaction that ran NOTIFY. Under
    `auto` a producer's insert notifies while a relay is idle, so an
    application using PREPARE TRANSACTION (XA) cannot prepare then; without
    the trigger (`poll`, or `wal`: test_wake_wal.py) its event is delivered
    once COMMIT PREPARED makes it visible (README: Wake-up modes)."""
    r = relay(receiver, "--sweep-interval", "1h")
    assert wait_until(lambda: db.scalar("SELECT count(*) FROM {s}.relay_wake WHERE idle"), 10), r.log()
    gid = f"outboxd-test-{os.urandom(4).hex()}"
    with two_phase_transaction(db, gid) as xa:
        db.enqueue("xa", {"mode": "auto"}, conn=xa, commit=False)
        with pytest.raises(psycopg2.errors.FeatureNotSupported, match="cannot PREPARE a transaction that has "
                                                                      "executed LISTEN, UNLISTEN, or NOTIFY"):
            xa.tpc_prepare()
    r.stop()
    assert db.scalar("SELECT count(*) FROM {s}.events") == 0  # nothing half-written

    _remove_trigger(outboxd, db)
    r = relay(receiver, "--wake", "poll", "--poll-interval", "100ms", "--sweep-interval", "1h")
    with two_phase_transaction(db, gid) as xa:
        event = db.enqueue("xa", {"mode": "poll"}, conn=xa, commit=False)
        xa.tpc_prepare()
        time.sleep(0.5)
        assert event not in receiver.ids(), "a prepared transaction's event went out before COMMIT PREPARED"
        xa.tpc_commit()
    assert wait_delivered(receiver, [event], timeout=5), r.log()
    assert db.wait_empty(5), db.events()


def test_wake_trigger_remove_and_install_round_trip(outboxd, db):
    _remove_trigger(outboxd, db)
    r = outboxd("wake-trigger", "install", "--database-url", db.url, "--schema", db.schema)
    assert r.rc == 0, r.output()
    assert db.scalar("SELECT count(*) FROM pg_trigger WHERE tgname IN ('events_notify', 'deliveries_notify') "
                     "AND tgrelid::regclass::text LIKE %s", (f"%{db.schema}%",)) == 2
    # Twice is fine.
    assert outboxd("wake-trigger", "install", "--database-url", db.url, "--schema", db.schema).rc == 0


@claims_only("windows need live leases, which a transaction pooler cannot give")
def test_poll_mode_through_pgbouncer_transaction_pooling_claims_delivers_and_acknowledges(
        outboxd, db, pgbouncer, receiver, relay):
    _remove_trigger(outboxd, db)
    r = relay(receiver, "--wake", "poll", "--poll-interval", "100ms", "--sweep-interval", "1h",
              "--database-transaction-pooling", database_url=pgbouncer,
              env={"OUTBOXD_LIVE_LEASES": "false"})
    ids = [db.enqueue("t", {"n": i}) for i in range(30)]
    assert wait_delivered(receiver, ids, timeout=15), r.log()
    # Acknowledged: the outcomes were written through the pooler too.
    assert db.wait_empty(10), (db.events(), r.log())
    later = db.enqueue("t", {"n": "later"})
    assert wait_delivered(receiver, [later], timeout=5), r.log()
    assert db.wait_empty(5), r.log()
    assert "prepared statement" not in r.log()
    assert r.alive()
    # Nothing of the relay's session leaked into the pool's server connections,
    # which the application's transactions get next (synchronous_commit = off
    # would make their commits asynchronous). Both server connections at once.
    apps = [psycopg2.connect(pgbouncer) for _ in range(2)]
    try:
        seen = []
        for a in apps:
            cur = a.cursor()
            cur.execute("SELECT pg_backend_pid(), array(SELECT name || '=' || setting FROM pg_settings "
                        "WHERE source = 'session' AND name = ANY (%s) ORDER BY name)",
                        (["synchronous_commit", "plan_cache_mode", "statement_timeout",
                          "idle_in_transaction_session_timeout", "enable_seqscan", "enable_bitmapscan", "jit"],))
            seen.append(cur.fetchone())
        assert len({pid for pid, _ in seen}) == 2, seen
        assert all(not settings for _, settings in seen), f"the relay's settings leaked: {seen}"
    finally:
        for a in apps:
            a.close()


@claims_only("windows need live leases, which a transaction pooler cannot give")
def test_notify_behind_a_transaction_pooler_fails_its_self_test_loudly_and_polls(
        outboxd, db, pgbouncer, receiver, relay):
    r = relay(receiver, "--wake", "notify", "--poll-interval", "200ms", "--sweep-interval", "1h",
              "--database-transaction-pooling", database_url=pgbouncer,
              env={"OUTBOXD_LIVE_LEASES": "false"})
    assert wait_until(lambda: "notifications do not arrive" in r.log(), 10), r.log()
    assert "level=error" in next(line for line in r.log().splitlines() if "notifications do not arrive" in line)
    # Producers are no longer asked to notify (nobody would hear it).
    assert wait_until(lambda: db.scalar("SELECT count(*) FROM {s}.relay_wake WHERE idle") == 0, 5)
    started = time.monotonic()
    e = db.enqueue("t", {"n": 1})
    assert wait_delivered(receiver, [e], timeout=5), r.log()
    assert time.monotonic() - started < 2, "delivered by the sweep, not by polling"


def test_notify_self_test_passes_on_a_direct_connection(db, receiver, relay):
    r = relay(receiver, "--wake", "notify", "--sweep-interval", "1h")
    assert wait_until(lambda: db.scalar("SELECT count(*) FROM {s}.relay_wake WHERE idle") == 1, 10), r.log()
    e = db.enqueue("t", {"n": 1})
    assert wait_delivered(receiver, [e], timeout=5), r.log()
    time.sleep(2.5)  # past the self-test's deadline (creates the situation; nothing waits on it)
    assert "notifications do not arrive" not in r.log()


def _relay_state(db):
    rows = db.query("SELECT idle FROM {s}.relay_wake")
    return None if not rows else rows[0]["idle"]


class _Feeder:
    """Keeps the relay busy for as long as a test needs it: `per_statement`
    events (50) every 10 ms from its own connection (some 2,000 a second, far
    above the busy rate of 300) until stop(); entered once the relay has
    declared itself busy. A single burst is not enough:
    it is drained (in windows mode read in one go) and the relay idle again
    within ~100 ms, and in one CI run (e2e-windows, -O3 build) none of five
    tries caught it still busy when the test's producer looked."""

    def __init__(self, db, per_statement: int = 50):
        self._conn = db.connect()
        self._db = db
        self._per_statement = per_statement
        self.ids: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            rows = self._db.query("SELECT {s}.enqueue('t', jsonb_build_object('feed', g)) AS id "
                                  "FROM generate_series(1, %s) g", (self._per_statement,), conn=self._conn)
            self.ids += [row["id"] for row in rows]
            self._stop.wait(0.01)

    def __enter__(self):
        self._thread.start()
        assert wait_until(lambda: _relay_state(self._db) is False, 5), "the feeder did not make the relay busy"
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive(), "the feeder's insert hung"

    def __exit__(self, *exc):
        self.stop()


@pytest.mark.parametrize("producer", ["read_committed_inserts_before", "read_committed_inserts_long_before",
                                      "repeatable_read_inserts_after"])
def test_auto_mode_claims_promptly_a_commit_that_raced_the_relays_busy_to_idle_transition(
        database_url, db, receiver, relay, producer):
    """A producer's transaction stays open across the relay's busy -> idle
    transition and commits afterwards; the sweep is an hour away.

    read_committed_inserts_before: it inserted while the relay was declared
    busy (its trigger did not notify). Only the relay's watch of the
    transactions in progress at its transition finds it.

    read_committed_inserts_long_before: as above, with its event written 6 s
    before the relay goes idle: further back than a claim's low mark looks
    (at most 5 s), so the claim at the end of the watched transaction must
    reach back to that transaction's start (fails with a plain claim there).

    repeatable_read_inserts_after: it took its snapshot while the relay was
    busy and inserts only after the relay went idle and read what was in
    progress (it had no transaction id then: the watch cannot see it). Its
    trigger must notify: the declaration is read outside any snapshot
    (sql/0010; before, it read relay_wake in its old snapshot, saw "busy",
    and its event waited for the sweep)."""
    inserts_before = producer.startswith("read_committed_inserts")
    r = relay(receiver, "--wake", "auto", "--sweep-interval", "1h", log_level="info")
    assert wait_until(lambda: _relay_state(db) is True, 10), r.log()
    conn = db.connect()
    with _Feeder(db) as feeder:
        if inserts_before:
            event = db.enqueue("t", {"raced": True}, conn=conn, commit=False)
        else:
            conn.set_session(isolation_level="REPEATABLE READ")
            with conn.cursor() as cur:
                cur.execute("SELECT 1")  # the snapshot
        # Read after, with the feeder still running: busy when the trigger (or snapshot) read it.
        assert _relay_state(db) is False
        if producer == "read_committed_inserts_long_before":
            time.sleep(6)
        feeder.stop()
    # The relay drains the feed, finds nothing, declares itself idle.
    assert wait_until(lambda: _relay_state(db) is True, 15), r.log()
    time.sleep(0.3)  # the producer stays open across the transition (creates the race)
    if not inserts_before:
        event = db.enqueue("t", {"late": True}, conn=conn, commit=False)
    conn.commit()
    committed = time.monotonic()
    assert wait_delivered(receiver, [event], timeout=5), r.log()
    delay = time.monotonic() - committed
    assert delay < 1.0, f"the event took {delay:.2f}s after its commit"


def test_auto_mode_an_event_written_while_busy_and_due_after_the_relay_went_idle_fires_on_time(db, receiver, relay):
    """A busy relay's claims that lease events do not say when the next event
    falls due (another claim follows at once); those that find nothing before
    it declares itself idle do, and so does the claim from the start that
    follows the declaration. The delayed event's insert does not notify (the
    relay is busy then) and the sweep is an hour away: only the next-due timer
    delivers it on time (fails with neither answering: not delivered in 10 s)."""
    r = relay(receiver, "--wake", "auto", "--sweep-interval", "1h", log_level="info")
    assert wait_until(lambda: _relay_state(db) is True, 10), r.log()
    with _Feeder(db) as feeder:
        delayed = db.enqueue("t", {"delayed": True},
                             available_at=db.scalar("SELECT (now() + interval '1500 milliseconds')::text"))
        assert _relay_state(db) is False  # busy when the insert's trigger read it: it did not notify
        feeder.stop()
    due = db.scalar("SELECT extract(epoch FROM available_at)::float8 FROM {s}.events WHERE id = %s", (delayed,))
    assert wait_until(lambda: _relay_state(db) is True, 15), r.log()
    assert wait_delivered(receiver, [delayed], timeout=10), r.log()
    sent = next(rq.t_wall for rq in receiver.snapshot() if rq.event_id == delayed)
    assert sent - due < 0.5, f"delivered {sent - due:.2f}s after it fell due"


def test_a_busy_relay_claims_relay_busy_gap_apart(db, receiver, relay):
    """relay.busy_gap sets how long a busy relay waits after a claim that
    found events (what an event may wait under load, against the reads the
    relay costs the database). Under a steady ~800 events a second, 100 ms
    apart: at most ~20 claims in two seconds, where the default 5 ms makes
    some hundreds (fails if the setting is not the policy's gap). Every event
    is still delivered."""
    r = relay(receiver, "--wake", "auto", "--sweep-interval", "1h", "--busy-gap", "100ms",
              "--admin-listen", "127.0.0.1:0", log_level="info")
    port = admin_port(r)
    assert wait_until(lambda: _relay_state(db) is True, 10), r.log()
    with _Feeder(db, per_statement=10) as feeder:
        time.sleep(1)  # the delivery rate is known: claims are not cut short by the capacity of a cold start
        before = value(scrape(port), "outboxd_claims_total")
        time.sleep(2)
        claims = value(scrape(port), "outboxd_claims_total") - before
        assert _relay_state(db) is False, "the relay went idle under the feed"
        feeder.stop()
    assert claims <= 2 / 0.1 + 10, f"{claims:.0f} claims in 2 s, 100 ms apart\n{r.log()}"
    assert claims >= 5, f"{claims:.0f} claims in 2 s: the relay did not claim under load\n{r.log()}"
    assert wait_delivered(receiver, feeder.ids, timeout=15), r.log()


def test_the_trigger_notifies_only_while_a_relay_is_declared_idle_and_its_declaration_is_valid(db, database_url):
    listener = psycopg2.connect(database_url)
    listener.autocommit = True
    channel = '"' + ("outboxd." + db.schema).replace('"', '""') + '"'
    listener.cursor().execute(f"LISTEN {channel}")

    def notified_by_an_insert() -> bool:
        listener.poll()
        listener.notifies.clear()
        db.enqueue("t", {"n": 1})
        # A notification is sent at commit, before the commit returns: by the
        # time it is read here it is on its way; the wait only reads it.
        return bool(wait_until(lambda: (listener.poll(), listener.notifies)[1], 0.5))

    try:
        assert not notified_by_an_insert(), "notified with no relay at all"
        db.query("INSERT INTO {s}.relay_wake (owner, idle, until) VALUES ('busy', false, now() + interval '1 hour')")
        assert not notified_by_an_insert(), "notified while the only relay is busy"
        db.query("INSERT INTO {s}.relay_wake (owner, idle, until) VALUES ('stale', true, now() - interval '1 second')")
        assert not notified_by_an_insert(), "notified for a relay whose declaration ran out"
        db.query("INSERT INTO {s}.relay_wake (owner, idle, until) VALUES ('idle', true, now() + interval '1 hour')")
        assert notified_by_an_insert(), "not notified while a relay is idle"
    finally:
        listener.close()


def _idle_published(db) -> bool:
    """Whether the sequence the wake-up triggers read (sql/0010) says that
    some relay is idle now."""
    return db.scalar("SELECT last_value > extract(epoch FROM now()) * 1000 FROM {s}.relay_idle_until")


def test_a_relay_going_busy_while_another_declares_itself_idle_leaves_the_idle_one_published(db, database_url):
    """Relay A declares itself idle in a transaction still open while relay B
    declares itself busy. Each declaration recomputes the sequence from
    relay_wake; unless B's waits for A's commit and then sees A's row, B
    writes 0 after A's value and A is never woken again."""
    a = psycopg2.connect(database_url)
    b = psycopg2.connect(database_url)
    b.autocommit = True

    def declare(conn, owner: str, idle: bool) -> None:
        with conn.cursor() as cur:
            cur.execute(sql.SQL("INSERT INTO {}.relay_wake (owner, idle, until) "
                                "VALUES (%s, %s, now() + interval '1 hour')").format(db.s), (owner, idle))

    try:
        declare(a, "a", True)
        busy = threading.Thread(target=declare, args=(b, "b", False))
        busy.start()
        busy.join(0.5)  # B's declaration may wait for A's
        a.commit()
        busy.join(5)
        assert not busy.is_alive()
        assert _idle_published(db), db.query("SELECT * FROM {s}.relay_wake")
        # And back: A goes busy too; nobody is idle any more.
        db.query("UPDATE {s}.relay_wake SET idle = false WHERE owner = 'a'")
        assert not _idle_published(db)
    finally:
        a.close()
        b.close()


def test_migration_0010_moves_installed_triggers_to_the_sequence_and_installs_none_where_there_were_none(
        outboxd, database_url, make_schema, request):
    def triggers(db):
        return [r["def"] for r in db.query(
            "SELECT pg_get_triggerdef(t.oid) AS def FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND t.tgname LIKE '%%notify' "
            "ORDER BY 1", (db.schema,))]

    notifying, polling = make_schema(migrate=False), make_schema(migrate=False)
    for name in (notifying, polling):
        install_sql_files(database_url, name, 9)
    dbs = [Db(database_url, name) for name in (notifying, polling)]
    for d in dbs:
        request.addfinalizer(d.close)
    # What `outboxd wake-setup poll` of 0009 did.
    dbs[1].query("DROP TRIGGER events_notify ON {s}.events; DROP TRIGGER deliveries_notify ON {s}.deliveries")
    for name in (notifying, polling):
        r = outboxd("--database-url", database_url, "--schema", name, "migrate")
        assert r.rc == 0, r.output()
    got = triggers(dbs[0])
    assert len(got) == 2 and all("relay_idle_until" in t and "WHEN" in t for t in got), got
    assert triggers(dbs[1]) == []


def test_transaction_pooling_with_live_leases_is_refused_at_start(db, receiver, relay):
    r = relay(receiver, "--wake", "poll", "--database-transaction-pooling")
    assert r.wait(10) == 2, r.log()
    assert "database.transaction_pooling needs relay.live_leases = false" in r.log()


def test_a_dead_relays_declaration_is_deleted_an_hour_after_it_ran_out(db, receiver, relay):
    db.query("INSERT INTO {s}.relay_wake (owner, idle, until) VALUES "
             "('dead-long-ago', true, now() - interval '2 hours'), ('dead-just-now', true, now() - interval '1 minute')")
    r = relay(receiver, "--wake", "auto", "--sweep-interval", "1h")
    assert wait_until(lambda: db.scalar("SELECT count(*) FROM {s}.relay_wake WHERE owner LIKE 'dead%%'") == 1, 10), \
        (db.query("SELECT * FROM {s}.relay_wake"), r.log())
    assert db.scalar("SELECT owner FROM {s}.relay_wake WHERE owner LIKE 'dead%%'") == "dead-just-now"
