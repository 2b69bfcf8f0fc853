"""The admin listener: /metrics scraped during a run and checked against what
the receiver saw, parsed by the Prometheus Python client's own parser (an
independent check of the text format); /healthz; /readyz through a
PostgreSQL outage; the summary line."""

from __future__ import annotations

import re
import signal
import urllib.error
import urllib.request

from prometheus_client import parser  # python3-prometheus-client, installed by scripts/deps.sh

from conftest import Db, EXIT_OK
from helpers import claims_only, wait_delivered, wait_until
from receiver import Receiver


def admin_port(relay, timeout: float = 10.0) -> int:
    """The port the relay logged for its admin listener (started with port 0)."""
    found = wait_until(lambda: re.search(r'admin listener started.*?address="?127\.0\.0\.1:(\d+)', relay.log()),
                       timeout)
    assert found, f"no 'admin listener started' line\n{relay.log()}"
    return int(found.group(1))


def get(port: int, path: str):
    """(status, content type, body) of GET path; 5xx answers too."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def scrape(port: int) -> dict:
    """{(sample name, frozenset(labels)): value} of /metrics, via the client parser."""
    status, ctype, text = get(port, "/metrics")
    assert status == 200, text
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            if "le" in labels:  # "1" and "1.0" are the same bound
                labels["le"] = str(float(labels["le"]))
            out[(s.name, frozenset(labels.items()))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@claims_only("claim metrics and the backlog count rows of events (windows: step 5)")
def test_metrics_count_what_the_receiver_saw(db, relay):
    """Deliveries by outcome, the attempts and latency histograms, claims and
    wake-ups, scraped in the middle of a run and at its end, equal what the
    receiver answered; the backlog and oldest pending age come from the
    database."""
    def responder(req):
        return (500, {}, b"no") if req.headers.get("outbox-topic") == "fail" else (200, {}, b"ok")

    with Receiver(responder) as rx:
        r = relay(rx, "--admin-listen", "127.0.0.1:0", "--retry-base", "10ms", "--retry-cap", "20ms",
                  "--max-attempts", "2", "--circuit-failures", "0")
        port = admin_port(r)
        assert get(port, "/healthz")[0] == 200

        first = [db.enqueue("ok", {"i": i}) for i in range(10)]
        assert wait_delivered(rx, first, timeout=10), r.log()
        # The outcome counters move when the answer comes: wait for them (a
        # condition, not a sleep), then compare.
        assert wait_until(lambda: value(scrape(port), "outboxd_deliveries_total",
                                        destination="default", outcome="delivered") == 10, 5), scrape(port)
        mid = scrape(port)

        failing = [db.enqueue("fail", {"i": i}) for i in range(3)]
        more = [db.enqueue("ok", {"i": i}) for i in range(10, 25)]
        assert wait_delivered(rx, more, timeout=10), r.log()
        assert wait_until(lambda: db.count_dead_letters() == 3, 10), (db.events(), r.log())
        delayed = db.enqueue("ok", {"later": True}, available_at="2100-01-01T00:00:00Z")

        seen = rx.snapshot()
        ok = sum(1 for q in seen if q.status == 200)
        failed = sum(1 for q in seen if q.status == 500)
        assert (ok, failed) == (25, 6), [(q.event_id, q.status) for q in seen]
        assert sorted(q.event_id for q in seen if q.status == 500) == sorted(failing * 2), seen

        def settled():
            s = scrape(port)
            return s if (value(s, "outboxd_deliveries_total", destination="default", outcome="dead") == 3
                         and value(s, "outboxd_backlog") == 1) else None
        end = wait_until(settled, 10)
        assert end, scrape(port)

        d = dict(destination="default")
        assert value(mid, "outboxd_deliveries_total", outcome="delivered", **d) == 10
        assert value(end, "outboxd_deliveries_total", outcome="delivered", **d) == ok
        # every failed attempt: first retried, then dead
        assert value(end, "outboxd_deliveries_total", outcome="retry", **d) == 3
        assert value(end, "outboxd_deliveries_total", outcome="dead", **d) == 3
        assert value(end, "outboxd_deliveries_total", outcome="retry", **d) + \
            value(end, "outboxd_deliveries_total", outcome="dead", **d) == failed
        assert value(end, "outboxd_deliveries_total", outcome="handed_back", **d) == 0
        # attempts: 25 delivered at attempt 1, 3 dead at attempt 2
        assert value(end, "outboxd_delivery_attempts_count", **d) == ok + 3
        assert value(end, "outboxd_delivery_attempts_bucket", le="1.0", **d) == ok
        assert value(end, "outboxd_delivery_attempts_bucket", le="2.0", **d) == ok + 3
        assert value(end, "outboxd_delivery_attempts_sum", **d) == ok + 6
        # latency since commit: one observation per delivery, all under a minute
        assert value(end, "outboxd_delivery_latency_seconds_count", **d) == ok
        assert value(end, "outboxd_delivery_latency_seconds_bucket", le="60.0", **d) == ok
        assert 0 < value(end, "outboxd_delivery_latency_seconds_sum", **d) < 60 * ok
        # claims: every event came back in some claim
        assert value(end, "outboxd_claims_total") >= 1
        assert value(end, "outboxd_claim_size_sum") >= ok + failed
        assert value(end, "outboxd_claim_size_count") == value(end, "outboxd_claims_total")
        assert value(end, "outboxd_wakes_total", source="notify") >= 1
        assert value(end, "outboxd_circuit_state", **d) == 0
        assert value(end, "outboxd_in_flight") == 0
        assert value(end, "outboxd_ready") == 1
        # the delayed event is the backlog; nothing due waits
        assert value(end, "outboxd_backlog") == 1
        assert value(end, "outboxd_oldest_pending_age_seconds") == 0
        assert db.event(delayed) is not None
        assert get(port, "/readyz") == (200, "text/plain; charset=utf-8", "ready\n")
        assert get(port, "/nope")[0] == 404
        assert r.stop() == EXIT_OK, r.log()


def test_the_admin_listener_answers_across_a_reload(db, relay, tmp_path):
    """SIGHUP replaces the engine, not the process: /healthz, /readyz and
    /metrics go on answering on the same port, and the counters go on."""
    with Receiver() as a, Receiver() as b:
        config = tmp_path / "outboxd.toml"

        def write(name: str, rx: Receiver) -> None:
            config.write_text(f'[destinations.{name}]\nurl = "{rx.url}"\n\n'
                              f'[[routes]]\ntopics = [">"]\ndestinations = ["{name}"]\n')

        write("a", a)
        r = relay(None, "--config", str(config), "--admin-listen", "127.0.0.1:0")
        port = admin_port(r)
        first = db.enqueue("t", {"n": 1})
        assert wait_delivered(a, [first], timeout=10), r.log()
        write("b", b)
        r.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "reloaded" in r.log(), 10), r.log()
        second = db.enqueue("t", {"n": 2})
        assert wait_delivered(b, [second], timeout=10), r.log()
        assert get(port, "/healthz")[0] == 200
        assert wait_until(lambda: get(port, "/readyz")[0] == 200, 10), get(port, "/readyz")
        assert wait_until(lambda: value(scrape(port), "outboxd_deliveries_total", destination="b",
                                        outcome="delivered") == 1, 5), scrape(port)
        assert value(scrape(port), "outboxd_deliveries_total", destination="a", outcome="delivered") == 1
        assert r.alive(), r.log()


def test_the_summary_line_says_what_was_delivered_and_what_waits(db, relay):
    with Receiver() as rx:
        r = relay(rx, "--summary-interval", "1s", log_level="info")
        ids = [db.enqueue("ok", {"i": i}) for i in range(5)]
        assert wait_delivered(rx, ids, timeout=10), r.log()
        # The deliveries may straddle two summaries: their counts add up.
        # Windows: delivered events count in the backlog until their cursor's
        # next checkpoint (about a second), so a summary may still see them.
        def summaries():
            lines = re.findall(r"msg=summary .*", r.log())
            total = sum(int(re.search(r" delivered=(\d+)", ln).group(1)) for ln in lines)
            return lines if total == 5 and " backlog=0" in lines[-1] else None
        lines = wait_until(summaries, 5)
        assert lines, r.log()
        for field in ("delivered_per_s=", "failures=0", "dead=0", "handed_back=0", "in_flight=0",
                      "open_circuits=0", "backlog=0", "oldest_pending=0ms", "interval="):
            assert field in lines[-1], lines[-1]


def test_readyz_is_unready_while_postgres_is_down_and_ready_again_after(pg_cluster, make_schema, relay, request):
    cluster = pg_cluster()
    schema = make_schema(url=cluster.url)
    with Receiver() as rx:
        r = relay(rx, "--admin-listen", "127.0.0.1:0", "--sweep-interval", "1s",
                  database_url=cluster.url, schema=schema,
                  env={"OUTBOXD_DATABASE_KEEPALIVE_TIMEOUT": "2s", "OUTBOXD_DATABASE_CONNECT_TIMEOUT": "2s"})
        port = admin_port(r)
        assert wait_until(lambda: get(port, "/readyz")[0] == 200, 10), get(port, "/readyz")
        assert value(scrape(port), "outboxd_database_reconnects_total") == 0

        cluster.stop()
        assert wait_until(lambda: get(port, "/readyz")[0] == 503, 10), get(port, "/readyz")
        status, _, body = get(port, "/readyz")
        assert body.startswith("not ready: ") and body.count("\n") == 1, body
        assert get(port, "/healthz")[0] == 200  # alive all the same
        assert value(scrape(port), "outboxd_ready") == 0

        cluster.start()
        assert wait_until(lambda: get(port, "/readyz")[0] == 200, 20), (get(port, "/readyz"), r.log())
        samples = scrape(port)
        assert value(samples, "outboxd_database_reconnects_total") >= 1
        assert value(samples, "outboxd_wakes_total", source="reconnect") >= 1
        db = Db(cluster.url, schema)
        request.addfinalizer(db.close)
        probe = db.enqueue("after", {})
        assert wait_delivered(rx, [probe], timeout=10), r.log()
        assert r.stop() == EXIT_OK, r.log()
