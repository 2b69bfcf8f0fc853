"""The configuration as a user meets it: `check-config` prints the effective
settings with secrets redacted; every bad key, type or value stops `run` with
exit 2 and a message naming the file, line, column and key; and a relay that
refuses its configuration delivers nothing and loses nothing."""

from __future__ import annotations

import base64
import os
import tomllib

import pytest

from helpers import wait_delivered, wait_until
from receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def logged(r) -> str:
    """stderr with logfmt's quoting undone (msg="... got \\"x\\"" -> got "x")."""
    return r.stderr.replace('\\"', '"')


def config_file(tmp_path, text: str) -> str:
    path = tmp_path / "outboxd.toml"
    path.write_text(text)
    return str(path)


def test_check_config_prints_the_effective_configuration_without_secrets(outboxd, tmp_path, database_url):
    url_with_password = "postgresql://relay:s3cr3t-pw@127.0.0.1:1/app"
    path = config_file(tmp_path, f"""
[database]
url = "{url_with_password}"
schema = "shop"

[defaults]
request_timeout = "3s"
signing_secrets = ["{SECRET}"]
headers = {{ Authorization = "Bearer t0ken-value" }}

[destinations.orders]
url = "https://orders.example.com/hook"
retry = {{ max_attempts = 5 }}

[destinations.audit]
type = "stdout"

[[routes]]
topics = ["orders.>"]
destinations = ["orders", "audit"]
""")
    r = outboxd("check-config", "--config", path, "--concurrency", "7", env={"OUTBOXD_LEASE": "45s"})
    assert r.rc == 0, r
    for secret in ("s3cr3t-pw", SECRET, "t0ken-value"):
        assert secret not in r.output, f"{secret!r} leaked:\n{r.output}"
    effective = tomllib.loads(r.stdout)  # valid TOML in the file's own format
    assert effective["database"]["schema"] == "shop"
    assert "***" in effective["database"]["url"]
    assert effective["relay"]["concurrency"] == 7          # flag
    assert effective["relay"]["lease"] == "45s"            # environment
    orders = effective["destinations"]["orders"]
    assert orders["request_timeout"] == "3s"               # inherited from [defaults]
    assert orders["retry"]["max_attempts"] == 5
    assert orders["retry"]["base"] == "5s"                 # merged per key
    assert orders["signing_secrets"] == ["<redacted>"]
    assert effective["destinations"]["audit"]["type"] == "stdout"
    assert effective["routes"][0]["destinations"] == ["orders", "audit"]


# (file contents, the message expected on stderr). Every value has a wrong
# type or an invalid value; positions are line:column of the key at fault.
BAD_CONFIGS = [
    ("[relay]\nconcurrency = 0\n", "outboxd.toml:2:1: relay.concurrency: expected an integer from 1 to 1024, got 0"),
    ("[relay]\nconcurrency = \"8\"\n", "relay.concurrency: expected an integer from 1 to 1024, got \"8\""),
    ("[relay]\nlease = 30\n", "relay.lease: expected a duration like \"5s\" or \"250ms\""),
    ("[relay]\nlease = \"soon\"\n", "relay.lease: expected a duration like \"5s\" or \"250ms\", got \"soon\""),
    ("[relay]\nsweep_interval = \"10ms\"\n", "relay.sweep_interval"),
    ("[relay]\nlog_level = \"loud\"\n", "relay.log_level"),
    ("[relay]\nconcurency = 4\n", "outboxd.toml:2:1: unknown key relay.concurency"),
    ("[database]\nschema = \"\"\n", "database.schema"),
    ("[egress]\nblock_private_addresses = \"yes\"\n", "egress.block_private_addresses: expected true or false, got \"yes\""),
    ("[defaults]\nconnect_timeout = \"0ms\"\n", "defaults.connect_timeout"),
    ("[defaults]\nmax_concurrency = 5000\n", "defaults.max_concurrency: expected an integer from 1 to 1024"),
    ("[defaults]\nheaders = { \"Bad Name\" = \"x\" }\n", "defaults.headers"),
    ("[defaults]\nheaders = { Content-Length = \"1\" }\n", "defaults.headers"),
    ("[defaults]\nsigning_secrets = [\"not-a-secret\"]\n", "defaults.signing_secrets[0]"),
    ("[defaults.retry]\nbase = \"2h\"\ncap = \"1h\"\n", "retry"),
    ("[defaults.retry]\nmax_attempts = 0\n", "defaults.retry.max_attempts: expected an integer from 1 to 1000"),
    ("[defaults.retry]\npermanent_statuses = [200]\n", "defaults.retry.permanent_statuses[0]"),
    ("[defaults.tls]\nverify = \"no\"\n", "defaults.tls.verify: expected true or false, got \"no\""),
    ("[destinations.a]\nurl = \"ftp://x/\"\n[[routes]]\ntopic = \">\"\ndestinations = [\"a\"]\n",
     "destinations.a.url"),
    ("[destinations.a]\ntype = \"carrier-pigeon\"\n[[routes]]\ntopic = \">\"\ndestinations = [\"a\"]\n",
     "destinations.a.type"),
    ("[destinations.\"bad name\"]\nurl = \"http://x/\"\n", "a destination name is 1 to 64 letters"),
    ("[destinations.a]\nurl = \"http://x/\"\n", "no route sends events to this destination"),
    ("[destinations.a]\nurl = \"http://x/\"\n[[routes]]\ntopics = [\"ord*\"]\ndestinations = [\"a\"]\n",
     "routes[0].topics[0]: invalid topic pattern \"ord*\""),
    ("[destinations.a]\nurl = \"http://x/\"\n[[routes]]\ntopic = \">\"\ndestinations = [\"b\"]\n",
     "routes[0].destinations[0]"),
    ("[relay\nconcurrency = 4\n", "outboxd.toml:1:"),
]


