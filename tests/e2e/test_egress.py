"""The egress (SSRF) guard: with --block-private-addresses the relay never
connects to loopback, private or link-local addresses, whether the URL names
one directly or through a host name that resolves to one; every attempt
fails (and is retried) with the reason in last_error. Without the flag the
same receiver is reached."""

from __future__ import annotations

import pytest

from helpers import wait_delivered, wait_until

FAST_RETRIES = ("--retry-base", "100ms", "--retry-cap", "200ms", "--max-attempts", "1000",
                "--sweep-interval", "1h")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_block_private_addresses_refuses_a_loopback_receiver(db, relay, receiver, host):
    url = f"http://{host}:{receiver.port}/hook"
    relay(url, "--block-private-addresses", *FAST_RETRIES)
    event_id = db.enqueue("egress.blocked", {"x": 1})

    def failed_twice():
        r = db.retry_state(event_id)
        return r if r is not None and r["attempts"] >= 2 and r["last_error"] else None

    row = wait_until(failed_twice, timeout=15)
    assert row is not None, f"event not retried with a recorded error: {db.retry_state(event_id)}"
    assert "block_private_addresses" in row["last_error"], row
    assert "loopback" in row["last_error"], row
    assert f"refused to connect to {host}" in row["last_error"], row
    # Nothing reached the receiver; the event waits in the outbox.
    assert receiver.requests == []
    assert db.event(event_id) is not None
    assert db.count_dead_letters() == 0


def test_without_the_flag_a_loopback_receiver_is_reached(db, relay, receiver):
    relay(receiver, "--sweep-interval", "1h")
    event_id = db.enqueue("egress.allowed", {"x": 1})
    assert wait_delivered(receiver, [event_id], timeout=10), receiver.ids()
    assert db.wait_empty(timeout=5), db.events()
