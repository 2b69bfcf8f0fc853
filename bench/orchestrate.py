#!/usr/bin/python3
"""Runs the outboxd benchmark scenarios against a running PostgreSQL (stdlib only).

bench/run.sh is the entry point: it builds, starts a throwaway PostgreSQL
(fsync and synchronous_commit on), migrates, then calls this script, and
stops the database on exit. Run by hand against a cluster of your own:

    /usr/bin/python3 bench/orchestrate.py --database-url URL --build-dir build \
        --raw-dir /tmp/raw [--runs 3] [--scenario paced] [--quick]

Per run of a scenario, for each relay in turn (outboxd, the baseline relay,
and with --relay windows the commit-ordered windows prototype), side by
side: make sure nothing is left undelivered, start the relay, let producers
commit events, wait until every committed event was received and the relay's
table is drained (bounded by a deadline), read the relay's CPU and peak RSS
from /proc, stop it (SIGTERM), dump the receiver's records, compute metrics
(bench/analyze.py). Nothing is ever truncated: an event that does not arrive
is reported as lost, never cleaned away.

Every wait here is bounded in time; all traffic goes to 127.0.0.1.
OUTBOXD_BENCH_LOG_LEVEL (default warn) is outboxd's log level, for a
diagnosis from the relay logs a kept raw directory holds.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import analyze  # noqa: E402

ALL_SCENARIOS = ["paced", "flat", "flat-k100", "backlog", "backlog-20k", "backlog-k100", "backlog-k10", "many", "idle",
                 "js-paced", "js-backlog"]
DEFAULT_SCENARIOS = ["paced", "flat", "backlog", "many", "idle", "js-paced", "js-backlog"]
# The JetStream scenarios: paced and backlog again, outboxd publishing to a
# single-node JetStream stream (a nats-server started here) instead of
# POSTing to the receiver; the receiver records what the stream stored.
# The baseline has no JetStream transport: outboxd only.
JETSTREAM = {"js-paced": "paced", "js-backlog": "backlog"}
# Keyed scenarios (issue 14): the load of their kind, with ordering keys
# round-robin over K keys (bench/producer.cpp --keys); the analysis checks
# per-key order. The baseline has no ordering keys: not run there.
KEYED = {"flat-k100": "flat", "backlog-k100": "backlog", "backlog-k10": "backlog"}
NATS_SERVER = "/usr/sbin/nats-server"

# name -> (full, quick) parameters. Durations in seconds.
PARAMS = {
    "paced": ({"rate": 200, "count": 3000, "connections": 1}, {"rate": 200, "count": 600, "connections": 1}),
    "flat": ({"duration": 10, "connections": 4}, {"duration": 3, "connections": 4}),
    "backlog": ({"count": 100_000}, {"count": 20_000}),
    # Keyed backlogs are 20,000: today's keyed claim is O(backlog) per claim
    # (bench/NOTES.md), so 100,000 would take many minutes a run. backlog-20k
    # is the unkeyed drain of the same size, for the keyed/unkeyed ratios.
    "backlog-20k": ({"count": 20_000}, {"count": 5_000}),
    "backlog-k100": ({"count": 20_000, "keys": 100}, {"count": 5_000, "keys": 100}),
    "backlog-k10": ({"count": 20_000, "keys": 10}, {"count": 5_000, "keys": 10}),
    "flat-k100": ({"duration": 10, "connections": 4, "keys": 100}, {"duration": 3, "connections": 4, "keys": 100}),
    "many": ({"duration": 10, "connections": 32}, {"duration": 3, "connections": 32}),
    "idle": ({"duration": 10}, {"duration": 3}),
}
PARAMS.update({js: PARAMS[base] for js, base in JETSTREAM.items()})
KIND = analyze.KIND
# The windows prototype consumes its own copy of the outbox (another schema,
# installed by bench/run.sh), since it deletes nothing.
WINDOWS_SCHEMA = "win"

CLK_TCK = os.sysconf("SC_CLK_TCK")
children: list[subprocess.Popen] = []


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def now_ns() -> int:
    # time.monotonic_ns() is CLOCK_MONOTONIC on Linux: the clock the C++
    # programs stamp events with.
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# ---- processes and /proc -----------------------------------------------------

def spawn(cmd: list[str], **kw) -> subprocess.Popen:
    p = subprocess.Popen(cmd, **kw)
    children.append(p)
    return p


def stop(p: subprocess.Popen, timeout: float = 20.0) -> int:
    """SIGTERM, then SIGKILL after `timeout` seconds; returns the exit code."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"pid {p.pid} ignored SIGTERM for {timeout:.0f} s; killing it")
            p.kill()
            p.wait(timeout=10)
    if p in children:
        children.remove(p)
    return p.returncode


