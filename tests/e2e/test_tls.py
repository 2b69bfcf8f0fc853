"""HTTPS delivery: the receiver's certificate is verified by default (here
against a private CA given with --ca-file); a certificate that does not chain
to a trusted CA or names another host is a failed attempt (retried, never
counted as delivered, the reason in last_error); --insecure-skip-tls-verify
delivers anyway and says so loudly in the log.

Certificates come from tls_certs.py (a throwaway CA, made with openssl)."""

from __future__ import annotations

import pytest

from helpers import wait_delivered, wait_until
from receiver import Receiver
from tls_certs import make_tls_files

# Failed attempts are retried fast and never run out during a test.
FAST_RETRIES = ("--retry-base", "100ms", "--retry-cap", "200ms", "--max-attempts", "1000",
                "--sweep-interval", "1h")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def https_receiver(tls_files):
    """HTTPS receiver with a certificate for localhost signed by the test CA."""
    with Receiver(tls=tls_files.server) as rx:
        yield rx


@pytest.fixture
def wrong_host_receiver(tls_files):
    """HTTPS receiver whose certificate (signed by the test CA) is for wrong.example."""
    with Receiver(tls=tls_files.wrong_host) as rx:
        yield rx


def wait_failed_attempts(db, event_id: int, attempts: int, timeout: float = 15.0):
    """The event's row once it has been tried at least ``attempts`` times and
    the last failure is recorded (None on timeout)."""
    def row():
        r = db.retry_state(event_id)
        return r if r is not None and r["attempts"] >= attempts and r["last_error"] else None
    return wait_until(row, timeout)


def assert_retried_not_delivered(db, rx, event_id: int, *expected_in_error: str) -> None:
    row = wait_failed_attempts(db, event_id, attempts=3)
    assert row is not None, f"event not retried with a recorded error: {db.retry_state(event_id)}"
    for text in expected_in_error:
        assert text in row["last_error"], row
    assert "TLS handshake with localhost:" in row["last_error"], row
    # No HTTP request ever reached the receiver, the event stays in the
    # outbox for the next attempt, and nothing was dead-lettered.
    assert rx.requests == [], [r.headers for r in rx.requests]
    assert rx.tls_failures >= 1
    assert db.event(event_id) is not None
    assert db.count_dead_letters() == 0


def test_a_certificate_from_the_ca_file_is_verified_and_delivered(db, relay, https_receiver, tls_files):
    assert https_receiver.url.startswith("https://localhost:")
    relay(https_receiver, "--ca-file", tls_files.ca_cert, "--sweep-interval", "1h")
    ids = [db.enqueue("tls.ok", {"n": n}) for n in range(3)]
    assert wait_delivered(https_receiver, ids, timeout=10), https_receiver.ids()
    assert db.wait_empty(timeout=5), db.events()
    assert sorted(https_receiver.delivered_ids()) == sorted(ids)
    assert https_receiver.tls_failures == 0


def test_without_the_ca_file_the_certificate_is_refused_and_retried(db, relay, https_receiver):
    # Only the system CAs are trusted, and they never signed the test CA.
    relay(https_receiver, *FAST_RETRIES)
    event_id = db.enqueue("tls.untrusted", {"x": 1})
    assert_retried_not_delivered(db, https_receiver, event_id, "certificate verify failed",
                                 "unable to get local issuer certificate")


def test_a_certificate_for_another_host_is_refused_and_retried(db, relay, wrong_host_receiver, tls_files):
    relay(wrong_host_receiver, "--ca-file", tls_files.ca_cert, *FAST_RETRIES)
    event_id = db.enqueue("tls.wrong_host", {"x": 1})
    assert_retried_not_delivered(db, wrong_host_receiver, event_id, "certificate verify failed",
                                 "hostname mismatch")


def test_insecure_skip_tls_verify_delivers_and_warns_loudly(db, relay, wrong_host_receiver):
    # Neither the chain nor the name would verify: both checks are off.
    r = relay(wrong_host_receiver, "--insecure-skip-tls-verify", "--sweep-interval", "1h")
    event_id = db.enqueue("tls.insecure", {"x": 1})
    assert wait_delivered(wrong_host_receiver, [event_id], timeout=10), wrong_host_receiver.ids()
    assert db.wait_empty(timeout=5), db.events()
    warnings = [line for line in r.log().splitlines()
                if ("level=warn" in line or "level=error" in line) and "insecure" in line.lower()]
    assert warnings, f"no warning about skipped TLS verification in the log:\n{r.log()}"


def test_tls_settings_per_destination_in_the_configuration_file(db, relay, tls_files, tmp_path):
    # "trusted" verifies against the test CA; "untrusted" uses the system CAs
    # only. The same event goes to both: delivered to one, retried at the
    # other, neither blocking the other.
    with Receiver(tls=tls_files.server) as good, Receiver(tls=tls_files.server) as bad:
        config = tmp_path / "outboxd.toml"
        config.write_text(
            '[defaults.retry]\nbase = "100ms"\ncap = "200ms"\nmax_attempts = 1000\n\n'
            f'[destinations.trusted]\nurl = "{good.url}"\ntls = {{ ca_file = "{tls_files.ca_cert}" }}\n\n'
            f'[destinations.untrusted]\nurl = "{bad.url}"\n\n'
            '[[routes]]\ntopics = [">"]\ndestinations = ["trusted", "untrusted"]\n')
        relay(None, "--config", str(config), "--sweep-interval", "1h")
        event_id = db.enqueue("tls.both", {"x": 1})
        assert wait_delivered(good, [event_id], timeout=10), good.ids()

        def failed_there():
            r = db.retry_state(event_id, "untrusted")
            return r if r is not None and r["attempts"] >= 3 and r["last_error"] else None
        row = wait_until(failed_there, 15)
        assert row is not None, db.deliveries(event_id)
        assert "certificate verify failed" in row["last_error"], row
        assert bad.requests == []
        assert db.retry_state(event_id, "trusted") is None, "the trusted destination owes nothing"
        assert good.delivered_ids() == [event_id]
