#!/usr/bin/env bash
# Claim cost while a long transaction elsewhere holds back vacuum.
#
#   bench/long_transaction.sh [HOLD_SECONDS [RATE [RELAY]]]   defaults: 120 s, 300 events/s, outboxd
#
# RELAY windows: the commit-ordered windows prototype (bench/windows/
# window_relay.cpp) instead of outboxd, on its own copy of the outbox
# (schema win); its round trip is the window read (read_us of --log-reads).
# RELAY outboxd-windows: outboxd with relay.consume = "windows" (its debug
# log times claims of deliveries only: see the statements per 15 s below).
#
# Starts its own durable PostgreSQL with pg_stat_statements, the bench
# receiver, build/outboxd (debug log) and a paced producer; after 10 s of
# load it opens a REPEATABLE READ transaction that takes an xid and a
# snapshot and holds it for HOLD_SECONDS. Prints per statement the mean
# execution time over the hold, then the relay's claim round trip (claim_us
# of its "claimed" debug lines) per 15 s from the start of the hold: median
# and 90th percentile; then, per 15 s, the mean execution time of the
# statements that took the most time (pg_stat_statements sampled every
# 15 s: the window read and the claims alike); then the claim statements
# that took 3 ms or more (the server's log_min_duration_statement), by where
# their walk of the claim index started: from the start of the index, from
# a low mark, or reaching back to a watched transaction's start (the low
# mark's fields, see the claim in src/pg/queries.sql). Builds nothing
# (scripts/build.sh first). Removes its cluster on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
hold=${1:-120}
rate=${2:-300}
relay=${3:-outboxd}
case $relay in
  outboxd) schema=outbox; export OUTBOXD_CONSUME=claims ;;
  outboxd-windows) schema=outbox; export OUTBOXD_CONSUME=windows ;;
  windows) schema=win ;;
  *) echo "RELAY is outboxd, outboxd-windows or windows" >&2; exit 2 ;;
esac

source scripts/throwaway_pg.sh
throwaway_dir dir outboxd-longtx
pgdir=$dir/pg
pids=()
stop_children() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
}

throwaway_pg_start "$pgdir"
on_exit stop_children
scripts/pg.sh stop "$pgdir" >/dev/null
printf "shared_preload_libraries = 'pg_stat_statements'\nlog_min_duration_statement = 3\n" >> "$pgdir/postgresql.conf"
url=$(scripts/pg.sh start "$pgdir" | tail -1)
psql -X -q "$url" -c "CREATE EXTENSION pg_stat_statements"
build/outboxd migrate --database-url "$url" --schema "$schema" 2>/dev/null
# migrate sets the outbox up for windows (sql/0016); claims take it away.
[[ -z ${OUTBOXD_CONSUME:-} ]] || build/outboxd consume-setup "$OUTBOXD_CONSUME" --database-url "$url" --schema "$schema" >/dev/null
[[ $relay == windows ]] && build/bench/outboxd-bench-windows --database-url "$url" --schema win --setup

build/bench/outboxd-bench-receiver --port-file "$dir/port" --threads 1 >"$dir/receiver.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [[ -s $dir/port ]] && break; sleep 0.1; done
if [[ $relay == windows ]]; then
  build/bench/outboxd-bench-windows --log-reads --database-url "$url" --schema win \
    --url "http://127.0.0.1:$(cat "$dir/port")/" 2>"$dir/relay.log" &
else
  build/outboxd --log-level debug run --database-url "$url" --url "http://127.0.0.1:$(cat "$dir/port")/" \
    2>"$dir/relay.log" &
fi
pids+=($!)
build/bench/outboxd-bench-producer --database-url "$url" --schema "$schema" --run 1 --out "$dir/producer.out" --mode paced \
  --rate "$rate" --count "$((rate * (hold + 20)))" >"$dir/producer.log" 2>&1 &
producer=$!
pids+=($producer)

sleep 10  # steady load first
psql -X -q "$url" -c "SELECT pg_stat_statements_reset()" >/dev/null
date +%s.%N >"$dir/hold_start"
# Every 15 s from the start of the hold until the load ends: each
# statement's calls and total execution time so far.
(
  for ((i = 0; i <= (hold + 20) / 15 + 1; i++)); do
    psql -X -q -At -F $'\t' "$url" -c "
      SELECT $i, queryid, calls, total_exec_time, left(regexp_replace(query, '\s+', ' ', 'g'), 50)
      FROM pg_stat_statements WHERE calls > 0" >>"$dir/statements.tsv" 2>/dev/null || true
    sleep 15
  done
) &
sampler=$!
pids+=($sampler)
psql -X -q "$url" -c "BEGIN ISOLATION LEVEL REPEATABLE READ" -c "SELECT txid_current()" \
  -c "SELECT count(*) FROM $schema.events" -c "SELECT pg_sleep($hold)" -c "COMMIT" >/dev/null
