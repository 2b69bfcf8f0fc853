#!/usr/bin/python3
"""Where a commit's CPU goes while producers write flat out (issue 13).

    bench/producer_cpu.py [--rounds 2] [--clients 32]
                          [--modes "no-wake no-wake-hog poll-live auto-live"]

bench/producer_load.sh says what each wake mode costs producers, in commits/s
and in CPU a commit for the machine as a whole; this says whose CPU it is.
A durable throwaway cluster and pgbench with the same transaction (one
business row plus `outbox.enqueue`). Per mode, from 1 s after every client
connected, 8 s of CPU ticks of every process, by class: the producers'
backends (application name pgbench), pgbench itself, the relay and its
backends, PostgreSQL's other processes. Printed per round, as µs of CPU a commit.

Modes: no-wake (no trigger, no relay); no-wake-hog (the same, beside a
process that burns ~30% of a core in 1 ms bursts: what a relay's CPU alone
does to the others on a small machine, without its database work);
poll-live and auto-live (a relay with relay.wake = poll / auto, stdout sink);
poll-live-trigger (poll-live with the wake-up trigger installed: producers
pay its WHEN clause, as beside a busy `auto` relay, and the relay claims
every 500 ms).
--perf DIR: `perf record -g` of the producers' backends for 6 s of each
measurement, to DIR/MODE-rROUND.data.
Uses build/outboxd, or $OUTBOXD_BIN. Builds nothing; removes its cluster.
"""
import argparse
import collections
import os
import shutil
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PGBENCH = "/usr/lib/postgresql/15/bin/pgbench"
HZ = os.sysconf("SC_CLK_TCK")
TRANSACTION = """\\set amount random(1, 100000)
BEGIN;
INSERT INTO bench_orders (amount) VALUES (:amount);
SELECT outbox.enqueue('order.created', jsonb_build_object('amount', :amount));
COMMIT;
"""
HOG = ("import time\n"
       "while True:\n"
       "    t = time.perf_counter()\n"
       "    while time.perf_counter() - t < 0.0012:\n"
       "        pass\n"
       "    time.sleep(0.0028)\n")


def ticks(pid):
    """User + system clock ticks of a live process, or None."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


class Cluster:
    def __init__(self, directory):
        self.dir = directory
        out = subprocess.run([ROOT + "/scripts/pg.sh", "start", directory + "/pg"],
                             capture_output=True, text=True, check=True).stdout
        self.url = out.strip().splitlines()[-1]
        self.postmaster = int(open(directory + "/pg/postmaster.pid").readline())

    def psql(self, sql):
        return subprocess.run(["psql", "-X", "-q", "-At", self.url, "-c", sql],
                              capture_output=True, text=True, check=True).stdout.strip()

    def stop(self):
        subprocess.run([ROOT + "/scripts/pg.sh", "stop", self.dir + "/pg"], capture_output=True)

    def cpu_by_class(self, extra):
        """Ticks so far of the cluster's processes, by class, and of `extra` ({pid: class})."""
        classes = {}
        for row in self.psql("SELECT pid, coalesce(nullif(application_name, ''), backend_type) "
                             "FROM pg_stat_activity").splitlines():
            pid, name = row.split("|", 1)
            classes[int(pid)] = ("producer-backend" if name == "pgbench" else
                                 "relay-backend" if name.startswith("outboxd") else "pg:" + name)
        children = subprocess.run(["pgrep", "-P", str(self.postmaster)], capture_output=True, text=True).stdout
        seen = {}
        for pid in map(int, children.split()):
            seen[pid] = classes.get(pid, "pg:other")
        seen.update(extra)
        return {pid: (name, t) for pid, name in seen.items() if (t := ticks(pid)) is not None}


