"""A failing destination costs the others nothing, and recovers in seconds:
its circuit opens after consecutive failures (its work waits in the outbox,
unsent, with no attempt counted), one delivery probes it now and then, and
the first success releases everything that waited for it at once."""

from __future__ import annotations

import threading
import time

from helpers import duplicates, wait_delivered, wait_until
from receiver import Receiver


def write_config(tmp_path, text: str) -> str:
    path = tmp_path / "outboxd.toml"
    path.write_text(text)
    return str(path)


def ok(rx: Receiver) -> list:
    return [r.event_id for r in rx.snapshot() if 200 <= r.status < 300]


def requests_per_event(rx: Receiver) -> dict:
    counts: dict = {}
    for r in rx.snapshot():
        counts[r.event_id] = counts.get(r.event_id, 0) + 1
    return counts


def attempts_match_requests(rx: Receiver) -> dict:
    """{event id: (highest attempt number its requests carried, requests
    received)} for events whose attempts count differs from the requests
    that reached the destination: an attempt counted for a request never
    sent shows as a gap."""
    sent = requests_per_event(rx)
    highest: dict = {}
    for r in rx.snapshot():
        highest[r.event_id] = max(highest.get(r.event_id, 0), int(r.headers["outbox-attempt"]))
    return {i: (highest[i], sent[i]) for i in sent if highest[i] != sent[i]}


def test_a_stalled_neighbour_neither_slows_the_healthy_destination_nor_burns_attempts(db, relay, tmp_path):
    release = threading.Event()

    def stalled(req):
        if not release.is_set():
            release.wait(1.5)  # longer than the request timeout
        return 200, {}, b"ok"

    with Receiver(stalled) as a, Receiver() as b:
        config = (f'[destinations.a]\nurl = "{a.url}"\nrequest_timeout = "500ms"\nmax_concurrency = 1\n'
                  f'retry = {{ base = "200ms", cap = "1s" }}\n'
                  f'circuit = {{ failures = 3, longest_probe = "1s" }}\n\n'
                  f'[destinations.b]\nurl = "{b.url}"\n\n'
                  '[[routes]]\ntopics = ["slow.>"]\ndestinations = ["a"]\n\n'
                  '[[routes]]\ntopics = ["fast.>"]\ndestinations = ["b"]\n')
        r = relay(None, "--config", write_config(tmp_path, config), "--concurrency", "4", "--lease", "20s")
        slow = [db.enqueue("slow.thing", {"n": n}) for n in range(10)]
        assert a.wait_until(lambda reqs: len(reqs) >= 1, 10), "a never got a request"
        late = []
        fast = []
        for n in range(30):
            t = time.monotonic()
            i = db.enqueue("fast.thing", {"n": n})
            fast.append(i)
            # Each must be at b within a second of its commit, whatever a does.
            if not b.wait_until(lambda reqs: i in {q.event_id for q in reqs if q.status == 200}, 3):
                late.append(i)
            elif time.monotonic() - t > 1.0:
                late.append(i)
            time.sleep(0.05)
        assert not late, f"b's events late or missing while a stalled: {late}"
        assert wait_until(lambda: "circuit open" in r.log(), 10), r.log()
        release.set()
        assert wait_delivered(a, slow, 20), f"a got {len(set(ok(a)))} of 10 after recovering"
        assert db.wait_empty(timeout=10), (db.events(), db.deliveries())
        # (a answers the requests that timed out, late: those are sent again.)
        assert not duplicates(ok(b)), duplicates(ok(b))
        # Every attempt a delivery carries was a request a received: none was
        # counted for a request that was never sent.
        assert not attempts_match_requests(a), attempts_match_requests(a)


def test_after_an_outage_the_waiting_backlog_goes_out_at_once_not_at_its_backoff(db, relay, tmp_path):
    down = threading.Event()
    down.set()

    def outage(req):
        return (500, {}, b"down") if down.is_set() else (200, {}, b"ok")

    with Receiver(outage) as a:
        # A 30 s backoff: without the circuit's release, nothing failed would
        # come back within this test's deadlines.
        config = (f'[destinations.a]\nurl = "{a.url}"\n'
                  f'retry = {{ base = "30s", cap = "60s" }}\n'
                  f'circuit = {{ failures = 3, longest_probe = "500ms" }}\n\n'
                  '[[routes]]\ntopics = [">"]\ndestinations = ["a"]\n')
        r = relay(None, "--config", write_config(tmp_path, config), "--concurrency", "8")
        ids = []
        for n in range(60):
            ids.append(db.enqueue("orders.created", {"n": n}, key=f"k{n % 4}"))
            time.sleep(0.02)
        assert wait_until(lambda: "circuit open" in r.log(), 10), r.log()
        requests_while_down = len(a.snapshot())
        time.sleep(1.5)  # down for a while: probes only
        probes = len(a.snapshot()) - requests_while_down
        assert probes <= 4, f"{probes} requests in 1.5 s to an open circuit (probes every 0.5 s at most)"
        down.clear()
        t0 = time.monotonic()
        assert wait_delivered(a, ids, 5), f"{len(set(ok(a)))} of 60 within 5 s of the recovery"
        took = time.monotonic() - t0
        assert took < 5
        assert db.wait_empty(timeout=5), (db.events(), db.deliveries())
        assert db.count_dead_letters() == 0
        assert "released waiting deliveries" in r.log()
        for key in range(4):
            mine = [i for i in ok(a) if (i - ids[0]) % 4 == key]
            assert mine == sorted(mine), f"key order broken: {mine}"
        assert not attempts_match_requests(a), attempts_match_requests(a)
