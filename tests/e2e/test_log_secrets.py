"""No secret in any log line, in either log format, whatever goes wrong.

One relay runs with every kind of secret outboxd knows configured: a
password in the database URL, signing secrets (from the environment and
written in the file), secret header values, a token in a destination URL's
query string. Its destinations fail in every way a delivery can (bad auth
answered by a receiver that echoes the credentials it was sent, 500s,
timeouts, a TLS failure, a refused connection) and its database is
restarted and then down for a while, all at debug level. Every line it
writes is captured and searched for every secret, and checked to be a
well-formed record of the chosen format. The one-shot commands get the same
treatment.

The format is chosen with OUTBOXD_LOG_FORMAT.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import time
from pathlib import Path

import pytest

from conftest import EXIT_DB_UNAVAILABLE, EXIT_OK, EXIT_USAGE, Db
from helpers import closed_port, wait_until
from receiver import Receiver
from tls_certs import make_tls_files

FORMATS = ["logfmt", "json"]
LOGFMT_LINE = re.compile(r'^ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(debug|info|warn|error) msg=')


def new_signing_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


class Secrets:
    """Every secret of one test run, each unique to it."""

    def __init__(self):
        tag = secrets.token_hex(6)
        self.db_password = f"dbpw{tag}Z9"
        self.env_secrets = [new_signing_secret(), new_signing_secret()]
        self.file_secret = new_signing_secret()
        self.auth_token = f"tok{secrets.token_hex(10)}"
        self.api_key = f"key{secrets.token_hex(10)}"
        self.url_token = f"qry{secrets.token_hex(10)}"

    def needles(self) -> dict:
        """name -> text that must never appear. A signing secret is looked for
        whole and as its key's base64 alone; a header value whole and as its
        token alone (a line that cut 'Bearer ' off would still leak it)."""
        out = {"database password": self.db_password, "header token": self.auth_token,
               "header api key": self.api_key, "url query token": self.url_token,
               "header value": f"Bearer {self.auth_token}"}
        for i, s in enumerate(self.env_secrets + [self.file_secret]):
            out[f"signing secret {i}"] = s
            out[f"signing key {i}"] = s.removeprefix("whsec_")
        return out


def with_password(url: str, password: str) -> str:
    """postgresql://user@host/db -> postgresql://user:password@host/db"""
    m = re.match(r"^(postgres(?:ql)?://)([^:@/]+)@(.*)$", url)
    assert m, f"cannot put a password into {url!r}"
    return f"{m.group(1)}{m.group(2)}:{password}@{m.group(3)}"


def check_lines(text: str, fmt: str, where: str) -> list:
    """Every line is one record of the format; returns them parsed (json) or raw."""
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if fmt == "json":
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise AssertionError(f"{where} line {n} is not JSON ({e}): {line!r}") from None
            assert isinstance(record, dict), f"{where} line {n}: {line!r}"
            assert list(record)[:3] == ["ts", "level", "msg"], f"{where} line {n}: {line!r}"
            assert all(isinstance(v, str) for v in record.values()), f"{where} line {n}: {line!r}"
            records.append(record)
        else:
            assert LOGFMT_LINE.match(line), f"{where} line {n} is not a logfmt record: {line!r}"
            records.append(line)
    return records


def assert_no_secret(text: str, s: Secrets, where: str) -> None:
    # JSON escapes '/' nowhere and base64 holds no '"' or '\\', so every
    # needle appears verbatim if it appears at all; the unescaped text is
    # searched too in case a line escaped something.
    unescaped = text.replace("\\/", "/")
    for name, needle in s.needles().items():
        for haystack in (text, unescaped):
            at = haystack.find(needle)
            if at >= 0:
                start = haystack.rfind("\n", 0, at) + 1
                end = haystack.find("\n", at)
                raise AssertionError(f"{where}: the {name} leaked:\n{haystack[start:end if end >= 0 else None]}")