def start_helper(mode, cluster, outboxd):
    """The process a mode runs beside the producers, if any."""
    if mode == "no-wake-hog":
        return subprocess.Popen(["python3", "-c", HOG]), "hog"
    if mode in ("poll-live", "poll-live-trigger", "auto-live"):
        env = dict(os.environ, OUTBOXD_WAKE="auto" if mode == "auto-live" else "poll")
        relay = subprocess.Popen([outboxd, "run", "--database-url", cluster.url, "--schema", "outbox", "--url", "stdout",
                                  "--log-level", "warn"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.5)  # connected, listening, first claims made
        return relay, "relay"
    return None, None


def producer_pids(cluster):
    """The producers' backends (application name pgbench)."""
    return cluster.psql("SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench'").split()


def run_mode(mode, cluster, outboxd, script, clients, perf_to=None):
    cluster.psql("TRUNCATE bench_orders, outbox.events, outbox.deliveries, outbox.relay_wake")
    # poll: no trigger; auto: the trigger (which, with no relay declared
    # idle, never notifies: poll-live-trigger pays its WHEN clause alone)
    wake = "auto" if mode in ("auto-live", "poll-live-trigger") else "poll"
    subprocess.run([outboxd, "wake-setup", wake, "--database-url", cluster.url, "--schema", "outbox"],
                   capture_output=True, check=True)
    helper, helper_class = start_helper(mode, cluster, outboxd)
    try:
        cluster.psql("CHECKPOINT")
        bench = subprocess.Popen([PGBENCH, "-n", "-f", script, "-c", str(clients), "-j", "4", "-T", "30", cluster.url],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        extra = {bench.pid: "pgbench"}
        if helper:
            extra[helper.pid] = helper_class
        # past the start: every client connected (on a slow machine 32
        # connections can take longer than the 2 s this once waited)
        for _ in range(100):
            if len(producer_pids(cluster)) >= clients:
                break
            time.sleep(0.1)
        time.sleep(1)
        n0, before, t0 = int(cluster.psql("SELECT count(*) FROM bench_orders")), cluster.cpu_by_class(extra), time.time()
        if perf_to:  # where the producers' backends spend it (perf raises everyone's CPU alike)
            subprocess.Popen(["perf", "record", "-q", "-F", "499", "-g", "-p", ",".join(producer_pids(cluster)), "-o", perf_to,
                              "--", "sleep", "6"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(8)
        n1, after, t1 = int(cluster.psql("SELECT count(*) FROM bench_orders")), cluster.cpu_by_class(extra), time.time()
        bench.terminate()  # -T is a backstop: the measurement is over
        bench.wait()
    finally:
        if helper:
            helper.terminate()
            helper.wait()
    commits = n1 - n0
    spent = collections.Counter()
    for pid, (name, t) in after.items():
        if pid in before:
            spent[name] += t - before[pid][1]
    return commits / (t1 - t0), {name: t / HZ * 1e6 / commits for name, t in spent.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--modes", default="no-wake no-wake-hog poll-live auto-live")
    ap.add_argument("--perf", metavar="DIR", help="perf record the producers' backends, DIR/MODE-rROUND.data")
    args = ap.parse_args()
    outboxd = os.environ.get("OUTBOXD_BIN", ROOT + "/build/outboxd")
    directory = tempfile.mkdtemp(prefix="outboxd-producer-cpu-")
    os.chmod(directory, 0o755)  # the cluster runs as postgres when started by root
    cluster = Cluster(directory)
    try:
        subprocess.run([outboxd, "migrate", "--database-url", cluster.url, "--schema", "outbox"],
                       capture_output=True, check=True)
        cluster.psql("CREATE TABLE bench_orders (id bigserial PRIMARY KEY, amount integer NOT NULL, "
                     "at timestamptz NOT NULL DEFAULT now())")
        script = directory + "/outbox.sql"
        with open(script, "w") as f:
            f.write(TRANSACTION)
        # A new cluster zero-fills its WAL segments as it goes: warm up first.
        cluster.psql("ALTER SYSTEM SET min_wal_size = '1GB'")
        cluster.psql("SELECT pg_reload_conf()")
        subprocess.run([PGBENCH, "-n", "-f", script, "-c", "8", "-j", "4", "-T", "10", cluster.url], capture_output=True)
        # Rounds interleave the modes: a slow spell of a shared machine falls on all of them.
        for r in range(args.rounds):
            for mode in args.modes.split():
                perf_to = args.perf and os.path.join(args.perf, f"{mode}-r{r + 1}.data")
                rate, us = run_mode(mode, cluster, outboxd, script, args.clients, perf_to)
                parts = ", ".join(f"{name} {v:.1f}" for name, v in sorted(us.items(), key=lambda x: -x[1]) if v >= 0.5)
                print(f"round {r + 1} {mode}: {rate:.0f} commits/s, {sum(us.values()):.0f} µs of CPU a commit: {parts}",
                      flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