@pytest.mark.parametrize("text,message", BAD_CONFIGS, ids=[m.split(": ")[-1][:40] for _, m in BAD_CONFIGS])
def test_a_bad_configuration_stops_the_relay_with_a_clear_error_and_loses_nothing(
        text, message, outboxd, db, receiver, tmp_path):
    event_id = db.enqueue("orders.created", {"n": 1})
    needs_destination = "[destinations" not in text and "[[routes" not in text
    extra = ("--url", receiver.url) if needs_destination else ()
    r = outboxd("run", "--config", config_file(tmp_path, text), "--database-url", db.url,
                "--schema", db.schema, *extra, timeout=20)
    assert r.rc == 2, r
    assert message in logged(r), r
    assert "relay started" not in r.stderr
    assert receiver.requests == []
    assert db.event(event_id) is not None


@pytest.mark.parametrize("variable,value,message", [
    ("OUTBOXD_CONCURRENCY", "x", "OUTBOXD_CONCURRENCY: expected an integer from 1 to 1024, got \"x\""),
    ("OUTBOXD_LEASE", "1fortnight", "OUTBOXD_LEASE: expected a duration"),
    ("OUTBOXD_BLOCK_PRIVATE_ADDRESSES", "maybe", "OUTBOXD_BLOCK_PRIVATE_ADDRESSES"),
    ("OUTBOXD_SIGNING_SECRETS", "whsec_short", "OUTBOXD_SIGNING_SECRETS"),
])
def test_bad_environment_variables_are_named(variable, value, message, outboxd, db, receiver):
    r = outboxd("run", "--database-url", db.url, "--schema", db.schema, "--url", receiver.url,
                env={variable: value}, timeout=20)
    assert r.rc == 2, r
    assert message in logged(r), r
    if variable == "OUTBOXD_SIGNING_SECRETS":
        assert value not in r.output


def test_a_missing_configuration_file_is_a_usage_error(outboxd, db, tmp_path):
    r = outboxd("run", "--config", str(tmp_path / "nope.toml"), "--database-url", db.url)
    assert r.rc == 2, r
    assert "cannot read the configuration file" in r.stderr and "nope.toml" in r.stderr


def test_url_and_destinations_together_are_refused(outboxd, db, receiver, tmp_path):
    path = config_file(tmp_path, f'[destinations.a]\nurl = "{receiver.url}"\n[[routes]]\ntopic = ">"\n'
                                 'destinations = ["a"]\n')
    r = outboxd("run", "--config", path, "--url", receiver.url, "--database-url", db.url)
    assert r.rc == 2, r
    assert "--url defines the only destination" in r.stderr


def test_the_file_serves_the_database_commands_too(outboxd, database_url, tmp_path):
    schema = "cfg_" + os.urandom(4).hex()
    path = config_file(tmp_path, f'[database]\nurl = "{database_url}"\nschema = "{schema}"\n')
    try:
        assert outboxd("migrate", "--config", path).rc == 0
        enq = outboxd("enqueue", "--config", path, "--topic", "t", "--payload", "{}")
        assert enq.rc == 0, enq
        status = outboxd("status", "--config", path, "--json")
        assert status.rc == 0 and '"pending":1' in status.stdout, status
    finally:
        import psycopg2
        with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_configured_relay_delivers(db, relay, tmp_path):
    with Receiver() as rx:
        path = config_file(tmp_path, f'[relay]\nconcurrency = 4\n[destinations.only]\nurl = "{rx.url}"\n'
                                     '[[routes]]\ntopics = [">"]\ndestinations = ["only"]\n')
        relay(None, "--config", path)
        event_id = db.enqueue("anything.at.all", {"n": 1})
        assert wait_delivered(rx, [event_id], 10)
        assert db.wait_empty(timeout=5)


