"""Standard Webhooks v1 signatures, verified by an independent implementation
(Python's hmac), with two secrets at once (key rotation)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import os

from helpers import wait_delivered


def new_secret() -> tuple[str, bytes]:
    key = os.urandom(32)
    return "whsec_" + base64.b64encode(key).decode(), key


def verify(key: bytes, req) -> bool:
    """The receiver side of the specification: any v1 signature may match."""
    signed = b".".join([req.headers["webhook-id"].encode(), req.headers["webhook-timestamp"].encode(), req.body])
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    offered = [s.split(",", 1)[1] for s in req.headers["webhook-signature"].split(" ") if s.startswith("v1,")]
    return any(hmac.compare_digest(expected, o) for o in offered)


def test_requests_carry_signatures_that_verify_for_every_secret(db, receiver, relay):
    old_text, old_key = new_secret()
    new_text, new_key = new_secret()
    other_text, other_key = new_secret()
    relay(receiver, "--sweep-interval", "1h", env={"OUTBOXD_SIGNING_SECRETS": f"{old_text} {new_text}"})
    ids = [db.enqueue("signed", {"n": n, "text": "grüße"}) for n in range(3)]
    assert wait_delivered(receiver, ids, 10)
    for req in receiver.requests:
        assert len(req.headers["webhook-signature"].split(" ")) == 2
        assert verify(old_key, req), req.headers
        assert verify(new_key, req), req.headers
        # A key outboxd does not have must not verify (the check can fail).
        assert not verify(other_key, req)


def test_a_tampered_body_does_not_verify(db, receiver, relay):
    text, key = new_secret()
    relay(receiver, "--sweep-interval", "1h", "--signing-secret", text)
    event_id = db.enqueue("signed", {"amount": 10})
    assert wait_delivered(receiver, [event_id], 10)
    req = receiver.requests[0]
    assert verify(key, req)
    tampered = dataclasses.replace(req, body=req.body.replace(b"10", b"99"))
    assert tampered.body != req.body
    assert not verify(key, tampered)


def test_unsigned_without_secrets(db, receiver, relay):
    relay(receiver, "--sweep-interval", "1h")
    event_id = db.enqueue("plain", {})
    assert wait_delivered(receiver, [event_id], 10)
    assert "webhook-signature" not in receiver.requests[0].headers


def test_a_bad_secret_is_refused_without_echoing_it(outboxd, database_url, schema, receiver):
    bad = "whsec_c2VjcmV0LXRvby1zaG9ydA=="  # decodes to 17 bytes: too short
    r = outboxd("--database-url", database_url, "--schema", schema, "run", "--url", receiver.url,
                "--signing-secret", bad)
    assert r.rc == 2, r
    assert "c2VjcmV0" not in r.output, r
    assert "24 to 64" in r.output, r