psql -X "$url" -c "
  SELECT calls, round((total_exec_time / calls)::numeric * 1000) AS exec_us_per_call,
         round(rows::numeric / calls, 1) AS rows_per_call,
         left(regexp_replace(query, '\s+', ' ', 'g'), 50) AS statement
  FROM pg_stat_statements WHERE calls > 10 ORDER BY total_exec_time DESC LIMIT 6"
wait "$producer" || true
kill "$sampler" 2>/dev/null || true

/usr/bin/python3 - "$dir" "$pgdir/server.log" <<'PY'
import datetime, re, sys
d = sys.argv[1]
start = float(open(d + "/hold_start").read())
buckets = {}
for line in open(d + "/relay.log"):
    us, ts = re.search(r" claim_us=(\d+)", line), re.search(r"^ts=(\S+)", line)
    if "msg=claimed" in line and us and ts:
        t = datetime.datetime.fromisoformat(ts.group(1).replace("Z", "+00:00")).timestamp()
        buckets.setdefault(int((t - start) // 15), []).append(int(us.group(1)))
    read = re.search(r"^ts=([0-9.]+) read_us=(\d+)", line)  # the windows prototype
    if read:
        buckets.setdefault(int((float(read.group(1)) - start) // 15), []).append(int(read.group(2)))
print("claim (windows: window read) round trip, from the start of the hold:")
for k in sorted(buckets):
    v = sorted(buckets[k])
    print(f"  {k * 15:+4d}..{k * 15 + 15:+4d} s  claims {len(v):5d}  median {v[len(v) // 2]:6d} us"
          f"  p90 {v[int(len(v) * 0.9)]:6d} us")

# Mean execution per call of each 15 s interval, for the 6 statements with
# the most execution time overall (pg_sleep, the hold itself, among them).
samples = {}
import os
if os.path.exists(d + "/statements.tsv"):
    for line in open(d + "/statements.tsv"):
        i, qid, calls, total, text = line.rstrip("\n").split("\t", 4)
        samples.setdefault(int(i), {})[qid] = (int(calls), float(total), text)
if samples:
    last = samples[max(samples)]
    top = sorted(last, key=lambda q: -last[q][1])[:6]
    print("mean execution per call (pg_stat_statements), per 15 s from the start of the hold:")
    for q in top:
        print(f"  {last[q][2]}")
        for i in sorted(samples)[1:]:
            c1, t1, _ = samples[i].get(q, (0, 0.0, ""))
            c0, t0, _ = samples.get(i - 1, {}).get(q, (0, 0.0, ""))
            if c1 > c0:
                print(f"    {(i - 1) * 15:+4d}..{i * 15:+4d} s  calls {c1 - c0:6d}  mean {(t1 - t0) * 1000 / (c1 - c0):8.0f} us")

# Slow claims (3 ms or more) over the hold, from the server's log: each
# execute line and the parameters logged after it by the same backend.
entries = re.split(r"\n(?=\d{4}-\d\d-\d\d )", open(sys.argv[2], errors="replace").read())
pending, kinds = {}, {}
for e in entries:
    m = re.search(r"^(\S+ \S+) UTC \[(\d+)\].*duration: ([0-9.]+) ms  execute (claim\w*)", e)
    if m:
        t = datetime.datetime.fromisoformat(m.group(1) + "+00:00").timestamp()
        if t >= start:
            pending[m.group(2)] = (float(m.group(3)), m.group(4).rsplit("_", 1)[0])
        continue
    m = re.search(r"^\S+ \S+ UTC \[(\d+)\].*DETAIL:\s+parameters:(.*)", e, re.S)
    if m and m.group(1) in pending:
        ms, name = pending.pop(m.group(1))
        mark = re.search(r"\$3 = '([^']*)'", m.group(2)) if name == "claim_from" else None
        f = mark.group(1).split("|") if mark else [""]
        kind = name if name != "claim_from" else (
            "from the start of the index" if not f[0] else
            "reaching back to a watched transaction" if len(f) > 3 else "from a low mark")
        kinds.setdefault(kind, []).append(ms)
print("claim statements of 3 ms or more during the hold, by where they started:")
for k, v in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
    v.sort()
    print(f"  {k}: {len(v)}, median {v[len(v) // 2]:.1f} ms, max {v[-1]:.1f} ms")
PY