def test_a_token_in_a_destination_url_is_never_logged_or_printed(outboxd, db, relay, tmp_path):
    """Webhook URLs often carry a credential in the query string
    (?token=...): the logs and check-config show the path only."""
    token = "s3cr3t-" + os.urandom(6).hex()
    with Receiver(lambda req: (500, {}, b"no")) as rx:
        url = f"{rx.url}?token={token}&tenant=acme"
        r = relay(url, "--retry-base", "50ms", "--retry-cap", "100ms", "--max-attempts", "2",
                  "--sweep-interval", "1h")
        db.enqueue("t", {"n": 1})
        assert rx.wait_for(2, timeout=10)
        assert wait_until(lambda: db.count_dead_letters() == 1, 10)
        r.stop()
        assert [req.path for req in rx.snapshot()][0].endswith(f"token={token}&tenant=acme"), \
            "the receiver must still get the whole URL"
        log = r.log()
        assert "relay started" in log and "?<redacted>" in log, log
        assert token not in log, log
        dead = db.dead_letters()
        assert token not in (dead[0]["last_error"] or ""), dead

        path = config_file(tmp_path, f'[destinations.hook]\nurl = "{url}"\n\n'
                                     '[[routes]]\ntopics = [">"]\ndestinations = ["hook"]\n')
        check = outboxd("check-config", "--config", path, "--database-url", db.url)
        assert check.rc == 0, check
        assert token not in check.output and "?<redacted>" in check.output, check


def test_signing_secrets_written_in_the_file_are_warned_about(outboxd, db, tmp_path):
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    path = config_file(tmp_path, f'[destinations.hook]\nurl = "http://127.0.0.1:9/x"\n'
                                 f'signing_secrets = ["{secret}"]\n\n'
                                 '[[routes]]\ntopics = [">"]\ndestinations = ["hook"]\n')
    check = outboxd("check-config", "--config", path, "--database-url", db.url)
    assert check.rc == 0, check
    assert "signing_secrets_env" in check.stderr and "hook" in check.stderr, check.stderr
    assert secret not in check.output


def test_database_commands_do_not_need_the_delivery_secrets(outboxd, database_url, tmp_path):
    """Operators and migration jobs run status, dead and migrate with the
    relay's configuration file but without its signing secrets."""
    schema = "cfg_" + os.urandom(4).hex()
    path = config_file(tmp_path, f'[database]\nurl = "{database_url}"\nschema = "{schema}"\n\n'
                                 '[destinations.hook]\nurl = "http://127.0.0.1:9/x"\n'
                                 'signing_secrets_env = "HOOK_SECRETS_NOT_SET_HERE"\n\n'
                                 '[[routes]]\ntopics = [">"]\ndestinations = ["hook"]\n')
    try:
        for args in (["migrate"], ["status"], ["dead", "list"], ["enqueue", "--topic", "t", "--payload", "{}"]):
            r = outboxd(*args, "--config", path)
            assert r.rc == 0, r
        run = outboxd("check-config", "--config", path)
        assert run.rc == 2 and "HOOK_SECRETS_NOT_SET_HERE" in run.stderr, run
    finally:
        import psycopg2
        with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_log_format_is_a_global_option_read_like_log_level(outboxd):
    """--log-format (and OUTBOXD_LOG_FORMAT, relay.log_format) is accepted
    before or after any command, validated and shown by check-config."""
    base = ("--database-url", "postgresql://127.0.0.1:9/none", "--url", "stdout")
    r = outboxd("--log-format", "json", "check-config", *base)
    assert r.rc == 0, r
    assert tomllib.loads(r.stdout)["relay"]["log_format"] == "json"
    r = outboxd("check-config", *base, env={"OUTBOXD_LOG_FORMAT": "json"})
    assert r.rc == 0 and tomllib.loads(r.stdout)["relay"]["log_format"] == "json", r
    r = outboxd("check-config", *base, "--log-format", "xml")
    assert r.rc == 2, r
    assert r.stderr == 'outboxd: --log-format: expected logfmt or json, got "xml"\n', r
    r = outboxd("sql", "--log-format", "json")  # every command, like --log-level
    assert r.rc == 0, r