def kill_children() -> None:
    for p in list(children):
        try:
            stop(p, timeout=10)
        except Exception:  # noqa: BLE001 - cleanup must go on
            pass


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a whole process (all threads)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def peak_rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# ---- database and receiver ---------------------------------------------------

class Database:
    def __init__(self, url: str, schema: str):
        self.url = url
        self.schema = schema

    def query(self, sql: str, timeout: float = 60) -> str:
        r = subprocess.run(["psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.url, "-c", sql],
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"psql failed: {r.stderr.strip()}")
        return r.stdout.strip()

    def quoted_schema(self) -> str:
        return '"' + self.schema.replace('"', '""') + '"'

    def pending(self, relay: str) -> int:
        if relay in ("outboxd", "outboxd-windows"):
            return int(self.query(f"SELECT count(*) FROM {self.quoted_schema()}.events"))
        if relay == "windows":
            # Events its checkpointed cursor does not cover yet (it deletes
            # nothing): began at or after the cursor's xmax, or running then.
            return int(self.query(
                f"WITH c AS MATERIALIZED (SELECT snap_a FROM {WINDOWS_SCHEMA}.cursors) "
                f"SELECT count(*) FROM c, {WINDOWS_SCHEMA}.events e "
                "WHERE (e.txid >= pg_snapshot_xmax(c.snap_a) "
                "       OR e.txid IN (SELECT pg_snapshot_xip(c.snap_a))) "
                "  AND NOT pg_visible_in_snapshot(e.txid, c.snap_a)"))
        return int(self.query("SELECT count(*) FROM baseline.events WHERE published_at IS NULL"))

    def backends(self, app_name: str) -> list[int]:
        out = self.query("SELECT pid FROM pg_stat_activity WHERE application_name = "
                         f"'{app_name}' AND pid <> pg_backend_pid()")
        return [int(x) for x in out.split()] if out else []


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NatsServer:
    """A single-node nats-server with JetStream (store under the raw directory)."""

    def __init__(self, raw: Path):
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        with open(raw / "nats-server.log", "w") as err:
            self.proc = spawn([NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(raw / "js")],
                              stdout=subprocess.DEVNULL, stderr=err)
        import socket
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("nats-server did not start (see nats-server.log)") from None
                time.sleep(0.05)


class Receiver:
    def __init__(self, exe: Path, raw: Path, threads: int, nats_url: str | None = None):
        port_file = raw / "receiver.port"
        port_file.unlink(missing_ok=True)
        extra = ["--nats", nats_url] if nats_url else []
        with open(raw / "receiver.log", "w") as err:
            self.proc = spawn([str(exe), "--port-file", str(port_file), "--threads", str(threads)] + extra,
                              stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 10
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the receiver did not start (see receiver.log)")
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        self.url = f"http://127.0.0.1:{self.port}/"

    def _call(self, method: str, path: str, body: str | None = None) -> str:
        # http.client, not urllib: urllib would honour http_proxy variables.
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.request(method, path, body=body)
            r = c.getresponse()
            text = r.read().decode()
            if r.status != 200:
                raise RuntimeError(f"receiver {path}: {r.status} {text.strip()}")
            return text.strip()
        finally:
            c.close()

    def count(self) -> int:
        return int(self._call("GET", "/_bench/count"))

    def dump(self, path: Path) -> int:
        return int(self._call("POST", "/_bench/dump", str(path)))


# ---- the benchmark -------------------------------------------------------------

def with_params(url: str, params: str) -> str:
    """Appends URI query parameters to a postgresql:// URL."""
    return f"{url}{'&' if '?' in url else '?'}{params}"


def describe(scenario: str, p: dict) -> str:
    if scenario in JETSTREAM:
        return (f"{scenario}: {describe(JETSTREAM[scenario], p)}; outboxd publishes to a single-node JetStream "
                "stream (file storage), latency = the stored message reaching a consumer")
    if scenario == "paced":
        return f"paced: {p['count']} events at {p['rate']}/s, {p['connections']} producer connection"
    if scenario == "flat":
        return (f"flat: {p['connections']} producer connections, one event per transaction, "
                f"as fast as they can for {p['duration']} s")
    keys = f", ordering keys round-robin over {p['keys']} keys" if p.get("keys") else ""
    if scenario in KEYED or scenario == "backlog-20k":
        return describe(KIND[scenario], {k: v for k, v in p.items() if k != "keys"}).replace(
            KIND[scenario] + ":", scenario + ":", 1) + keys
    if scenario == "backlog":
        return (f"backlog: {p['count']} events committed in one transaction while the relay is stopped, "
                "then the relay starts")
    if scenario == "many":
        return f"many: {p['connections']} producer connections flat out for {p['duration']} s"
    return f"idle: the relay alone, no events, {p['duration']} s"


class Bench:
    def __init__(self, args):
        self.args = args
        self.build = Path(args.build_dir).resolve()
        self.raw = Path(args.raw_dir).resolve()
        self.raw.mkdir(parents=True, exist_ok=True)
        self.db = Database(args.database_url, args.schema)
        # Copies, taken once: a rebuild of build/ during the run cannot mix
        # two versions of a program into one table.
        bin_dir = self.raw / "bin"
        bin_dir.mkdir(exist_ok=True)
        exes = {}
        for name, rel in (("outboxd", "outboxd"), ("producer", "bench/outboxd-bench-producer"),
                          ("baseline", "bench/outboxd-bench-baseline"), ("receiver", "bench/outboxd-bench-receiver"),
                          ("windows", "bench/outboxd-bench-windows")):
            if name == "windows" and "windows" not in (args.relay or []):
                continue
            src = self.build / rel
            if not src.exists():
                raise SystemExit(f"orchestrate.py: {src} missing: build first (bench/run.sh does)")
            exes[name] = bin_dir / src.name
            shutil.copy2(src, exes[name])
        self.outboxd = exes["outboxd"]
        # --outboxd-windows-bin: another build for outboxd-windows (a before/after
        # pair interleaved in one invocation, with OUTBOXD_CONSUME=windows for both).
        self.outboxd_windows = self.outboxd
        if args.outboxd_windows_bin:
            self.outboxd_windows = bin_dir / "outboxd-windows-bin"
            shutil.copy2(args.outboxd_windows_bin, self.outboxd_windows)
        self.producer = exes["producer"]
        self.baseline = exes["baseline"]
        self.windows = exes.get("windows")
        self.relays = args.relay or ["outboxd", "baseline"]
        wanted = args.scenario or DEFAULT_SCENARIOS
        self.nats = NatsServer(self.raw) if any(s in JETSTREAM for s in wanted) else None
        self.receiver = Receiver(exes["receiver"], self.raw, args.receiver_threads,
                                 self.nats.url if self.nats else None)
        self.tag = int(time.time()) % 100_000 * 100  # distinct across benchmark invocations
        self.quick = args.quick
        self.drain_deadline = 30 if args.quick else 60
        self.backlog_deadline = 120 if args.quick else 300

    def params(self, scenario: str) -> dict:
        p = dict(PARAMS[scenario][1 if self.quick else 0])
        # --backlog-count: one size for every backlog, keyed or not; a drain of
        # about one second (20,000) moves with the machine's spells by up to
        # 1.5x, one of several seconds much less
        if self.args.backlog_count and KIND.get(scenario, scenario) == "backlog":
            p["count"] = self.args.backlog_count
        return p

    def baseline_url(self) -> str:
        return with_params(self.args.database_url, "application_name=outboxd-baseline")

    def windows_url(self) -> str:
        return with_params(self.args.database_url, "application_name=outboxd-windows")

    def outboxd_url(self) -> str:
        if not self.args.outboxd_dsn_params:
            return self.args.database_url
        return with_params(self.args.database_url, self.args.outboxd_dsn_params)

    # -- relays

    def start_relay(self, relay: str, log_path: Path, scenario: str = "") -> subprocess.Popen:
        env = None
        if relay in ("outboxd", "outboxd-windows"):
            # outboxd-windows: the same binary reading commit-ordered windows
            # (relay.consume = "windows"), so one invocation interleaves both modes.
            if relay == "outboxd-windows":
                env = dict(os.environ, OUTBOXD_CONSUME="windows")
            exe = self.outboxd_windows if relay == "outboxd-windows" else self.outboxd
            cmd = [str(exe), "--database-url", self.outboxd_url(), "--schema", self.args.schema,
                   "--log-level", os.environ.get("OUTBOXD_BENCH_LOG_LEVEL", "warn"), "run"]
            if scenario in JETSTREAM:
                config = self.raw / "jetstream.toml"
                config.write_text(f'[destinations.stream]\ntype = "nats"\nurl = "{self.nats.url}"\n'
                                  '[[routes]]\ntopics = [">"]\ndestinations = ["stream"]\n')
                cmd += ["--config", str(config)]
            else:
                cmd += ["--url", self.receiver.url]
            if self.args.concurrency:
                cmd += ["--concurrency", str(self.args.concurrency)]
            if self.args.outboxd_wake:
                cmd += ["--wake", self.args.outboxd_wake]
        elif relay == "windows":
            cmd = [str(self.windows), "--database-url", self.windows_url(), "--schema", WINDOWS_SCHEMA,
                   "--url", self.receiver.url]
            if self.args.concurrency:
                cmd += ["--concurrency", str(self.args.concurrency)]
        else:
            cmd = [str(self.baseline), "--database-url", self.baseline_url(), "--url", self.receiver.url]
        with open(log_path, "w") as err:  # the child keeps its own copy of the descriptor
            return spawn(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)

    @staticmethod
    def app_name(relay: str) -> str:
        return {"outboxd": "outboxd", "outboxd-windows": "outboxd",
                "windows": "outboxd-windows"}.get(relay, "outboxd-baseline")

    def wait_ready(self, relay: str, proc: subprocess.Popen) -> list[int]:
        """Until the relay is connected to the database; returns the backend
        pids of its connections (outboxd: store and listener)."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{relay} exited with {proc.returncode} at startup")
            if self.db.backends(self.app_name(relay)):
                time.sleep(0.5)  # its other connections, LISTEN and the startup drain
                return self.db.backends(self.app_name(relay))
            time.sleep(0.05)
        raise RuntimeError(f"{relay} did not connect within 20 s")

    @staticmethod
    def backends_cpu(pids: list[int]) -> float:
        return sum(cpu_seconds(p) or 0.0 for p in pids)

    def wait_drained(self, relay: str, expected: int, deadline_s: float) -> bool:
        """Until the receiver has at least `expected` requests and the relay's
        table holds nothing undelivered; False at the deadline."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.receiver.count() >= expected and self.db.pending(relay) == 0:
                return True
            time.sleep(0.02)
        return False

    def clear_leftovers(self, relay: str, scenario: str = "") -> None:
        """An earlier run may have left events undelivered (they were counted
        as lost there). Deliver them now so they cannot blur this run; their
        receipts are kept apart as strays."""
        left = self.db.pending(relay)
        if left == 0:
            return
        log(f"{left} undelivered {relay} events left by an earlier run; delivering them first")
        proc = self.start_relay(relay, self.raw / f"leftover-{relay}-{self.tag}.log", scenario)
        try:
            deadline = time.monotonic() + self.backlog_deadline
            while time.monotonic() < deadline and self.db.pending(relay) > 0 and proc.poll() is None:
                time.sleep(0.2)
        finally:
            stop(proc)
        self.receiver.dump(self.raw / f"leftover-{relay}-{self.tag}.tsv")

    def probe_commit_ms(self, tag: int) -> float | None:
        """Mean time of one durable commit by a lone writer right now, from
        0.5 s of single-row commits into a table no relay reads. On a shared
        machine the disk's flush time drifts (others' I/O), and every figure
        here moves with it: the table shows it beside each cell."""
        cmd = [str(self.producer), "--database-url", self.args.database_url, "--target", "probe",
               "--run", str(tag), "--out", str(self.raw / f"probe-{tag}.tsv"),
               "--mode", "flat", "--duration", "0.5", "--connections", "1"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            summary = json.loads(r.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
            return None
        if not summary.get("committed"):
            return None
        return (summary["last_commit_ns"] - summary["start_ns"]) / 1e6 / summary["committed"]

    # -- one run

    def run_one(self, scenario: str, relay: str, run: int) -> dict:
        self.tag += 1
        tag = self.tag
        p = self.params(scenario)
        self.clear_leftovers(relay, scenario)
        # Anything that reached the receiver between runs is not this run's.
        if self.receiver.count():
            self.receiver.dump(self.raw / f"between-{tag}.tsv")
        meta = {"scenario": scenario, "relay": relay, "run": run, "tag": tag, "params": p,
                "producer_file": f"prod-{tag}.tsv", "receiver_file": f"recv-{tag}.tsv",
                "load_before": load_average()}
        relay_log = self.raw / f"relay-{tag}.log"
        meta["probe_commit_ms"] = self.probe_commit_ms(tag)
        kind = KIND.get(scenario, scenario)
        meta["kind"] = kind

        def producer(mode_args: list[str], timeout: float) -> dict:
            # The windows prototype's events are enqueued like outboxd's, into its schema.
            target, schema = (("outboxd", WINDOWS_SCHEMA) if relay == "windows" else
                              ("outboxd", self.args.schema) if relay == "outboxd-windows" else (relay, self.args.schema))
            cmd = [str(self.producer), "--database-url", self.args.database_url, "--target", target,
                   "--schema", schema, "--run", str(tag), "--out", str(self.raw / meta["producer_file"])]
            if p.get("keys"):
                cmd += ["--keys", str(p["keys"])]
            r = subprocess.run(cmd + mode_args, capture_output=True, text=True, timeout=timeout)
            if r.returncode != 0:
                raise RuntimeError(f"producer failed ({r.returncode}): {r.stderr.strip()}")
            summary = json.loads(r.stdout.strip().splitlines()[-1])
            if summary["errors"]:
                log(f"producer: {summary['errors']} failed transactions, last: {summary['last_error']}")
            return summary

        recv0 = cpu_seconds(self.receiver.proc.pid) or 0.0
        if kind == "backlog":
            summary = producer(["--mode", "bulk", "--count", str(p["count"])], timeout=600)
            recv0 = cpu_seconds(self.receiver.proc.pid) or 0.0
            meta["relay_start_ns"] = meta["window_start_ns"] = now_ns()
            proc = self.start_relay(relay, relay_log, scenario)
            cpu0 = 0.0
            db_pids: list[int] = []
            db0 = 0.0
        else:
            proc = self.start_relay(relay, relay_log, scenario)
            db_pids = self.wait_ready(relay, proc)
            db0 = self.backends_cpu(db_pids)
            cpu0 = cpu_seconds(proc.pid) or 0.0
            recv0 = cpu_seconds(self.receiver.proc.pid) or 0.0
            meta["window_start_ns"] = now_ns()
            if scenario == "idle":
                time.sleep(p["duration"])
                summary = None
            elif kind == "paced":
                summary = producer(["--mode", "paced", "--rate", str(p["rate"]), "--count", str(p["count"]),
                                    "--connections", str(p["connections"])],
                                   timeout=p["count"] / p["rate"] + 120)
            else:
                summary = producer(["--mode", "flat", "--duration", str(p["duration"]),
                                    "--connections", str(p["connections"])], timeout=p["duration"] + 120)

        if summary is not None:
            meta["load_start_ns"] = summary["start_ns"]
            meta["producer_errors"] = summary["errors"]
            deadline = self.backlog_deadline if kind == "backlog" else self.drain_deadline
            meta["drained"] = self.wait_drained(relay, summary["committed"], deadline)
            if not meta["drained"]:
                log(f"{scenario}/{relay}: not drained within {deadline} s; the missing events count as lost")
            if kind == "backlog":
                db_pids = self.db.backends(self.app_name(relay))  # connected since relay start
        cpu1 = cpu_seconds(proc.pid)
        # Includes the orchestrator's count polls (cheap next to the requests).
        meta["receiver_cpu_s"] = (cpu_seconds(self.receiver.proc.pid) or 0.0) - recv0
        meta["window_end_ns"] = now_ns()
        meta["cpu_s"] = None if cpu1 is None else cpu1 - cpu0
        meta["rss_kb"] = peak_rss_kb(proc.pid)
        meta["db_cpu_s"] = self.backends_cpu(db_pids) - db0 if db_pids else None
        meta["relay_exit"] = stop(proc)
        if meta["relay_exit"] != 0:
            log(f"{relay} exited with {meta['relay_exit']}; last lines of {relay_log}:")
            for line in relay_log.read_text(errors="replace").splitlines()[-10:]:
                log(f"  {line}")
        if scenario != "idle":
            meta["received"] = self.receiver.dump(self.raw / meta["receiver_file"])
        meta["load_after"] = load_average()
        (self.raw / f"run-{tag}.json").write_text(json.dumps(meta, indent=1))
        return analyze.compute(meta, self.raw)

    def relays_for(self, scenario: str) -> list[str]:
        """The relays a scenario runs on, in --relay order (interleaved within a round)."""
        if scenario in JETSTREAM:
            return [r for r in self.relays if r == "outboxd"]
        if scenario in KEYED:
            return [r for r in self.relays if r != "baseline"]
        return self.relays

    def environment(self, scenarios: list[str]) -> dict:
        def show(name: str) -> str:
            return self.db.query(f"SHOW {name}")

        model = "?"
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        try:
            version = subprocess.run([str(self.outboxd), "--version"], capture_output=True, text=True,
                                     timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            version = "?"
        try:
            root = Path(__file__).resolve().parent.parent
            commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src", "sql"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            if commit:
                version += f" (commit {commit}{', src/ or sql/ modified' if dirty else ''})"
        except (OSError, subprocess.TimeoutExpired):
            pass
        lines = [describe(s, self.params(s)) for s in scenarios]
        lines.append(f"drain deadline: {self.drain_deadline} s after the load ends "
                     f"(backlog: {self.backlog_deadline} s after the relay starts)")
        lines.append("baseline: bench/baseline_relay.cpp (poll every 500 ms, 100 rows FOR UPDATE SKIP LOCKED, "
                     "synchronous POSTs inside the transaction, UPDATE published_at)")
        if "windows" in self.relays:
            lines.append("windows: bench/windows/window_relay.cpp (commit-ordered windows prototype, schema "
                         f"{WINDOWS_SCHEMA}: outboxd's outbox plus a txid column)")
        lines.append(f"receiver: bench/receiver.cpp, {self.args.receiver_threads} thread(s); "
                     "producers: bench/producer.cpp (BEGIN; enqueue or INSERT; COMMIT)")
        return {
            "machine": f"{os.cpu_count()} × {model}, {mem_gb:.0f} GiB RAM, Linux {platform.release()}",
            "cores": os.cpu_count(),
            "pg_version": show("server_version"),
            "fsync": show("fsync"),
            "synchronous_commit": show("synchronous_commit"),
            "wal_sync_method": show("wal_sync_method"),
            "outboxd": version,
            "concurrency": self.args.concurrency or "32 (default)",
            "outboxd_dsn_params": self.args.outboxd_dsn_params or "",
            "outboxd_wake": self.args.outboxd_wake or "",
            "runs": self.args.runs,
            "scenarios": ", ".join(scenarios) + (" (--quick: shortened)" if self.quick else ""),
            "scenario_lines": lines,
            "load_start": load_average(),
        }

    def run(self) -> int:
        scenarios = [s for s in ALL_SCENARIOS if s in self.args.scenario] if self.args.scenario else DEFAULT_SCENARIOS
        env = self.environment(scenarios)
        if env["fsync"] != "on" or env["synchronous_commit"] != "on":
            log("WARNING: fsync or synchronous_commit is off: these are not the numbers users get")
        metrics = []
        for run in range(1, self.args.runs + 1):
            for scenario in scenarios:
                for relay in self.relays_for(scenario):
                    m = self.run_one(scenario, relay, run)
                    metrics.append(m)
                    log(f"run {run} {scenario:8} {relay:8} " + ", ".join(
                        f"{k}={analyze.fmt(m.get(k), f)}" for k, _, f in analyze.COLUMNS if m.get(k) is not None))
        env["load_end"] = load_average()
        (self.raw / "env.json").write_text(json.dumps(env, indent=1))
        text = analyze.report(metrics, env)
        sys.stdout.write(text)
        if self.args.results:
            out = Path(self.args.results)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            log(f"table written to {out}")
        lost = sum(m.get("lost") or 0 for m in metrics if m["relay"] in ("outboxd", "outboxd-windows"))
        if lost:
            log(f"outboxd lost {lost} events (see the table)")
        return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--schema", default="outbox")
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--raw-dir", required=True)
    ap.add_argument("--results", help="also write the Markdown report here")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scenario", action="append", choices=ALL_SCENARIOS,
                    help="run only this scenario (repeatable); default: all but the keyed and backlog-20k ones")
    ap.add_argument("--quick", action="store_true", help="shorter scenarios, for a smoke run")
    ap.add_argument("--backlog-count", type=int,
                    help="events in every backlog scenario (keyed ones and backlog-20k included), instead of "
                         "each scenario's own count")
    ap.add_argument("--relay", action="append", choices=["outboxd", "outboxd-windows", "baseline", "windows"],
                    help="run this relay (repeatable, in this order within a round); default: outboxd, baseline; "
                         "outboxd-windows: outboxd with relay.consume = \"windows\"")
    ap.add_argument("--outboxd-windows-bin", help="the outboxd binary relay outboxd-windows runs (default: "
                    "build/outboxd), e.g. a build from before a change")
    ap.add_argument("--concurrency", type=int, help="passed to `outboxd run --concurrency`")
    ap.add_argument("--receiver-threads", type=int, default=1)
    ap.add_argument("--outboxd-dsn-params", default="",
                    help="URI parameters added to outboxd's database URL only, to try a setting, e.g. "
                         "'options=-csynchronous_commit%%3Doff'")
    ap.add_argument("--outboxd-wake", choices=["auto", "notify", "poll", "wal"],
                    help="outboxd's relay.wake (default: its own); the database must be set up for it "
                         "(`outboxd wake-setup MODE`, as bench/run.sh does)")
    args = ap.parse_args()
    if not 1 <= args.runs <= 20:
        ap.error("--runs must be 1..20")
    if args.backlog_count is not None and not 1 <= args.backlog_count <= 10_000_000:
        ap.error("--backlog-count must be 1..10000000")

    # SIGTERM (from bench/run.sh's trap) unwinds like Ctrl-C, so children are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return Bench(args).run()
    finally:
        kill_children()


if __name__ == "__main__":
    sys.exit(main())