def write_config(path: Path, s: Secrets, ok: Receiver, auth: Receiver, flaky: Receiver, slow: Receiver,
                 tls: Receiver, ca_file: str) -> Path:
    path.write_text(f"""
[relay]
sweep_interval = "500ms"

[defaults]
signing_secrets_env = "OUTBOXD_TEST_SIGNING_SECRETS"
headers = {{ Authorization = "Bearer {s.auth_token}", X-Api-Key = "{s.api_key}" }}
retry = {{ base = "100ms", cap = "300ms", max_attempts = 3 }}
# Every failure is to reach the log, attempt after attempt: no circuit opens.
circuit = {{ failures = 0 }}

[destinations.ok]
url = "{ok.url}?token={s.url_token}"

[destinations.auth]
url = "{auth.url}?token={s.url_token}"
signing_secrets = ["{s.file_secret}"]

[destinations.flaky]
url = "{flaky.url}"

[destinations.slow]
url = "{slow.url}?token={s.url_token}"
request_timeout = "300ms"

[destinations.tls]
url = "{tls.url}?token={s.url_token}"
tls = {{ ca_file = "{ca_file}" }}

[destinations.refused]
url = "http://127.0.0.1:{closed_port()}/hook?token={s.url_token}"
connect_timeout = "500ms"

[[routes]]
topic = "secret.>"
destinations = ["ok", "auth", "flaky", "slow", "tls", "refused"]
""")
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_secret_in_any_log_line_of_a_run_full_of_failures(fmt, pg_cluster, make_schema, relay, tmp_path):
    s = Secrets()
    cluster = pg_cluster()
    url = with_password(cluster.url, s.db_password)
    schema = make_schema(url=url)
    db = Db(cluster.url, schema)
    files = make_tls_files(tmp_path / "tls")

    def echo_credentials(req):
        # Some receivers quote what they refused; that text reaches last_error.
        return 401, {}, f"invalid credentials: {req.headers.get('authorization')} " \
                        f"{req.headers.get('x-api-key')} for {req.path}".encode()

    def slowly(_req):
        time.sleep(1.0)  # longer than the destination's request_timeout
        return 200, {}, b"late"

    with Receiver() as ok, Receiver(echo_credentials) as auth, \
            Receiver(lambda _r: (500, {}, b"boom")) as flaky, Receiver(slowly) as slow, \
            Receiver(tls=files.wrong_host) as tls:
        config = write_config(tmp_path / "outboxd.toml", s, ok, auth, flaky, slow, tls, str(files.ca_cert))
        r = relay(None, "--config", config, database_url=url, schema=schema, log_level="debug",
                  env={"OUTBOXD_LOG_FORMAT": fmt,
                       "OUTBOXD_TEST_SIGNING_SECRETS": " ".join(s.env_secrets),
                       "OUTBOXD_DATABASE_CONNECT_TIMEOUT": "2s"})
        first = [db.enqueue("secret.a", {"n": i}) for i in range(3)]
        assert ok.wait_until(lambda reqs: {q.event_id for q in reqs} >= set(first), 15), r.log()
        # Each failing destination has failed for good at least once.
        assert wait_until(lambda: db.count_dead_letters() >= 5 * len(first), 20), r.log()
        assert auth.requests and flaky.requests and tls.tls_failures > 0

        # The database restarts, then is away for a while.
        restored = r.log().count("listen connection restored")
        db.close()
        cluster.restart()
        assert wait_until(lambda: r.log().count("listen connection restored") > restored, 20), r.log()
        cluster.stop()
        time.sleep(1.5)  # an outage of this length
        cluster.start()
        db = Db(cluster.url, schema)
        second = [db.enqueue("secret.b", {"n": i}) for i in range(3)]
        assert ok.wait_until(lambda reqs: {q.event_id for q in reqs} >= set(second), 30), r.log()
        assert wait_until(lambda: db.count_dead_letters() >= 5 * (len(first) + len(second)), 20), r.log()
        assert r.stop() == EXIT_OK
    # What `dead list` and `status` print comes from these rows: the
    # receiver's quote of the credentials was cut out before it was stored.
    stored = "\n".join(row["t"] for row in db.query(
        "SELECT row_to_json(d)::text AS t FROM {s}.dead_letters d UNION ALL "
        "SELECT row_to_json(v)::text FROM {s}.deliveries v UNION ALL "
        "SELECT row_to_json(e)::text FROM {s}.events e"))
    assert "invalid credentials: <redacted> <redacted> for /hook?<redacted>" in stored, stored
    assert_no_secret(stored, s, "the outbox tables")
    db.close()

    log = r.log()
    records = check_lines(log, fmt, "relay stderr")
    text = log if fmt == "logfmt" else "\n".join(json.dumps(rec) for rec in records)
    # The run did go through the failures this test is about.
    for expected in ("relay started", "delivery failed; will retry", "moving to dead letters", "HTTP 401",
                     "HTTP 500", "certificate verify failed", "timeout after 300 ms", "Connection refused",
                     "listen connection lost",
                     "listen connection restored", "signing secrets are written in the configuration file"):
        assert expected in text, f"{expected!r} not in the log:\n{log}"
    assert "?<redacted>" in text, log  # destination URLs were logged, their tokens cut out
    assert_no_secret(log, s, "relay stderr")
    assert_no_secret(r.stdout(), s, "relay stdout")


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_secret_in_what_one_shot_commands_print(fmt, outboxd, database_url, make_schema, tmp_path):
    s = Secrets()
    url = with_password(database_url, s.db_password)
    schema = make_schema(url=url)
    env = {"OUTBOXD_LOG_FORMAT": fmt, "OUTBOXD_TEST_SIGNING_SECRETS": " ".join(s.env_secrets)}
    config = tmp_path / "outboxd.toml"
    config.write_text(f"""
[defaults]
signing_secrets_env = "OUTBOXD_TEST_SIGNING_SECRETS"
headers = {{ Authorization = "Bearer {s.auth_token}", X-Api-Key = "{s.api_key}" }}

[destinations.a]
url = "http://127.0.0.1:9/hook?token={s.url_token}"
signing_secrets = ["{s.file_secret}"]

[[routes]]
topic = ">"
destinations = ["a"]
""")
    common = ["--log-level", "debug", "--config", config, "--database-url", url, "--schema", schema]
    runs = [
        outboxd(*common, "migrate", env=env),
        outboxd(*common, "enqueue", "--topic", "t", "--payload", "{}", env=env),
        outboxd(*common, "status", env=env),
        outboxd(*common, "dead", "list", env=env),
        outboxd(*common, "dead", "replay", "--all", env=env),
        outboxd(*common, "check-config", env=env),
    ]
    for r in runs:
        assert r.rc == EXIT_OK, r
    # Failures: the database refuses connections (password in both URL and
    # key=value form), a secret that is not one, an unset secret variable.
    dead_port = closed_port()
    failing = [
        (outboxd("--database-url", f"postgresql://relay:{s.db_password}@127.0.0.1:{dead_port}/app",
                 "--schema", schema, "status", env=env), EXIT_DB_UNAVAILABLE),
        (outboxd("--database-url", f"host=127.0.0.1 port={dead_port} user=relay password={s.db_password}",
                 "--url", "http://127.0.0.1:9/hook", "run", env=env), EXIT_DB_UNAVAILABLE),
        (outboxd(*common, "--signing-secret", s.auth_token, "check-config", env=env), EXIT_USAGE),
        (outboxd(*common, "check-config", env={"OUTBOXD_LOG_FORMAT": fmt}), EXIT_USAGE),
    ]
    for r, rc in failing:
        assert r.rc == rc, r
    for r in runs + [r for r, _ in failing]:
        where = f"outboxd {' '.join(map(str, r.args))}"
        assert_no_secret(r.stdout, s, where + " stdout")
        assert_no_secret(r.stderr, s, where + " stderr")
        # logfmt: records, and the one plain line that says why a command
        # stopped; json: every line a record, that one too (with exit_code).
        lines = r.stderr.splitlines()
        if fmt == "logfmt":
            lines = [ln for ln in lines if not ln.startswith("outboxd: ")]
        records = check_lines("\n".join(lines), fmt, where + " stderr")
        if fmt == "json" and r.rc != EXIT_OK:
            last = records[-1]
            assert last["level"] == "error" and last["exit_code"] == str(r.rc), (where, last)
