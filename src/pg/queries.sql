-- Every statement outboxd runs at run time, one named block each
-- ("-- name: NAME" starts a block). Embedded into the binary by
-- tools/embed_sql.py; :"schema" is replaced by the quoted schema name.
-- Logs name the statement that failed.
--
-- The embedder also writes a typed descriptor per statement (pg/queries.hpp,
-- see tools/embed_sql.py), so code and SQL cannot drift apart unnoticed:
--   -- params: a, b       names $1, $2 (exactly the numbers the SQL uses)
--   -- variant V (c): :x = SQL
--                        the statement V is this one with :x filled in, and
--                        with the extra parameter c ($3) after the others
-- Every result column needs a name (a column, a function call, or AS).

-- name: bootstrap
-- Owned by the migration runner, not by a migration: it must exist before the
-- first migration runs, so that the runner can record it.
CREATE SCHEMA IF NOT EXISTS :"schema";
CREATE TABLE IF NOT EXISTS :"schema".schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_lock
-- params: schema
-- Session-level: held for the whole `outboxd migrate`, so two migrators run
-- one after the other, and the second finds nothing left to do.
SELECT pg_advisory_lock(hashtextextended('outboxd.migrate.' || $1, 0));

-- name: migration_unlock
-- params: schema
SELECT pg_advisory_unlock(hashtextextended('outboxd.migrate.' || $1, 0));

-- name: schema_installed
-- params: migrations_table
-- The table's name is quoted (it is parsed as SQL).
SELECT to_regclass($1) IS NOT NULL AS installed;

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM :"schema".schema_migrations;

-- name: record_migration
-- params: version, migration
-- Inserted first inside the migration's transaction: a concurrent migrator
-- that slipped past the lock would fail on the primary key, not apply twice.
INSERT INTO :"schema".schema_migrations (version, name) VALUES ($1, $2);

-- name: claim
-- params: owner, lease_ms
-- variant claim: :after_watermark = true
-- variant claim: :outside_drain = true
-- variant claim_from (low_mark, followed): :after_watermark = e.available_at >= least(coalesce(nullif(split_part($3::text, '|', 1), '')::timestamptz, '-infinity'), coalesce(to_timestamp(nullif(split_part($3::text, '|', 4), '')::float8 / 1000000), 'infinity'))
-- variant claim_from: :outside_drain = NOT ($4::boolean AND EXISTS (SELECT 1 FROM claimed))
-- variant claim_after (watermark_at, watermark_id): :after_watermark = (e.available_at, e.id) > ($3::timestamptz, $4::bigint)
-- variant claim_after: :outside_drain = false
-- variant claim: :own_walk = false
-- variant claim: :low_mark_param = NULL::text
-- variant claim_from: :low_mark_param = $3::text
-- variant claim_after: :low_mark_param = NULL::text
-- variant claim_from: :own_walk = false
-- variant claim_after: :own_walk = true
-- Picks due events and stamps our lease in one short statement; no
-- transaction stays open while events are delivered. Each goes to every
-- destination its topic routes to. key_pending says that the event's key
-- still has deliveries waiting somewhere (see claim_deliveries): then the
-- relay fans the event out instead, so that it queues behind them at each
-- destination.
-- Per-key order: an event with an ordering key is due only while no earlier
-- event of its key is still waiting in the table (in flight, waiting for a
-- retry, or not yet due; fanned-out ones wait in `deliveries` instead) and no
-- other event of its key is leased (a replayed dead letter has an older id
-- than events of its key that may be out already). That rule reads this
-- statement's snapshot, which misses a lease another claim has stamped but
-- not committed; so a keyed event is leased only if its claim also takes the
-- key's hold (key_holds, sql/0004). Why that holds under any interleaving:
-- the hold is taken by INSERT ... ON CONFLICT on the key's primary key, which
-- does not use the snapshot: it waits for any in-progress inserter or updater
-- of the key's row to finish and then judges the row's latest committed
-- version. Of two claims of one key, whichever reaches the row second sees
-- the first one's hold (live until its lease ends, or until its outcome
-- deletes it in the statement that ends the lease) and leases nothing. So a
-- key never has two events out at once, across any number of relays.
-- Deliveries are claimed by a statement of their own, run only when some are
-- due (deliveries_due): planning this one stays as cheap as it was before
-- destinations existed, and the fast path pays nothing.
-- :claim_size is a literal: the store prepares one statement per claim size
-- (1, 2, 4, ... 1024), so that PostgreSQL plans each once; with LIMIT as a
-- parameter the generic plan is far slower, and custom plans cost more to
-- make than the claim costs to run (bench/NOTES.md, "Database").
-- Three variants, by where the scan starts (:after_watermark):
-- claim_after, while a backlog drains: behind the last row the previous
-- (full) claim took. The index entries of rows claimed and deleted before it
-- stay in the index until vacuum; starting the scan behind them, instead of
-- wading through them at every claim, keeps a long drain from slowing down
-- as it goes. Rows behind the watermark that arrive late (a long transaction
-- commits an earlier available_at) are claimed as soon as a claim comes back
-- less than full, which ends the drain mode.
-- claim_from, outside a drain: at the low mark returned by the previous claim.
-- A claim that came back less than full took everything due and visible to
-- it, except events of a blocked key; what may still come due behind it is
-- what transactions in progress at its snapshot commit later. Each writes
-- available_at as the time of writing (clock_timestamp(): sql/0013, and the
-- relay's own statements below), after it took its lock on the table. So
-- such an event is either written by a transaction that held a lock on
-- `events` at some moment before the snapshot, and due no earlier than that
-- transaction's start, or written after that moment. The low mark is the
-- earlier of the two, read at a check (`writers`, below) that an earlier
-- statement made, less 50 ms for the clocks of two backends; never more than
-- 5 seconds back: events of a writer older than that (and events written with
-- an explicit available_at in the past) are found by the sweep, as before.
-- The check reads pg_locks and every backend's status (~0.3 ms), so a claim
-- makes it at most once a second and hands it on in its low mark ("low
-- mark|checked at|floor", which only this statement and
-- core/claim_sequence's low_mark_from_start read). Without it (a holder
-- whose start the relay's role may not see, a prepared transaction) the low
-- mark is 5 seconds back. Events whose key was blocked: the relay claims
-- from the beginning of the index at every sweep and after a keyed event
-- finished; with a check to hand on, as claim_from with an empty low mark
-- ("|checked at|floor"), else as `claim`. After a transaction the relay
-- watched (core/wake_policy.hpp) ended, the relay's next claim also reaches
-- back to that transaction's start: a fourth field, in microseconds since the
-- epoch (core/claim_sequence's low_mark_reaching), which this statement
-- does not hand on. While a long transaction elsewhere holds back vacuum
-- (and the marking of dead index entries), this keeps each claim from wading
-- through the entries of every event delivered since that transaction began
-- (with the check, only those written since the check less 50 ms: tests/pg/
-- store_pgtest.cpp, "a claim from a checked low mark walks only ...").
-- The per-key rule is tested on at most 4 * :claim_size + 256 due rows (the
-- `examined` bound): over few keys almost every due row waits behind an
-- earlier event of its key, and a scan that tested rows until LIMIT of them
-- passed read the whole backlog at every claim. A claim that reaches the
-- bound reports itself full, with its watermark at the last row examined,
-- so that the relay goes on behind it as through any backlog. Each test of
-- the rule reads a few index entries, however many events the key has: the
-- nearest earlier event of the key not fanned out, walking the key index
-- back from the row (a range and an order only that index serves, so no
-- plan walks the table instead); a lease, as the key's live hold (a leased
-- keyed event holds its key until its lease ends: the claim takes the hold
-- with the lease, and every statement that ends a lease drops its hold).
-- The row's own hold does not block it: a claim that took the hold but
-- could not lease the row leaves it due.
-- Only the first event of each key among the rows examined is tested
-- (first_of_keys): any later one of its key waits behind it (an examined row
-- is never fanned out: those are parked at 'infinity'). Over few keys,
-- testing every row cost most of a claim (10 keys: ~20 ms a claim of 256,
-- where the runs behind the keys' first events are the events it leases).
-- The list is read only when the scan meets a keyed row (the OR in `due`
-- stops at an unkeyed one): a backlog without keys pays nothing for it.
-- The cheap test first, on every key: a key held by a lease blocks all its
-- rows. Then the walk of the key index, in id order, only until the list
-- holds a quarter of the claim's size (at least 16, or the size if smaller):
-- each key taken costs the claim a hold, a walk each way and later an
-- outcome written at once, and a claim of 128 that took all of 100 keys'
-- first events left room for runs of one or two behind them. With at most
-- 32 keys it leaves runs of 4 (a relay sends no more keys at once than it
-- has connections anyway), and a 100-key drain spent ~15% less in its
-- claims (bench/results/keyed-experiments-2026-12-02.md). A claim whose
-- list was cut says it is full (below), so that the relay claims again at
-- once, behind its last key, where the other keys' first events are.
-- OFFSET 0 keeps the walk above the sort: without it the planner tests
-- every key before it sorts and cuts the list.
-- FOR UPDATE OF locked: rows are locked as they pass the rule, not as they
-- are examined; locked by ctid, a row that changed since the snapshot is
-- not locked (its new version is elsewhere).
-- followed: the relay claims again at once after this claim if it leases
-- anything (a busy `auto` relay, core/wake_policy.hpp); then the claim
-- leaves "when is the next one" (below) to the claim that leases nothing.
-- examined: the walk of the claim index, shared by the key rule, the rows
-- picked and the watermark. A CTE's rows are made as its first reader asks
-- for them and kept for the others: a claim that fills up reads only as far
-- as its last pick (the bound below needs the rest only when it did not),
-- and rows come in the walk's order, which `due` keeps (a CTE's rows through
-- a nested loop; a sort there would read the whole walk at every claim of a
-- drain). Walked once per reader, a claim that came back less than full read
-- its range twice (three times with keys); while a long transaction
-- elsewhere keeps the index entries of delivered events from being marked
-- dead, each costs a heap visit, and the range from the low mark holds two
-- for each event of the last 5 s (bench/results/
-- claims-long-transaction-2026-12-03.md: the claim's time under a held
-- transaction halved).
-- :own_walk (claim_after, a drain): `due` walks the index itself instead.
-- A drain's claims fill up, so they gain nothing from sharing the walk, and
-- keeping a CTE's rows costs ~1 us a row: 7% of a drain's claim time (the
-- planner drops the branch of the UNION ALL that a constant rules out).
-- include: claim_examined
first_of_keys AS MATERIALIZED (
    SELECT f.id
    FROM (SELECT k.id, k.ordering_key
          FROM (SELECT min(s.id) AS id, s.ordering_key
                FROM examined s
                WHERE s.ordering_key IS NOT NULL
                GROUP BY s.ordering_key) AS k
          -- a probe of the key's hold, not a join: a join may read every
          -- hold, with the dead versions outcomes leave behind
          WHERE (SELECT 1 FROM :"schema".key_holds h
                 WHERE h.ordering_key = k.ordering_key AND h.destination = ''
                   AND h.until > now() AND (h.event_id <> k.id OR h.lease_owner IS NOT NULL)
                 LIMIT 1) IS NULL
          ORDER BY k.id
          OFFSET 0) AS f
    WHERE (SELECT earlier.id FROM :"schema".events earlier
           WHERE earlier.ordering_key >= f.ordering_key
             AND (earlier.ordering_key, earlier.id) < (f.ordering_key, f.id)
             AND NOT earlier.fanned_out
           ORDER BY earlier.ordering_key DESC, earlier.id DESC
           LIMIT 1) IS NULL
    LIMIT greatest(:claim_size / 4, least(:claim_size, 16))
),
due AS (
    SELECT locked.id, locked.ctid AS tid, locked.available_at, locked.ordering_key
-- include: claim_walk
    WHERE examined.ordering_key IS NULL
       OR examined.id IN (SELECT id FROM first_of_keys)
    LIMIT :claim_size
    FOR UPDATE OF locked SKIP LOCKED
),
-- Keys in order, so that two claims wanting the same keys wait for each other
-- in one order and cannot deadlock (a claim never waits for an event row: SKIP
-- LOCKED). DISTINCT ON: one hold per key per statement (the rule above
-- already lets only one event of a key through). A hold that is not ours
-- stays locked by us until we commit (ON CONFLICT locks before it judges).
-- Runs: behind each keyed event picked, the next events of its key in id
-- order, as many as are due in a row (a delayed event, a retry's wait or
-- another lease ends the run before it), taken with it under the same
-- hold (not leased: see `followers` below), so that the relay sends a key's
-- consecutive events one after the other without a claim between them. Not for a key with deliveries waiting
-- (its events queue behind them, one by one). The claim's size bounds the
-- runs with the picked events together: what is left after them is shared
-- out round-robin, each key's first follower before any key's second, so
-- over many keys the runs are short and over few they are long. A follower
-- is locked (SKIP LOCKED) by ctid from this snapshot; one that cannot be
-- (another claim examined it, or it changed since) ends its run there.
run_candidates AS (
    SELECT f.id, f.tid, f.ordering_key, f.head, f.pos
    FROM (SELECT d.id, d.ordering_key FROM due d
          WHERE d.ordering_key IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM :"schema".deliveries w WHERE w.ordering_key = d.ordering_key)) AS head
    CROSS JOIN LATERAL (
        SELECT n.id, n.tid, head.ordering_key, head.id AS head, n.pos
        FROM (SELECT n.id, n.ctid AS tid,
                     row_number() OVER in_order AS pos,
                     bool_and(n.available_at <= now() AND NOT n.fanned_out
                              AND (n.leased_until IS NULL OR n.leased_until <= now())) OVER in_order AS unbroken
              FROM :"schema".events n
              -- The key's events after the head, as a range and an order only
              -- the key index serves (as in the rule above): with
              -- ordering_key = and id >, the plan walked the primary key from
              -- the head through every later event of every key.
              WHERE n.ordering_key <= head.ordering_key
                AND (n.ordering_key, n.id) > (head.ordering_key, head.id)
              WINDOW in_order AS (ORDER BY n.ordering_key, n.id ROWS UNBOUNDED PRECEDING)
              ORDER BY n.ordering_key, n.id
              LIMIT (SELECT ceil((:claim_size - count(*))::numeric / greatest(count(*) FILTER (WHERE ordering_key IS NOT NULL), 1))::bigint
                     FROM due)) AS n
        WHERE n.unbroken) AS f
    ORDER BY f.pos, f.head
    LIMIT (SELECT :claim_size - count(*) FROM due)
),
run_locked AS (
    SELECT e.ctid AS tid
    FROM :"schema".events e
    WHERE e.ctid = ANY (ARRAY(SELECT tid FROM run_candidates))
    FOR UPDATE SKIP LOCKED
),
runs AS (
    SELECT r.id, r.tid, r.ordering_key, r.head
    FROM (SELECT c.id, c.tid, c.ordering_key, c.head,
                 bool_and(l.tid IS NOT NULL) OVER (PARTITION BY c.head ORDER BY c.pos ROWS UNBOUNDED PRECEDING) AS unbroken
          FROM run_candidates c LEFT JOIN run_locked l ON l.tid = c.tid) AS r
    WHERE r.unbroken
),
-- Keys in order, so that two claims wanting the same keys wait for each other
-- in one order and cannot deadlock (a claim never waits for an event row: SKIP
-- LOCKED). DISTINCT ON: one hold per key per statement (the rule above
-- already lets only one event of a key through). A hold that is not ours
-- stays locked by us until we commit (ON CONFLICT locks before it judges).
-- The hold names the run's last event (the picked one when it has no run)
-- and our lease owner: the outcome of that event, the run's last, frees the
-- key. The relay sends a run in order and gives back the unsent rest when
-- one of it is not delivered, so that event's outcome comes last either way.
held AS (
    INSERT INTO :"schema".key_holds AS h (ordering_key, destination, event_id, until, lease_owner)
    SELECT DISTINCT ON (d.ordering_key) d.ordering_key, '',
           coalesce(run.last, d.id),
           now() + $2 * interval '1 millisecond', $1
    FROM due d
    -- joined, not looked up per row: a scan of `runs` for each picked event
    -- cost O(picked x run events), milliseconds in a claim of 256
    LEFT JOIN (SELECT r.head, max(r.id) AS last FROM runs r GROUP BY r.head) AS run ON run.head = d.id
    WHERE d.ordering_key IS NOT NULL
    ORDER BY d.ordering_key, d.id
    ON CONFLICT (ordering_key, destination) DO UPDATE
        SET event_id = excluded.event_id, until = excluded.until, lease_owner = excluded.lease_owner
        WHERE h.until <= now() OR (h.event_id = excluded.event_id AND h.lease_owner IS NULL)
    RETURNING h.ordering_key, h.until
),
claimed AS (
    UPDATE :"schema".events e
    SET attempts = e.attempts + 1,
        lease_owner = $1,
        -- The lease's end in a column no index covers (sql/0014): a
        -- heap-only update, no index entry; the row keeps its place in the
        -- claim index, and the walks above pass over it while the lease runs.
        -- One that ran out is found by a claim from the start of the index
        -- (the relay's sweep), or handed back with its dead relay's session.
        leased_until = now() + $2 * interval '1 millisecond'
    -- By ctid, the rows `due` locked: a TID scan, the one plan there is for
    -- this, whatever the (cached, generic) plan believed about the table.
    -- By id, a plan made while the statistics said the table was empty
    -- (a VACUUM or ANALYZE of a drained outbox whose pages remained) looked
    -- each row up in the claim index, where id is not the leading column:
    -- a scan of the whole index per row (bench/NOTES.md, "Database"). A row
    -- that `due` locked only after following a concurrent update has a ctid
    -- this statement's snapshot does not see: it is left unleased (picked,
    -- not claimed) and due, for the next claim.
    WHERE e.ctid = ANY (ARRAY(SELECT tid FROM due WHERE ordering_key IS NULL
                              UNION ALL SELECT due.tid FROM due JOIN held ON held.ordering_key = due.ordering_key))
    RETURNING e.id, e.topic, e.ordering_key, e.payload::text AS payload, e.headers::text AS headers, e.attempts,
              array_to_string(e.destinations, ',') AS destinations, e.created_at, e.ctid::text AS tid,
              NULL::text AS hold
),
-- A run's followers are not leased: the key's hold keeps every other claim
-- off them (a follower is never its key's first event while its head is
-- out, and a hold that names a row blocks it too, see first_of_keys), and
-- run_locked made sure they are still there. Writing a lease on each cost a
-- new row version and an entry in every index: 30% of a 100-key drain
-- (bench/results/keyed-experiments-2026-12-02.md, section 6). Read, with
-- the attempt their outcome will record, and the hold they are sent under
-- (its `until`, unique to this claim's hold of the key): their outcomes
-- are fenced on it (sql/0012). Behind a head this claim did not lease
-- after all (its row had moved), the relay hands them back at once, which
-- frees the key (core/relay_engine: a run without its first event).
run_held AS (
    SELECT runs.tid, held.until::text AS hold
    FROM runs JOIN held ON held.ordering_key = runs.ordering_key
),
followers AS (
    SELECT e.id, e.topic, e.ordering_key, e.payload::text AS payload, e.headers::text AS headers,
           e.attempts + 1 AS attempts, array_to_string(e.destinations, ',') AS destinations, e.created_at,
           e.ctid::text AS tid, f.hold
    FROM :"schema".events e JOIN run_held f ON f.tid = e.ctid
    WHERE e.ctid = ANY (ARRAY(SELECT tid FROM run_held))
)
SELECT c.id, c.topic, c.ordering_key, c.payload, c.headers, c.attempts,
       c.ordering_key IS NOT NULL AND EXISTS (
           SELECT 1 FROM :"schema".deliveries w WHERE w.ordering_key = c.ordering_key) AS key_pending,
       NULL::bigint AS next_due_ms, NULL::boolean AS deliveries_due, NULL::text AS watermark_at,
       NULL::bigint AS watermark_id, c.destinations, NULL::text AS low_mark, NULL::bigint AS picked,
       -- how long ago the event was written, by the database's clock (the
       -- commit-to-delivery latency of /metrics)
       (extract(epoch FROM now() - c.created_at) * 1000000)::bigint AS age_us,
       -- where the leased row version is: its outcome finds it there (complete)
       c.tid,
       -- a run's follower: the event it is sent after (the run's first)
       r.head AS run_head,
       -- a run's follower: the hold it is sent under (not leased)
       c.hold,
       NULL::boolean AS picked_keyed
FROM (SELECT * FROM claimed UNION ALL SELECT * FROM followers) AS c
LEFT JOIN runs r ON r.id = c.id
UNION ALL
-- include: claim_report

-- name: claim_unkeyed
-- params: owner, lease_ms
-- variant claim_unkeyed: :after_watermark = true
-- variant claim_unkeyed: :outside_drain = true
-- variant claim_unkeyed_from (low_mark, followed): :after_watermark = e.available_at >= least(coalesce(nullif(split_part($3::text, '|', 1), '')::timestamptz, '-infinity'), coalesce(to_timestamp(nullif(split_part($3::text, '|', 4), '')::float8 / 1000000), 'infinity'))
-- variant claim_unkeyed_from: :outside_drain = NOT ($4::boolean AND EXISTS (SELECT 1 FROM claimed))
-- variant claim_unkeyed_after (watermark_at, watermark_id): :after_watermark = (e.available_at, e.id) > ($3::timestamptz, $4::bigint)
-- variant claim_unkeyed_after: :outside_drain = false
-- variant claim_unkeyed: :own_walk = false
-- variant claim_unkeyed: :low_mark_param = NULL::text
-- variant claim_unkeyed_from: :low_mark_param = $3::text
-- variant claim_unkeyed_after: :low_mark_param = NULL::text
-- variant claim_unkeyed_from: :own_walk = false
-- variant claim_unkeyed_after: :own_walk = true
-- The claim without its per-key part (first_of_keys, runs, key holds), for
-- an outbox whose recent claims picked no event with an ordering key: the
-- same walk, variants, report row and parameters as `claim`, but it leases
-- only the events without a key among the rows it picks. Keyed ones it
-- picked it leaves as they were, and says so (picked_keyed): the relay then
-- claims again at once with `claim`, from where this one started
-- (core/claim_sequence.cpp). Most of a small claim's cost is the executor's
-- start-up and shutdown of its plan, whatever it finds: `claim` has about
-- 80 plan nodes, and PostgreSQL spent 0.40-0.56 ms executing it on an empty
-- outbox, 0.19-0.24 ms this one (bench/results/unkeyed-claim-2026-12-03.md);
-- a relay claims at every notification, and a busy one every few ms.
-- include: claim_examined
due AS (
    SELECT locked.id, locked.ctid AS tid, locked.available_at, locked.ordering_key
-- include: claim_walk
    LIMIT :claim_size
    FOR UPDATE OF locked SKIP LOCKED
),
claimed AS (
    UPDATE :"schema".events e
    SET attempts = e.attempts + 1,
        lease_owner = $1,
        leased_until = now() + $2 * interval '1 millisecond'
    WHERE e.ctid = ANY (ARRAY(SELECT tid FROM due WHERE ordering_key IS NULL))
    RETURNING e.id, e.topic, e.ordering_key, e.payload::text AS payload, e.headers::text AS headers, e.attempts,
              array_to_string(e.destinations, ',') AS destinations, e.created_at, e.ctid::text AS tid
)
SELECT c.id, c.topic, c.ordering_key, c.payload, c.headers, c.attempts, false AS key_pending,
       NULL::bigint AS next_due_ms, NULL::boolean AS deliveries_due, NULL::text AS watermark_at,
       NULL::bigint AS watermark_id, c.destinations, NULL::text AS low_mark, NULL::bigint AS picked,
       (extract(epoch FROM now() - c.created_at) * 1000000)::bigint AS age_us, c.tid,
       NULL::bigint AS run_head, NULL::text AS hold, NULL::boolean AS picked_keyed
FROM claimed c
UNION ALL
-- include: claim_report

-- fragment: claim_examined
-- The walk of the claim index (claim, claim_unkeyed).
WITH examined AS MATERIALIZED (
    SELECT e.id, e.ctid AS tid, e.available_at, e.ordering_key
    FROM :"schema".events e
    WHERE e.available_at <= now()
      AND :after_watermark
      AND (e.leased_until IS NULL OR e.leased_until <= now())
    ORDER BY e.available_at, e.id
    LIMIT 4 * :claim_size + 256
),

-- fragment: claim_walk
-- What `due` picks from (claim, claim_unkeyed).
    FROM ((SELECT e.id, e.ctid AS tid, e.available_at, e.ordering_key
           FROM :"schema".events e
           WHERE :own_walk AND e.available_at <= now()
             AND :after_watermark
             AND (e.leased_until IS NULL OR e.leased_until <= now())
           ORDER BY e.available_at, e.id
           LIMIT 4 * :claim_size + 256)
          UNION ALL
          SELECT x.id, x.tid, x.available_at, x.ordering_key FROM examined x WHERE NOT :own_walk) AS examined
    JOIN :"schema".events locked ON locked.ctid = examined.tid

-- fragment: claim_report
-- One more row (id NULL), which fills the columns from next_due_ms on:
-- milliseconds until the earliest work that is not due yet (a retry, a
-- delayed event, a delivery's lease expiring; an event's lease is not in
-- the claim index, see `claimed`), or NULL; and whether deliveries are due.
-- Computed in the same statement, with the same now() and snapshot
-- as the claim, so nothing can fall due in a gap between "claim what is due"
-- and "when is the next one".
-- Not while draining behind a watermark (:outside_drain is false in
-- claim_after, and the planner drops the subqueries), nor in a followed
-- claim_from that leased events (its subqueries never run): the next claim
-- follows at once anyway. (Before sql/0014 each lease moved its row's
-- available_at into the next lease period, and the search waded through
-- the entries every delivered event left there until vacuum.) The claim
-- that ends the drain, or leases nothing, answers it.
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       -- ORDER BY ... LIMIT 1, not min(): the planner does not turn this
       -- min() into a LIMIT 1 scan, and it then read every leased row (each
       -- a heap visit) at every claim: ~100 us a claim under load.
       CASE WHEN :outside_drain THEN ceil(extract(epoch FROM (least(
           (SELECT available_at FROM :"schema".events
            WHERE available_at > now() AND available_at < 'infinity' ORDER BY available_at LIMIT 1),
           (SELECT available_at FROM :"schema".deliveries WHERE available_at > now()
            ORDER BY available_at LIMIT 1))
       - now())) * 1000)::bigint END,
       -- only deliveries to destinations this relay knows (:known_destination
       -- is filled in by the store): another relay's are none of its business
       EXISTS (SELECT 1 FROM :"schema".deliveries WHERE available_at <= now() AND :known_destination),
       -- the watermark: the last row claimed, in claim order
       last.available_at::text, last.id, NULL,
       -- the low mark for the next claim outside a drain (claim_from, above):
       -- from the check an earlier statement made, with this claim's check
       greatest(now() - interval '5 seconds', mark.floor)::text
           || '|' || coalesce(writers.checked_at, '') || '|' || coalesce(writers.floor, ''),
       -- rows the claim picked, leased or not (a key held by another claim):
       -- "came back full" is judged on these, or a hold conflict would end
       -- a drain and move the low mark past rows still waiting; a claim
       -- that examined its bound, or took as many keys as it may, counts
       -- as full
       CASE WHEN bound.id IS NULL AND NOT capped.cut THEN (SELECT count(*) FROM due) ELSE :claim_size END,
       NULL, NULL, NULL, NULL,
       -- whether it picked events with an ordering key (claim_unkeyed leaves
       -- them as they were)
       EXISTS (SELECT 1 FROM due WHERE ordering_key IS NOT NULL)
FROM (SELECT 1) AS one
CROSS JOIN (SELECT count(*) >= greatest(:claim_size / 4, least(:claim_size, 16)) AS cut
            FROM due WHERE ordering_key IS NOT NULL) AS capped
-- the last row picked; in a claim that took as many keys as it may, the
-- last key's: rows without a key picked behind it would put the other
-- keys' first events behind the watermark, out of the next claim's reach
LEFT JOIN LATERAL (SELECT available_at, id FROM due WHERE NOT capped.cut OR ordering_key IS NOT NULL
                   ORDER BY available_at DESC, id DESC LIMIT 1) AS picked ON true
-- the last row examined, if the walk reached its bound and the claim neither
-- filled up nor took as many keys as it may (one-time filters: a claim that
-- did does not read the walk on; its watermark is the last row it picked; a
-- claim that did not has read the whole walk already)
LEFT JOIN LATERAL (SELECT x.available_at, x.id FROM examined x
                   -- CASE: the count of the walk only then (an AND may test it first)
                   WHERE CASE WHEN (SELECT count(*) FROM due) < :claim_size AND NOT capped.cut
                              THEN (SELECT count(*) FROM examined) = 4 * :claim_size + 256 END
                   ORDER BY x.available_at DESC, x.id DESC
                   LIMIT 1) AS bound ON true
CROSS JOIN LATERAL (SELECT coalesce(bound.available_at, picked.available_at) AS available_at,
                           coalesce(bound.id, picked.id) AS id) AS last
-- the check the low mark came with (claim_from), and this claim's own when
-- that one is more than a second old: the earliest start of a transaction
-- that writes `events` (RowExclusiveLock, waiting or granted; our own claim
-- among them; not vacuum's lock, nor a reader's), or the check's time if
-- none does
-- (handed on as the text it came in when not made again: a timestamp's
-- text form costs a few microseconds each way)
CROSS JOIN LATERAL (SELECT nullif(split_part(:low_mark_param, '|', 2), '')::timestamptz AS checked_at,
                           nullif(split_part(:low_mark_param, '|', 3), '')::timestamptz AS floor,
                           split_part(:low_mark_param, '|', 2) AS checked_at_text,
                           split_part(:low_mark_param, '|', 3) AS floor_text) AS mark
CROSS JOIN LATERAL (
    SELECT CASE WHEN r.refresh THEN clock_timestamp()::text ELSE mark.checked_at_text END AS checked_at,
           -- CASE: the scan only then (its subquery runs when first asked)
           CASE WHEN r.refresh THEN (
               -- A writer whose session we may not see (another role's,
               -- without pg_read_all_stats; track_activities off; a
               -- prepared transaction, which has no session): no floor
               -- (-infinity; the low mark is then 5 s back). One we see
               -- with no transaction: the backends' status is read once, at
               -- some moment of this statement, and pg_locks at another. If
               -- the status came first, the writer began after it, so after
               -- our now(); if it came second, the writer had finished by
               -- then: what it wrote is committed before the next claim's
               -- snapshot, and that claim takes it from a low mark that
               -- rests on an earlier check.
               SELECT CASE WHEN bool_and(a.pid IS NOT NULL AND a.state IS DISTINCT FROM 'disabled'
                                         AND a.query IS DISTINCT FROM '<insufficient privilege>') IS NOT FALSE
                           THEN least(min(coalesce(a.xact_start, now())), clock_timestamp())
                                - interval '50 milliseconds'
                           ELSE '-infinity' END
               FROM pg_locks l
               LEFT JOIN pg_stat_get_activity(NULL) a ON a.pid = l.pid
               WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock'
                 AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                 -- the table's oid from its row type: no name in a literal
                 AND l.relation = (SELECT t.typrelid FROM pg_type t
                                   WHERE t.oid = pg_typeof(CAST(NULL AS :"schema".events))))::text
           ELSE mark.floor_text END AS floor
    FROM (SELECT :low_mark_param IS NOT NULL
                 AND (mark.checked_at IS NULL OR mark.checked_at < now() - interval '1 second') AS refresh) AS r
) AS writers;

-- name: claim_deliveries
-- params: owner, lease_ms, destinations, windows
-- Claims due deliveries: one destination's share each of a fanned-out event
-- (see sql/0002), leased like events. A delivery is due only while no earlier
-- delivery of its key to the same destination is waiting or leased, and no
-- earlier event of its key waits to be sent; and, as in the event claim
-- (which says why), it is leased only if its claim takes the hold of its key
-- at its destination. So a key never has two events out at once at any
-- destination, across any number of relays.
-- A delivery whose event row is missing (see bury_orphan_deliveries) is
-- never claimed: it could not be sent.
-- destinations: those to claim for, which this relay knows and has a free
-- connection to. A delivery to a destination the relay does not know
-- (another relay's, or one added by a newer configuration during a rolling
-- deploy) is left alone, not failed. :claim_size as in the claim.
-- Events are looked up by (available_at, id), 'infinity' first: a delivery's
-- event is parked there (fan_out), and both indexes then find it at once.
-- By id alone, a plan made while the statistics said a drained outbox was
-- empty (0 rows on N pages) walked events in id order per delivery, or
-- scanned the whole claim index (available_at, id) per delivery: 68,000
-- buffers a claim of 128 (bench/NOTES.md, "Database"). The second branch
-- runs only for an event not parked (a dead-letter replay revived it and
-- then one of its deliveries) or gone; it may scan the index's other rows.
-- Deliveries are leased by the ctid `due` locked, as in the event claim.
-- windows (relay.consume = "windows"): an event read from a window (txid
-- set) and not fanned out never holds a delivery back: a delivered one only
-- waits for cleanup, and one not sent yet is parked behind the key's
-- deliveries when it is read (key_pending), in commit order.
WITH due AS (
    SELECT d.event_id, d.destination, d.ordering_key, d.ctid AS tid
    FROM :"schema".deliveries d
    WHERE d.available_at <= now()
      AND d.destination = ANY ($3::text[])
      AND EXISTS (SELECT 1 FROM :"schema".events owner
                  WHERE owner.available_at = 'infinity' AND owner.id = d.event_id
                  UNION ALL
                  SELECT 1 FROM :"schema".events owner
                  WHERE owner.available_at < 'infinity' AND owner.id = d.event_id)
      AND (d.ordering_key IS NULL OR (
              NOT EXISTS (
                  SELECT 1 FROM :"schema".deliveries other
                  WHERE other.ordering_key = d.ordering_key
                    AND other.destination = d.destination
                    AND (other.event_id < d.event_id
                         OR (other.lease_owner IS NOT NULL AND other.available_at > now())))
              AND NOT EXISTS (
                  SELECT 1 FROM :"schema".events earlier
                  WHERE earlier.ordering_key = d.ordering_key
                    AND earlier.id < d.event_id
                    AND NOT earlier.fanned_out
                    AND NOT ($4::boolean AND earlier.txid IS NOT NULL))))
    ORDER BY d.available_at, d.event_id
    LIMIT :claim_size
    FOR UPDATE SKIP LOCKED
),
held AS (
    INSERT INTO :"schema".key_holds AS h (ordering_key, destination, event_id, until)
    SELECT DISTINCT ON (ordering_key, destination)
           ordering_key, destination, event_id, now() + $2 * interval '1 millisecond'
    FROM due
    WHERE ordering_key IS NOT NULL
    ORDER BY ordering_key, destination, event_id
    ON CONFLICT (ordering_key, destination) DO UPDATE
        SET event_id = excluded.event_id, until = excluded.until
        WHERE h.until <= now() OR h.event_id = excluded.event_id
    RETURNING h.event_id, h.destination
),
claimed AS (
    UPDATE :"schema".deliveries d
    SET attempts = d.attempts + 1,
        lease_owner = $1,
        available_at = now() + $2 * interval '1 millisecond'
    WHERE d.ctid = ANY (ARRAY(SELECT tid FROM due WHERE ordering_key IS NULL
                              UNION ALL
                              SELECT due.tid FROM due
                              JOIN held ON held.event_id = due.event_id AND held.destination = due.destination))
    RETURNING d.event_id, d.destination, d.attempts
)
SELECT e.id, e.topic, e.ordering_key, e.payload::text AS payload, e.headers::text AS headers, c.attempts,
       c.destination, (extract(epoch FROM now() - e.created_at) * 1000000)::bigint AS age_us
FROM claimed c
CROSS JOIN LATERAL (
    (SELECT e.id, e.topic, e.ordering_key, e.payload, e.headers, e.created_at
     FROM :"schema".events e WHERE e.available_at = 'infinity' AND e.id = c.event_id
     UNION ALL
     SELECT e.id, e.topic, e.ordering_key, e.payload, e.headers, e.created_at
     FROM :"schema".events e WHERE e.available_at < 'infinity' AND e.id = c.event_id)
    LIMIT 1) e;

-- name: complete
-- params: ids, attempts, owner, tids, holds
-- Delivered: the events leave the hot table. Fenced: only rows that still
-- carry our lease and the attempt number we claimed them with. Their keys'
-- holds go with them (see the claim); every statement below that ends a
-- lease does the same. ids, attempts, tids and holds are parallel arrays;
-- tids are where the claim left each row.
-- A run's follower carries no lease (holds: the `until` of the hold it was
-- sent under, NULL for a leased row): fenced instead on carrying no lease,
-- an attempt one less than claimed (not counted until its outcome), and no
-- live hold of its key but the one it was sent under. Another claim of the
-- key (ours again included, after our hold ran out) holds it under another
-- hold, or leased the row; a key nobody holds any more has nobody sending
-- the row either. Every statement below that ends a lease fences so.
-- Found by ctid (a TID scan, the one plan there is), not by id: planned
-- while the statistics said a drained outbox was empty (0 rows on N pages),
-- a lookup by id used the claim index (available_at, id), one scan of the
-- whole index per row, and a batch of thousands ran into the statement
-- timeout (bench/NOTES.md, "Database"). Nothing else updates a leased row
-- before its outcome; a row that moved all the same (a table rewrite:
-- VACUUM FULL, CLUSTER) is not found and counts as fenced out, and its
-- lease runs out. The id and attempt are still checked: array_position is
-- a loop in C over the batch, cheap at the sizes the relay writes.
WITH leased AS (
    DELETE FROM :"schema".events e
    WHERE e.ctid = ANY ($4::tid[]) AND e.lease_owner = $3
      AND e.attempts = ($2::integer[])[array_position($1::bigint[], e.id)]
      AND ($5::text[])[array_position($1::bigint[], e.id)] IS NULL
    RETURNING e.id, e.ordering_key
), followers AS (
    DELETE FROM :"schema".events e
    WHERE e.ctid = ANY ($4::tid[]) AND e.lease_owner IS NULL
      AND e.attempts = ($2::integer[])[array_position($1::bigint[], e.id)] - 1
      AND ($5::text[])[array_position($1::bigint[], e.id)] IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM :"schema".key_holds h
                      WHERE h.ordering_key = e.ordering_key AND h.destination = '' AND h.until > now()
                        AND (h.until, h.lease_owner) IS DISTINCT FROM
                            (($5::text[])[array_position($1::bigint[], e.id)]::timestamptz, $3))
    RETURNING e.id, e.ordering_key
), gone AS (
    SELECT * FROM leased UNION ALL SELECT * FROM followers
), unheld AS (
    DELETE FROM :"schema".key_holds h
    USING gone
    WHERE h.ordering_key = gone.ordering_key AND h.destination = '' AND h.event_id = gone.id
)
SELECT id FROM gone;

-- name: event_tid
-- params: id
-- Where an event's row is, for an outcome whose caller does not know it
-- (the relay always does: the claim returned it). By id: the lookup that
-- the statements below avoid.
SELECT ctid::text AS tid FROM :"schema".events WHERE id = $1;

-- name: reschedule
-- params: id, attempt, owner, delay_ms, error, tid, hold
-- Failed, to be retried after delay_ms. Fenced like `complete`, and found
-- like it by the ctid the claim returned (tid; NULL: not found, fenced out):
-- `id + 0`, so that no index offers another way to the row than the TID scan.
-- By id, planned while the statistics said a drained outbox was empty, it
-- scanned the whole claim index; so did every statement below that ends one
-- event's lease (bench/NOTES.md, "Database").
WITH retried AS (
    UPDATE :"schema".events
    SET available_at = clock_timestamp() + $4 * interval '1 millisecond',
        last_error = $5,
        lease_owner = NULL, leased_until = NULL,
        attempts = $2
    WHERE ctid = $6::tid AND id + 0 = $1
      AND CASE WHEN $7::text IS NULL THEN lease_owner = $3 AND attempts = $2
              ELSE lease_owner IS NULL AND attempts = $2 - 1
                   AND NOT EXISTS (SELECT 1 FROM :"schema".key_holds h
                              WHERE h.ordering_key = events.ordering_key AND h.destination = '' AND h.until > now()
                                AND (h.until, h.lease_owner) IS DISTINCT FROM ($7::text::timestamptz, $3))
         END
    RETURNING id, ordering_key
), unheld AS (
    DELETE FROM :"schema".key_holds h
    USING retried
    WHERE h.ordering_key = retried.ordering_key AND h.destination = '' AND h.event_id = retried.id
)
SELECT id FROM retried;

-- name: bury
-- params: id, attempt, owner, error, status, response_excerpt, tid, hold
-- Failed for good: moved to dead letters in one statement. Fenced and found
-- like `reschedule`.
-- An id can die twice (its event re-inserted under the same id, an outbox
-- restored with an older id sequence): the newer death replaces the older
-- dead letter. It is what the row leaving `events` holds, so it must not be
-- dropped; its error is the one to act on; and its died_at restarts the
-- retention. Failing instead would fail the relay's whole outcome batch.
WITH gone AS (
    DELETE FROM :"schema".events
    WHERE ctid = $7::tid AND id + 0 = $1
      AND CASE WHEN $8::text IS NULL THEN lease_owner = $3 AND attempts = $2
              ELSE lease_owner IS NULL AND attempts = $2 - 1
                   AND NOT EXISTS (SELECT 1 FROM :"schema".key_holds h
                              WHERE h.ordering_key = events.ordering_key AND h.destination = '' AND h.until > now()
                                AND (h.until, h.lease_owner) IS DISTINCT FROM ($8::text::timestamptz, $3))
         END
    RETURNING id, topic, ordering_key, payload, headers, idempotency_key, created_at
), unheld AS (
    DELETE FROM :"schema".key_holds h
    USING gone
    WHERE h.ordering_key = gone.ordering_key AND h.destination = '' AND h.event_id = gone.id
)
INSERT INTO :"schema".dead_letters
    (id, topic, ordering_key, payload, headers, idempotency_key, created_at, attempts,
     last_error, last_status, response_excerpt)
SELECT id, topic, ordering_key, payload, headers, idempotency_key, created_at, $2,
       $4, $5, $6
FROM gone
ON CONFLICT (id, destination) DO UPDATE
    SET topic = excluded.topic, ordering_key = excluded.ordering_key, payload = excluded.payload,
        headers = excluded.headers, idempotency_key = excluded.idempotency_key,
        created_at = excluded.created_at, attempts = excluded.attempts, last_error = excluded.last_error,
        last_status = excluded.last_status, response_excerpt = excluded.response_excerpt, died_at = now()
RETURNING id;

-- name: release
-- params: owner
-- Graceful shutdown: hand back what we hold but could not finish, due now,
-- so another relay (or our successor) picks it up without waiting for the lease.
-- Our key holds go too, by owner: those of runs whose rest was never sent
-- name followers, which carry no lease (sql/0012).
WITH events_released AS (
    UPDATE :"schema".events
    SET available_at = clock_timestamp(), lease_owner = NULL, leased_until = NULL
    WHERE lease_owner = $1
    RETURNING id, ordering_key
), deliveries_released AS (
    UPDATE :"schema".deliveries
    SET available_at = now(), lease_owner = NULL
    WHERE lease_owner = $1
    RETURNING event_id, destination, ordering_key
), unheld AS (
    DELETE FROM :"schema".key_holds h
    WHERE (h.ordering_key, h.destination, h.event_id) IN (
        SELECT ordering_key, '', id FROM events_released WHERE ordering_key IS NOT NULL
        UNION ALL
        SELECT ordering_key, destination, event_id FROM deliveries_released WHERE ordering_key IS NOT NULL)
       OR (h.lease_owner = $1 AND h.destination = '')
)
SELECT id FROM events_released
UNION ALL
SELECT event_id FROM deliveries_released;

-- name: release_untracked
-- params: owner, keep_ids, keep_delivery_ids, keep_delivery_destinations
-- After a claim whose answer was lost (the connection died between the
-- claim's commit and its answer): every lease of ours that the relay does
-- not hold (keep_*: what it holds, claimed and not yet recorded) was taken
-- by that claim, for events nobody will send. Handed back due now, the
-- claim's attempt taken back: no request was made. Without this they wait
-- out the lease and the sweep after it, as no takeover frees the leases of
-- a relay that lives. Only leases still running. Likewise our key holds
-- whose run the relay does not hold (a hold names its run's last event).
WITH events_released AS (
    UPDATE :"schema".events
    SET available_at = clock_timestamp(), lease_owner = NULL, leased_until = NULL, attempts = attempts - 1
    WHERE lease_owner = $1 AND leased_until > now()
      AND id <> ALL ($2::bigint[])
    RETURNING id, ordering_key
), deliveries_released AS (
    UPDATE :"schema".deliveries
    SET available_at = now(), lease_owner = NULL, attempts = attempts - 1
    WHERE lease_owner = $1 AND available_at > now()
      AND (event_id, destination) NOT IN (SELECT * FROM unnest($3::bigint[], $4::text[]))
    RETURNING event_id, destination, ordering_key
), unheld AS (
    DELETE FROM :"schema".key_holds h
    WHERE (h.ordering_key, h.destination, h.event_id) IN (
        SELECT ordering_key, '', id FROM events_released WHERE ordering_key IS NOT NULL
        UNION ALL
        SELECT ordering_key, destination, event_id FROM deliveries_released WHERE ordering_key IS NOT NULL)
       OR (h.lease_owner = $1 AND h.destination = '' AND h.until > now() AND h.event_id <> ALL ($2::bigint[]))
)
SELECT id FROM events_released
UNION ALL
SELECT event_id FROM deliveries_released;

-- name: fan_out
-- params: id, attempt, owner, tid, hold
-- Some destination failed (or the event's key has deliveries waiting): park
-- the event and let each destination it still owes carry its own state from
-- here. Fenced and found like `reschedule`; the rows to write follow in
-- fan_out_deliveries and fan_out_dead, in the same transaction. A parked
-- event is found by (available_at, id) = ('infinity', id): from there on,
-- both indexes find it at once, whatever the statistics say.
WITH parked AS (
    UPDATE :"schema".events
    SET fanned_out = true, available_at = 'infinity', lease_owner = NULL, leased_until = NULL, attempts = $2
    WHERE ctid = $4::tid AND id + 0 = $1
      AND CASE WHEN $5::text IS NULL THEN lease_owner = $3 AND attempts = $2
              ELSE lease_owner IS NULL AND attempts = $2 - 1
                   AND NOT EXISTS (SELECT 1 FROM :"schema".key_holds h
                              WHERE h.ordering_key = events.ordering_key AND h.destination = '' AND h.until > now()
                                AND (h.until, h.lease_owner) IS DISTINCT FROM ($5::text::timestamptz, $3))
         END
    RETURNING id, ordering_key
), unheld AS (
    DELETE FROM :"schema".key_holds h
    USING parked
    WHERE h.ordering_key = parked.ordering_key AND h.destination = '' AND h.event_id = parked.id
)
SELECT id FROM parked;

-- name: fan_out_deliveries
-- params: id, destinations, due_ms, attempts, errors
-- Parallel arrays, one element per destination: when it is due, the attempts
-- made there so far, the last error there (NULL if none yet).
INSERT INTO :"schema".deliveries (event_id, destination, ordering_key, available_at, attempts, last_error)
SELECT e.id, d.destination, e.ordering_key, now() + d.due_ms * interval '1 millisecond', d.attempts, d.error
FROM :"schema".events e,
     unnest($2::text[], $3::bigint[], $4::integer[], $5::text[]) AS d(destination, due_ms, attempts, error)
WHERE e.available_at = 'infinity' AND e.id = $1
ON CONFLICT (event_id, destination) DO NOTHING;

-- name: fan_out_dead
-- params: id, destination, attempts, error, status, response_excerpt
-- One destination's delivery of the event failed for good. Replaces an
-- earlier dead letter of the event there, as in `bury`. status: the HTTP
-- status, or NULL.
INSERT INTO :"schema".dead_letters
    (id, topic, ordering_key, payload, headers, idempotency_key, created_at, attempts,
     last_error, last_status, response_excerpt, destination)
SELECT id, topic, ordering_key, payload, headers, idempotency_key, created_at, $3, $4, $5, $6, $2
FROM :"schema".events
WHERE available_at = 'infinity' AND id = $1
ON CONFLICT (id, destination) DO UPDATE
    SET topic = excluded.topic, ordering_key = excluded.ordering_key, payload = excluded.payload,
        headers = excluded.headers, idempotency_key = excluded.idempotency_key,
        created_at = excluded.created_at, attempts = excluded.attempts, last_error = excluded.last_error,
        last_status = excluded.last_status, response_excerpt = excluded.response_excerpt, died_at = now();

-- name: lock_events
-- params: ids
-- Taken (in id order, so two relays cannot deadlock) before finishing
-- deliveries of these events: the relay that finishes the last delivery of
-- an event is then sure to see that it was the last, and deletes the event.
-- Only parked events (see fan_out) are ever deleted so.
SELECT id FROM :"schema".events WHERE available_at = 'infinity' AND id = ANY($1::bigint[]) ORDER BY id FOR UPDATE;

-- name: complete_deliveries
-- params: ids, destinations, attempts, owner
-- Delivered to one destination each (parallel arrays). Fenced on lease
-- owner and attempt.
WITH gone AS (
    DELETE FROM :"schema".deliveries d
    USING unnest($1::bigint[], $2::text[], $3::integer[]) AS done(id, destination, attempt)
    WHERE d.event_id = done.id AND d.destination = done.destination
      AND d.attempts = done.attempt AND d.lease_owner = $4
    RETURNING d.event_id, d.destination, d.ordering_key
), unheld AS (
    DELETE FROM :"schema".key_holds h
    USING gone
    WHERE h.ordering_key = gone.ordering_key AND h.destination = gone.destination
      AND h.event_id = gone.event_id
)
SELECT event_id FROM gone;

-- name: reschedule_delivery
-- params: id, destination, attempt, owner, delay_ms, error
-- Fenced.
WITH retried AS (
    UPDATE :"schema".deliveries
    SET available_at = now() + $5 * interval '1 millisecond',
        last_error = $6,
        lease_owner = NULL
    WHERE event_id = $1 AND destination = $2 AND attempts = $3 AND lease_owner = $4
    RETURNING event_id, destination, ordering_key
), unheld AS (
    DELETE FROM :"schema".key_holds h
    USING retried
    WHERE h.ordering_key = retried.ordering_key AND h.destination = retried.destination
      AND h.event_id = retried.event_id
)
SELECT event_id FROM retried;

-- name: bury_delivery
-- params: id, destination, attempt, owner, error, status, response_excerpt
-- One destination's delivery failed for good: a dead letter naming that
-- destination (replacing an earlier one there, as in `bury`). Fenced.
WITH gone AS (
    DELETE FROM :"schema".deliveries
    WHERE event_id = $1 AND destination = $2 AND attempts = $3 AND lease_owner = $4
    RETURNING event_id, destination, attempts, ordering_key
), unheld AS (
    DELETE FROM :"schema".key_holds h
    USING gone
    WHERE h.ordering_key = gone.ordering_key AND h.destination = gone.destination
      AND h.event_id = gone.event_id
), buried AS (
    INSERT INTO :"schema".dead_letters
        (id, topic, ordering_key, payload, headers, idempotency_key, created_at, attempts,
         last_error, last_status, response_excerpt, destination)
    SELECT e.id, e.topic, e.ordering_key, e.payload, e.headers, e.idempotency_key, e.created_at,
           gone.attempts, $5, $6, $7, gone.destination
    FROM gone JOIN :"schema".events e ON e.id = gone.event_id
    ON CONFLICT (id, destination) DO UPDATE
        SET topic = excluded.topic, ordering_key = excluded.ordering_key, payload = excluded.payload,
            headers = excluded.headers, idempotency_key = excluded.idempotency_key,
            created_at = excluded.created_at, attempts = excluded.attempts, last_error = excluded.last_error,
            last_status = excluded.last_status, response_excerpt = excluded.response_excerpt, died_at = now()
)
SELECT event_id FROM gone;

-- name: delete_finished_events
-- params: ids
-- Fanned-out events whose last delivery is done (parked: see fan_out).
DELETE FROM :"schema".events e
WHERE e.available_at = 'infinity' AND e.id = ANY($1::bigint[])
  AND e.fanned_out
  AND NOT EXISTS (SELECT 1 FROM :"schema".deliveries d WHERE d.event_id = e.id)
RETURNING e.id;

-- name: bury_orphan_deliveries
-- Deliveries whose event row is gone cannot be sent (the payload lived in
-- it). Only a dead-letter replay racing the event's last delivery made them
-- (fixed by dead_replay_lock); an outbox may still hold some. Each becomes a
-- dead letter of its destination that says so, visible in `dead list` and
-- `status`, and stops holding back its key there. Run at every sweep.
WITH gone AS (
    DELETE FROM :"schema".deliveries d
    WHERE NOT EXISTS (SELECT 1 FROM :"schema".events e WHERE e.id = d.event_id)
      AND (d.lease_owner IS NULL OR d.available_at <= now())
    RETURNING d.event_id, d.destination, d.ordering_key, d.attempts
)
INSERT INTO :"schema".dead_letters
    (id, topic, ordering_key, payload, headers, created_at, attempts, last_error, destination)
SELECT event_id, '(unknown: event row missing)', ordering_key, 'null', '{}', now(), attempts,
       'this delivery had lost its event row (a dead-letter replay raced its last delivery); '
       'topic and payload are gone, replaying it sends null', destination
FROM gone
ON CONFLICT DO NOTHING
RETURNING id, destination;

-- name: forget_expired_key_holds
-- A hold is deleted with the lease it belongs to; one whose relay died
-- expires instead, and is taken over by the next claim of its key. If no
-- event of that key comes again it would stay forever: the sweep forgets
-- holds that expired a while ago (an hour: far past any lease).
DELETE FROM :"schema".key_holds WHERE until < now() - interval '1 hour';

-- name: message_prefix
-- What every webhook-id of this outbox starts with (sql/0005): the relay
-- reads it once, at startup.
SELECT 'msg_' || left(replace(id::text, '-', ''), 16) || '_' AS prefix FROM :"schema".outbox_identity;

-- name: declare_wake
-- params: owner, idle, valid_ms
-- The relay says whether it is idle (sql/0008; a trigger publishes it in the
-- sequence relay_idle_until, sql/0010): producers notify only while
-- some relay is. valid_ms: the row counts until then; the relay refreshes it
-- at every sweep. Rows of relays that died (past their `until` for an
-- hour) go at the same time, so restarts do not pile them up.
WITH gone AS (
    DELETE FROM :"schema".relay_wake WHERE until < now() - interval '1 hour' AND owner <> $1
)
INSERT INTO :"schema".relay_wake (owner, idle, until)
VALUES ($1, $2, now() + $3 * interval '1 millisecond')
ON CONFLICT (owner) DO UPDATE SET idle = excluded.idle, until = excluded.until;

-- name: forget_wake
-- params: owner
DELETE FROM :"schema".relay_wake WHERE owner = $1;

-- name: transactions_in_progress
-- The transactions in progress now that may have read "busy", by xid, with
-- how far back their events may be due. Run right after the relay declared
-- itself idle: a producer that read "busy" before that commit is either
-- committed (the next claim sees its event) or among these.
-- A snapshot lists only ids below its xmax (the last completed id plus one):
-- those at or past it come from the lock each transaction holds on its own
-- id (32 bits there, widened against xmax).
-- A producer reads the declaration in its wake-up trigger, after its insert,
-- so it holds RowExclusiveLock on `events` (or `deliveries`) from before
-- that read until it ends. pg_locks is read once, after the declaration
-- committed: first each backend's fast-path locks (where such a table lock
-- usually is), then the main lock table (where each transaction's lock on
-- its own id is, and a table lock moved out of the fast path). A
-- transaction whose id's lock is there was running throughout, so a table
-- lock it took before the declaration committed shows in one of the two
-- reads. One with no such lock cannot have read "busy" (a read from now on
-- sees "idle"), and is not listed. Nor is a transaction
-- that does not write `events` (a long report, a transaction held open
-- elsewhere): watching it would make the claim at its end look back over
-- everything since it began, for nothing.
-- written_since_us: the writer's start (microseconds since the epoch), less
-- 50 ms for the clocks of two backends; its events are due no earlier
-- (sql/0013: written at clock_timestamp()). NULL when not known: its
-- session not visible to our role (pg_read_all_stats), a prepared
-- transaction (no session), an id that is not its session's own (a
-- subtransaction's), or a transaction that ended during this statement
-- (its id's lock gone): the claim after it then starts from the beginning
-- of the outbox.
WITH snap AS (SELECT pg_current_snapshot() AS s),
     top AS (SELECT pg_snapshot_xmax(s)::text::bigint AS xmax FROM snap),
     locks AS MATERIALIZED (SELECT locktype, mode, granted, transactionid, virtualtransaction, pid, database,
                                   relation
                            FROM pg_locks),
     holders AS (SELECT l.transactionid::text::bigint AS xid32, l.virtualtransaction, l.pid FROM locks l
                 WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted),
     ahead AS (SELECT top.xmax, ((h.xid32 - top.xmax) % 4294967296 + 4294967296) % 4294967296 AS d
               FROM holders h, top),
     running AS (SELECT x::text::bigint AS x FROM snap, pg_snapshot_xip(snap.s) AS x
                 UNION
                 SELECT xmax + d FROM ahead WHERE d < 2147483648),
     -- the tables' oids from their row types: no name in a literal
     tables AS (SELECT (SELECT t.typrelid FROM pg_type t
                        WHERE t.oid = pg_typeof(CAST(NULL AS :"schema".events))) AS events,
                       (SELECT t.typrelid FROM pg_type t
                        WHERE t.oid = pg_typeof(CAST(NULL AS :"schema".deliveries))) AS deliveries),
     writers AS (SELECT l.virtualtransaction, bool_or(l.relation = tables.events) AS events
                 FROM locks l, tables
                 WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock'
                   AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                   AND l.relation IN (tables.events, tables.deliveries)
                 GROUP BY l.virtualtransaction)
SELECT r.x::text AS xid,
       coalesce(w.events, true) AS writes_events,
       CASE WHEN w.events AND a.xact_start IS NOT NULL
            THEN (extract(epoch FROM least(a.xact_start, clock_timestamp()) - interval '50 milliseconds')
                  * 1000000)::bigint END AS written_since_us
FROM running r
LEFT JOIN holders h ON h.xid32 = r.x % 4294967296
LEFT JOIN writers w ON w.virtualtransaction = h.virtualtransaction
LEFT JOIN pg_stat_get_activity(NULL) a ON a.pid = h.pid AND a.backend_xid::text::bigint = r.x % 4294967296
WHERE h.virtualtransaction IS NULL OR w.virtualtransaction IS NOT NULL
ORDER BY r.x;

-- name: still_in_progress
-- params: xids
-- Those of xids (comma-separated) still in progress.
SELECT coalesce(string_agg(x::text, ','), '') AS xids
FROM unnest(string_to_array(nullif($1, ''), ',')::xid8[]) AS x
WHERE pg_xact_status(x) = 'in progress';

-- name: notify_channel
-- params: channel
-- The relay's self-test: a notification on its own channel, from a
-- connection other than the one that listens, as a producer's would come.
SELECT pg_notify($1, '') AS sent;

-- name: wake_trigger_installed
-- params: schema
-- Whether producers' inserts notify at all (`outboxd wake-trigger`). The
-- schema by value, never spliced into a literal.
SELECT count(*) AS triggers
FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = 'events' AND t.tgname = 'events_notify';

-- name: not_yet_visible
-- params: xids
-- Of these transactions, whose commits the WAL stream showed (32-bit ids,
-- comma-separated), those a new snapshot still counts as in progress: the
-- commit record is flushed (and streamed) before the committing backend
-- leaves the list of running transactions. In progress for a snapshot:
-- among its xip, or at or past its xmax (compared modulo 2^32, as xids
-- wrap).
WITH snap AS (SELECT pg_current_snapshot() AS s),
     x AS (SELECT unnest(string_to_array(nullif($1, ''), ','))::bigint AS xid)
SELECT coalesce(string_agg(x.xid::text, ','), '') AS xids
FROM x, snap
WHERE x.xid IN (SELECT i::text::bigint % 4294967296 FROM pg_snapshot_xip(snap.s) AS i)
   OR (x.xid - pg_snapshot_xmax(snap.s)::text::bigint % 4294967296 + 4294967296) % 4294967296 < 2147483648;

-- name: wal_wake_readiness
-- params: publication, schema
-- What relay.wake = "wal" needs, read at its start so that each missing
-- piece is reported with what to do (README "Wake-up modes"). A role may
-- stream if it has REPLICATION or is a superuser; on RDS and Aurora,
-- membership in rds_replication grants it instead. The counts of slots and
-- WAL senders are a snapshot: another client may take the last one first,
-- which the stream then reports when it tries.
SELECT current_user::text AS role,
       current_setting('wal_level') AS wal_level,
       coalesce((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false)
           OR coalesce((SELECT pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles
                        WHERE rolname = 'rds_replication'), false) AS may_replicate,
       EXISTS (SELECT 1 FROM pg_publication p
               JOIN pg_publication_tables t ON t.pubname = p.pubname
               WHERE p.pubname = $1 AND p.pubinsert AND t.schemaname = $2 AND t.tablename = 'events')
           AS publication_ready,
       current_setting('max_replication_slots')::bigint - (SELECT count(*) FROM pg_replication_slots) AS free_slots,
       current_setting('max_wal_senders')::bigint - (SELECT count(*) FROM pg_stat_replication) AS free_senders;

-- name: wake_trigger_drop_events
DROP TRIGGER IF EXISTS events_notify ON :"schema".events;

-- name: wake_trigger_drop_deliveries
DROP TRIGGER IF EXISTS deliveries_notify ON :"schema".deliveries;

-- name: wake_triggers_create
-- The triggers on events and deliveries, as sql/0010 defines them.
SELECT :"schema".install_wake_triggers(false);

-- name: consume_setup_txid_default
-- `outboxd consume-setup windows`: every new event records the top-level
-- id of the transaction that inserts it (sql/0009), which is what a window
-- reads by. Catalog only: rows already there keep NULL (in no window).
ALTER TABLE :"schema".events ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

-- name: consume_setup_txid_index
-- Window membership reads a range of txids (transactions that began
-- between the two snapshots) and probes single txids (those running at A
-- and finished by B); `id` lets the window's ids be read in one pass and the
-- resume bound (id >= done_below) be checked on the index entry. Partial:
-- rows from before the setup are never read through it. Built under a SHARE
-- lock (producers wait while it reads the events table once).
CREATE INDEX IF NOT EXISTS events_txid_idx ON :"schema".events (txid, id) WHERE txid IS NOT NULL;

-- name: consume_setup_pre_window_index
-- The events from before the setup, by key: a window event must wait behind
-- an earlier one of its key still to send (read_window's key_pending).
-- Through events_ordering_key_idx that probe would visit every row of the
-- key below the event; once the default is set no new row enters this
-- index, so producers pay nothing for it and it empties as the old rows
-- are delivered.
CREATE INDEX IF NOT EXISTS events_pre_window_key_idx ON :"schema".events (ordering_key, id)
    WHERE txid IS NULL AND ordering_key IS NOT NULL;

-- name: consume_setup_drop_txid_default
-- `outboxd consume-setup claims`: producers stop paying for windows.
ALTER TABLE :"schema".events ALTER COLUMN txid DROP DEFAULT;

-- name: consume_setup_drop_txid_index
DROP INDEX IF EXISTS :"schema".events_txid_idx;

-- name: consume_setup_drop_pre_window_index
DROP INDEX IF EXISTS :"schema".events_pre_window_key_idx;

-- name: windows_set_up
-- params: schema
-- Whether `outboxd consume-setup windows` ran: the txid default and the
-- index the window read needs. The schema by value.
SELECT coalesce((SELECT pg_get_expr(d.adbin, d.adrelid) = 'pg_current_xact_id()'
                 FROM pg_attrdef d
                 JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
                 JOIN pg_class c ON c.oid = d.adrelid
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = 'events' AND a.attname = 'txid'), false) AS txid_default,
       EXISTS (SELECT 1 FROM pg_class i JOIN pg_namespace n ON n.oid = i.relnamespace
               WHERE n.nspname = $1 AND i.relname = 'events_txid_idx' AND i.relkind = 'i') AS txid_index;

-- name: windows_relays_alive
-- Relays alive that read windows: registered so (sql/0015; one that has
-- just started may hold no cursor yet, e.g. while it parks the events from
-- before the setup) or holding cursors (older ones). `consume-setup claims`
-- must not take the txid default away under them (their windows would
-- never see the events inserted after it). OFFSET 0: the lock is tried
-- only for rows past the filter.
SELECT count(*) AS relays
FROM (SELECT r.lock_key FROM :"schema".relays r
      WHERE r.consume = 'windows'
         OR EXISTS (SELECT 1 FROM :"schema".cursors c WHERE c.owner = r.lease_owner)
      OFFSET 0) AS o
WHERE NOT pg_try_advisory_xact_lock_shared(o.lock_key);

-- name: cursors_lock
-- `outboxd cursor reset`: relays take and write cursors (INSERT, UPDATE)
-- only after it commits.
LOCK TABLE :"schema".cursors IN SHARE ROW EXCLUSIVE MODE;

-- name: cursors_reset
-- `outboxd cursor reset`, under cursors_lock with no windows relay alive:
-- a missing cursor is created at the beginning when a relay takes it.
WITH gone AS (DELETE FROM :"schema".cursors RETURNING 1)
SELECT count(*) AS cursors FROM gone;

-- name: purge_idempotency_keys
-- params: retention_ms
-- Returns how many keys were forgotten.
SELECT :"schema".purge_idempotency_keys($1 * interval '1 millisecond');

-- name: purge_dead_letters
-- params: retention_ms, batch
-- Dead letters that died more than retention_ms ago, oldest first, at most
-- batch of them: the relay calls it at every sweep, batch after batch, so a large
-- purge is many short deletes, never one long one. By ctid: one TID scan for
-- the rows the index found. A dead letter that died again in between (its
-- ctid changed) is not purged.
DELETE FROM :"schema".dead_letters
WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM :"schema".dead_letters
        WHERE died_at < now() - $1 * interval '1 millisecond'
        ORDER BY died_at
        LIMIT $2))
  AND died_at < now() - $1 * interval '1 millisecond'
RETURNING id;

-- name: enqueue
-- params: topic, payload, ordering_key, idempotency_key, headers, delay_ms
-- No delay: NULL, so that enqueue() stamps the time it writes the row (an
-- enqueue with an idempotency key may first wait for another's commit).
SELECT :"schema".enqueue($1, $2::jsonb, $3, $4, $5::jsonb,
                         CASE WHEN $6::bigint > 0 THEN now() + $6 * interval '1 millisecond' END);

-- name: dead_list
-- params: topic_regex, older_than_ms, max_rows
-- topic_regex: a topic pattern as a regular expression
-- (topic_pattern::to_regex) or NULL; older_than_ms: only those that died
-- longer ago than that (or NULL). Oldest first.
SELECT id, topic, ordering_key, attempts, last_status, last_error, response_excerpt,
       created_at, died_at, payload::text, destination, :"schema".message_id(id)
FROM :"schema".dead_letters
WHERE ($1::text IS NULL OR topic ~ $1)
  AND ($2::bigint IS NULL OR died_at < now() - $2 * interval '1 millisecond')
ORDER BY id, destination
LIMIT $3;

-- name: dead_replay_serialize
-- params: schema
-- One replay at a time per outbox (until the transaction ends): a second
-- replay's snapshot would not see the first's uncommitted event, and could
-- hang a delivery on it.
SELECT pg_advisory_xact_lock(hashtextextended('outboxd.replay.' || $1, 0));

-- name: dead_replay_lock
-- params: id, topic_regex, older_than_ms
-- Taken first, in the replay's transaction: the events still present that
-- the replay will owe deliveries to, locked in id order like lock_events.
-- Without it a relay finishing such an event's last delivery at the same
-- moment did not see the replay's (uncommitted) delivery row and deleted
-- the event under it: a delivery without its event, never sendable. With
-- it, whichever comes second sees what the first committed: the finisher
-- keeps the event, or the replay finds it gone and puts it back.
SELECT e.id FROM :"schema".events e
WHERE e.id IN (
    SELECT id FROM :"schema".dead_letters
    WHERE ($1::bigint IS NULL OR id = $1)
      AND ($2::text IS NULL OR topic ~ $2)
      AND ($3::bigint IS NULL OR died_at < now() - $3 * interval '1 millisecond'))
ORDER BY e.id
FOR UPDATE;

-- name: dead_replay
-- params: id, topic_regex, older_than_ms, locked_ids
-- Moves dead letters back into the outbox under their original id (consumers
-- still recognise a replayed event), due now, attempts from zero. A whole
-- event (destination NULL) is routed again. One destination's dead delivery
-- goes to that destination only: while other destinations still owe the
-- event (its row is still here) as one more delivery row; otherwise as the
-- event again, owed to the destinations it died at (events.destinations),
-- so that the claim holds it to its key's order like any event (sql/0004).
-- A dead letter whose event is back in the outbox as a whole event (an
-- earlier replay, not finished yet) stays a dead letter: a delivery hung on
-- that event would leave with it, payload and all. dead_replay_left counts
-- those; they replay once the event has left. So does a dead letter whose
-- event is here but was not locked by dead_replay_lock (the dead letter was
-- committed between the two statements): a delivery hung on an event we do
-- not hold could lose its event to a relay finishing it right now.
-- id, topic_regex, older_than_ms: the filter (each NULL for "any");
-- locked_ids: the ids dead_replay_lock locked.
WITH revived AS (
    DELETE FROM :"schema".dead_letters dl
    WHERE ($1::bigint IS NULL OR id = $1)
      AND ($2::text IS NULL OR topic ~ $2)
      AND ($3::bigint IS NULL OR died_at < now() - $3 * interval '1 millisecond')
      AND NOT EXISTS (SELECT 1 FROM :"schema".events e
                      WHERE e.id = dl.id
                        AND (dl.destination IS NULL OR NOT e.fanned_out OR dl.id <> ALL ($4::bigint[])))
    RETURNING id, topic, ordering_key, payload, headers, idempotency_key, created_at, last_error, destination
), whole AS (
    INSERT INTO :"schema".events
        (id, topic, ordering_key, payload, headers, idempotency_key, created_at, available_at, attempts,
         last_error, destinations)
    OVERRIDING SYSTEM VALUE
    SELECT DISTINCT ON (r.id) r.id, r.topic, r.ordering_key, r.payload, r.headers, r.idempotency_key, r.created_at,
           clock_timestamp(), 0, r.last_error,
           -- NULL (every route) if the whole event died, else where it died
           (SELECT CASE WHEN bool_or(x.destination IS NULL) THEN NULL
                        ELSE array_agg(x.destination ORDER BY x.destination) END
            FROM revived x WHERE x.id = r.id)
    FROM revived r
    ORDER BY r.id, r.destination NULLS FIRST
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), owed AS (
    -- Only where the event row was already here (the insert above met it).
    INSERT INTO :"schema".deliveries (event_id, destination, ordering_key, available_at, attempts, last_error)
    SELECT id, destination, ordering_key, now(), 0, last_error
    FROM revived
    WHERE destination IS NOT NULL AND id NOT IN (SELECT id FROM whole)
    ON CONFLICT (event_id, destination) DO NOTHING
)
SELECT DISTINCT id FROM revived ORDER BY id;

-- name: dead_replay_left
-- params: id, topic_regex, older_than_ms
-- Dead letters that match a replay's filter, run after it: those it left
-- where they were (their event is back in the outbox). Same parameters.
SELECT count(*) FROM :"schema".dead_letters
WHERE ($1::bigint IS NULL OR id = $1)
  AND ($2::text IS NULL OR topic ~ $2)
  AND ($3::bigint IS NULL OR died_at < now() - $3 * interval '1 millisecond');

-- name: dead_purge
-- params: older_than_ms, topic_regex
-- topic_regex: a topic pattern as a regular expression, or NULL.
DELETE FROM :"schema".dead_letters
WHERE died_at < now() - $1 * interval '1 millisecond'
  AND ($2::text IS NULL OR topic ~ $2)
RETURNING id;

-- name: dead_purge_count
-- params: older_than_ms, topic_regex
-- What dead_purge would delete (`dead purge --dry-run`). Same parameters.
SELECT count(*) FROM :"schema".dead_letters
WHERE died_at < now() - $1 * interval '1 millisecond'
  AND ($2::text IS NULL OR topic ~ $2);

-- name: status
-- Per topic and destination, for `outboxd status`: the work in the outbox,
-- each piece in exactly one state, and the dead letters. A piece of work is
-- an event that is not fanned out (destination NULL: owed to every
-- destination its topic routes to), or one destination's delivery of a
-- fanned-out event (the parked event row itself is not counted). States,
-- first match wins:
--   in_flight       leased by a relay (lease not expired), or sent in a
--                   run under its key's live hold (a run's followers carry
--                   no lease: up to the event the hold names, sql/0012), or
--                   read by the windows relay that owns its slot's cursor
--                   and not passed yet (visible in the cursor's B: as of
--                   that relay's last checkpoint, about once a second; a
--                   window read since shows as pending until then)
--   retrying        attempted before, waiting for its next attempt
--   scheduled       never attempted, not due yet (a delayed event)
--   waiting_on_key  never attempted, due, but an earlier event of its
--                   ordering key goes first (at its destination, for a delivery)
--   pending         never attempted and due now
-- oldest_pending_seconds: how long the oldest work that is due now and not
-- in flight has been due (since available_at, not since it was created).
-- A window event its slot's cursor has passed (visible in its A, or settled
-- inside its window: below done_below and visible in its B) is delivered and
-- only waits for cleanup: not work. (An event behind such one of its key
-- still counts as waiting_on_key until cleanup, at most a checkpoint.)
-- last_error: the error of the group's newest waiting work that has one,
-- e.g. that no route matches the topic.
-- One pass over each table and hash joins: "an earlier event of its key"
-- is a comparison with the key's first id, not a probe per row
-- (bench/NOTES.md, "status at 1M").
WITH key_head AS (
    SELECT ordering_key, min(id) AS head
    FROM :"schema".events
    WHERE ordering_key IS NOT NULL AND NOT fanned_out
    GROUP BY ordering_key
), keys_with_deliveries AS (
    SELECT DISTINCT ordering_key FROM :"schema".deliveries WHERE ordering_key IS NOT NULL
), run_held AS (
    SELECT ordering_key, event_id AS last
    FROM :"schema".key_holds
    WHERE destination = '' AND lease_owner IS NOT NULL AND until > now()
), delivery_head AS (
    SELECT ordering_key, destination, min(event_id) AS head
    FROM :"schema".deliveries
    WHERE ordering_key IS NOT NULL
    GROUP BY ordering_key, destination
), work AS (
    SELECT e.topic, NULL::text AS destination, e.id, e.attempts, e.available_at,
           (e.lease_owner IS NOT NULL AND e.leased_until > now())
               OR (e.lease_owner IS NULL AND e.available_at <= now() AND e.id <= rh.last)
               OR coalesce(wc.owner IS NOT NULL AND pg_visible_in_snapshot(e.txid, wc.snap_b), false) AS in_flight,
           e.ordering_key IS NOT NULL AND (e.id > kh.head OR kd.ordering_key IS NOT NULL) AS behind_key,
           e.last_error IS NOT NULL AS has_error
    FROM :"schema".events e
    LEFT JOIN key_head kh ON kh.ordering_key = e.ordering_key
    LEFT JOIN keys_with_deliveries kd ON kd.ordering_key = e.ordering_key
    LEFT JOIN run_held rh ON rh.ordering_key = e.ordering_key
    LEFT JOIN :"schema".cursors wc
           ON e.txid IS NOT NULL AND wc.destination = '' AND wc.slot = :"schema".event_slot(e.ordering_key, e.id)
    WHERE NOT e.fanned_out
      AND NOT coalesce(pg_visible_in_snapshot(e.txid, wc.snap_a)
                       OR (e.id < wc.done_below AND pg_visible_in_snapshot(e.txid, wc.snap_b)), false)
    UNION ALL
    SELECT e.topic, d.destination, d.event_id, d.attempts, d.available_at,
           d.lease_owner IS NOT NULL AND d.available_at > now(),
           d.ordering_key IS NOT NULL AND d.event_id > dh.head,
           d.last_error IS NOT NULL
    FROM :"schema".deliveries d
    JOIN :"schema".events e ON e.id = d.event_id
    LEFT JOIN delivery_head dh ON dh.ordering_key = d.ordering_key AND dh.destination = d.destination
), classified AS (
    SELECT topic, destination, id, available_at, has_error,
           CASE
               WHEN in_flight THEN 'in_flight'
               WHEN attempts > 0 THEN 'retrying'
               WHEN available_at > now() THEN 'scheduled'
               WHEN behind_key THEN 'waiting_on_key'
               ELSE 'pending'
           END AS state
    FROM work
), live AS (
    SELECT topic, destination,
           count(*) FILTER (WHERE state = 'pending') AS pending,
           count(*) FILTER (WHERE state = 'waiting_on_key') AS waiting_on_key,
           count(*) FILTER (WHERE state = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE state = 'in_flight') AS in_flight,
           count(*) FILTER (WHERE state = 'retrying') AS retrying,
           extract(epoch FROM now() - min(available_at) FILTER (
               WHERE state <> 'in_flight' AND available_at <= now())) AS oldest_pending_seconds,
           max(id) FILTER (WHERE has_error) AS error_id
    FROM classified
    GROUP BY topic, destination
), dead AS (
    SELECT topic, destination, count(*) AS dead FROM :"schema".dead_letters GROUP BY topic, destination
)
SELECT coalesce(live.topic, dead.topic) AS topic, coalesce(live.destination, dead.destination) AS destination,
       coalesce(pending, 0) AS pending, coalesce(waiting_on_key, 0) AS waiting_on_key,
       coalesce(scheduled, 0) AS scheduled, coalesce(in_flight, 0) AS in_flight,
       coalesce(retrying, 0) AS retrying, coalesce(dead, 0) AS dead,
       coalesce(oldest_pending_seconds, 0)::float8 AS oldest_pending_seconds,
       CASE WHEN live.destination IS NULL
            THEN (SELECT e.last_error FROM :"schema".events e WHERE e.id = live.error_id)
            ELSE (SELECT d.last_error FROM :"schema".deliveries d
                  WHERE d.event_id = live.error_id AND d.destination = live.destination)
       END AS last_error
FROM live FULL JOIN dead ON dead.topic = live.topic AND dead.destination IS NOT DISTINCT FROM live.destination
ORDER BY 1, 2 NULLS FIRST;

-- name: circuits
-- Per destination, the circuits published by live relays (sql/0007): how
-- many report it open, and how many live relays there are, and of them how
-- many registered as claiming and as reading windows (sql/0015; a relay
-- older than 0015 is in neither). A relay is live while its claiming
-- session holds its advisory lock (sql/0006), which pg_locks shows as
-- classid (high 32 bits) and objid (low 32 bits); exclusively (other
-- relays' probes take it shared for a moment, find_dead_relays).
WITH live AS (
    SELECT r.lease_owner, r.circuits, r.consume
    FROM :"schema".relays r
    WHERE EXISTS (SELECT 1 FROM pg_locks l
                  WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.mode = 'ExclusiveLock' AND l.granted
                    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND ((l.classid::bigint << 32) | l.objid::bigint) = r.lock_key)
), counts AS (
    SELECT count(*) AS relays,
           count(*) FILTER (WHERE consume = 'claims') AS claiming,
           count(*) FILTER (WHERE consume = 'windows') AS windows
    FROM live
)
SELECT c.key AS destination,
       count(*) FILTER (WHERE c.value ->> 'state' = 'open') AS open,
       (SELECT relays FROM counts) AS relays,
       (SELECT claiming FROM counts) AS claiming,
       (SELECT windows FROM counts) AS windows
FROM live CROSS JOIN LATERAL jsonb_each(live.circuits) AS c
GROUP BY c.key
UNION ALL
SELECT NULL, 0, relays, claiming, windows FROM counts
ORDER BY 1 NULLS FIRST;

-- name: windows_cursors_status
-- The relay cursors of commit-ordered windows (destination ''), for
-- `outboxd status`: each slot's position (to check it against the server,
-- core/window_safety.hpp), how long since it was last checkpointed, and
-- whether its owner is a live relay (its claiming session holds its
-- advisory lock, seen in pg_locks as in `circuits`: status only looks, it
-- never tries the lock). No rows: the outbox is read by claims.
WITH live AS (
    SELECT r.lease_owner
    FROM :"schema".relays r
    WHERE EXISTS (SELECT 1 FROM pg_locks l
                  WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.mode = 'ExclusiveLock' AND l.granted
                    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND ((l.classid::bigint << 32) | l.objid::bigint) = r.lock_key)
)
SELECT c.slot, c.owner, c.owner IN (SELECT lease_owner FROM live) AS owner_alive,
       c.snap_a::text AS snap_a, c.snap_b::text AS snap_b, c.system_identifier,
       extract(epoch FROM now() - c.checkpointed_at)::float8 AS checkpoint_age_seconds
FROM :"schema".cursors c
WHERE c.destination = ''
ORDER BY c.slot;

-- name: windows_holding_back
-- For `outboxd status`, once the cursors are known to belong to this
-- server: the transactions still running that were already running when
-- the slowest cursor last moved (in progress in the xip of the oldest A, as
-- cleanup_window_events orders them). While one runs, PostgreSQL keeps
-- every row version since it began: the deleted window events stay on disk,
-- and each checkpoint of the cursors adds a row version every statement
-- that reads them walks. Each with what says whose it is: a prepared
-- transaction's gid, owner and age, or the backend's pid, state,
-- application and age (xact_start; NULL where the role may not see other
-- roles' sessions). Below the server's next xid only (pg_xact_status
-- refuses an xid from the future). The oldest five.
WITH oldest AS (
    SELECT c.snap_a
    FROM :"schema".cursors c
    WHERE c.destination = ''
    ORDER BY pg_snapshot_xmax(c.snap_a), (SELECT count(*) FROM pg_snapshot_xip(c.snap_a)) DESC
    LIMIT 1
), running AS (
    SELECT x.xid
    FROM oldest o CROSS JOIN LATERAL pg_snapshot_xip(o.snap_a) AS x(xid)
    WHERE x.xid < pg_snapshot_xmax(pg_current_snapshot())
      AND pg_xact_status(x.xid) = 'in progress'
)
SELECT r.xid::text AS xid, p.gid, p.owner::text AS prepared_by, a.pid, a.state, a.application_name,
       extract(epoch FROM now() - coalesce(p.prepared, a.xact_start))::float8 AS age_seconds
FROM running r
LEFT JOIN pg_prepared_xacts p ON p.transaction = r.xid::xid
LEFT JOIN pg_stat_activity a ON a.backend_xid = r.xid::xid
ORDER BY r.xid
LIMIT 5;

-- name: release_waiting_deliveries
-- params: destination
-- A destination recovered (its circuit closed): the deliveries waiting out a
-- backoff there are due now, instead of each at its own retry time. Not
-- leased ones only; attempts and keys are untouched, so per-key order holds.
UPDATE :"schema".deliveries
SET available_at = now()
WHERE destination = $1 AND lease_owner IS NULL AND available_at > now();

-- name: release_one_waiting_delivery
-- params: destination
-- A destination's circuit may probe, but everything it owes may be waiting
-- out a backoff (a keyed stream waits behind its failed head): the delivery
-- due soonest is made due now, to be the probe. Rows waiting behind their
-- key are due already (available_at <= now()) and not touched: the one taken
-- is a key's head or an unkeyed retry, so per-key order holds.
UPDATE :"schema".deliveries
SET available_at = now()
WHERE (event_id, destination) = (
    SELECT event_id, destination FROM :"schema".deliveries
    WHERE destination = $1 AND lease_owner IS NULL AND available_at > now() AND available_at < 'infinity'
    ORDER BY available_at, event_id
    LIMIT 1);

-- name: hand_back
-- params: id, attempt, owner, delay_ms, tid, hold
-- Claimed but never sent (it waited too long for a delivery slot, or the
-- relay is shutting down before sending it): back to the outbox, due after
-- delay_ms, and the claim's attempt is taken back, so that attempts count
-- requests actually sent. Fenced and found like `reschedule`; nothing was
-- sent under this attempt, so no outcome can arrive for it later.
WITH returned AS (
    UPDATE :"schema".events
    SET available_at = clock_timestamp() + $4 * interval '1 millisecond',
        lease_owner = NULL, leased_until = NULL,
        attempts = $2 - 1
    WHERE ctid = $5::tid AND id + 0 = $1
      AND CASE WHEN $6::text IS NULL THEN lease_owner = $3 AND attempts = $2
              ELSE lease_owner IS NULL AND attempts = $2 - 1
                   AND NOT EXISTS (SELECT 1 FROM :"schema".key_holds h
                              WHERE h.ordering_key = events.ordering_key AND h.destination = '' AND h.until > now()
                                AND (h.until, h.lease_owner) IS DISTINCT FROM ($6::text::timestamptz, $3))
         END
    RETURNING id, ordering_key
), unheld AS (
    DELETE FROM :"schema".key_holds h
    USING returned
    WHERE h.ordering_key = returned.ordering_key AND h.destination = '' AND h.event_id = returned.id
)
SELECT id FROM returned;

-- name: hand_back_delivery
-- params: id, destination, attempt, owner, delay_ms
-- `hand_back` for one destination's delivery (its circuit is open, or no
-- connection to it came free within the lease).
WITH returned AS (
    UPDATE :"schema".deliveries
    SET available_at = now() + $5 * interval '1 millisecond',
        lease_owner = NULL,
        attempts = attempts - 1
    WHERE event_id = $1 AND destination = $2 AND attempts = $3 AND lease_owner = $4
    RETURNING event_id, destination, ordering_key
), unheld AS (
    DELETE FROM :"schema".key_holds h
    USING returned
    WHERE h.ordering_key = returned.ordering_key AND h.destination = returned.destination
      AND h.event_id = returned.event_id
)
SELECT event_id FROM returned;

-- name: register_relay
-- params: owner, consume
-- Binds our leases to this session (sql/0006), on the connection that
-- claims, before its first claim and again after every reconnect: the
-- session-level advisory lock first, then the row that tells other relays
-- which lock to try. Never the other way round: another relay could find
-- the row, take the free lock in between and take over a live relay. Only
-- tried, never waited for: after a network partition our previous session
-- may live on at the server for a while, holding the lock (it covers our
-- leases meanwhile); the store tries again before each claim until it has
-- it. Returns a row when the lock is ours. consume: 'claims' or 'windows'
-- (sql/0015, relays_consuming_otherwise).
WITH locked AS (
    SELECT key, pg_try_advisory_lock(key) AS got
    FROM (SELECT hashtextextended('outboxd.relay.' || $1, 0) AS key) AS k
)
INSERT INTO :"schema".relays (lease_owner, lock_key, consume)
SELECT $1, key, $2::text FROM locked WHERE got
ON CONFLICT (lease_owner) DO UPDATE SET lock_key = excluded.lock_key, consume = excluded.consume
RETURNING lease_owner;

-- name: relays_consuming_otherwise
-- params: owner, consume
-- The other live relays (their session lock is held) registered with a
-- consume mode other than ours (sql/0015). Run after our own registration
-- has committed: of two relays of different modes starting at once, the
-- one that asks last sees the other (both may see each other; neither then
-- starts). A relay older than 0015 (consume NULL) is not counted. In a
-- transaction of its own: the locks of dead relays it gets are let go at
-- its end. OFFSET 0: the lock is tried only for rows past the filter.
SELECT o.lease_owner, o.consume
FROM (SELECT lease_owner, lock_key, consume FROM :"schema".relays
      WHERE lease_owner <> $1 AND consume <> $2::text OFFSET 0) AS o
WHERE NOT pg_try_advisory_xact_lock_shared(o.lock_key)
ORDER BY o.lease_owner;

-- name: live_relay_modes
-- params: owner
-- The other live relays (their session lock is held) and their consume
-- mode ('' for a relay older than 0015), for relay.consume = "auto" before
-- it registers (core/consume_choice.hpp). In a transaction of its own, as
-- relays_consuming_otherwise. OFFSET 0: the lock is tried only for rows
-- past the filter.
SELECT o.lease_owner, coalesce(o.consume, '') AS consume
FROM (SELECT lease_owner, lock_key, consume FROM :"schema".relays WHERE lease_owner <> $1 OFFSET 0) AS o
WHERE NOT pg_try_advisory_xact_lock_shared(o.lock_key)
ORDER BY o.lease_owner;

-- name: publish_circuit
-- params: owner, destination, state
-- One of our circuits opened or closed (sql/0007): state is its JSON.
UPDATE :"schema".relays
SET circuits = circuits || jsonb_build_object($2::text, $3::jsonb)
WHERE lease_owner = $1;

-- name: reset_circuits
-- params: owner
-- A reload started a new engine: every circuit is closed again.
UPDATE :"schema".relays SET circuits = '{}' WHERE lease_owner = $1;

-- name: find_dead_relays
-- params: owner
-- The other relays whose claiming session is gone: their lock is free. Run
-- in the takeover's transaction, which keeps each lock it got until it
-- commits, so a relay that only lost its connection cannot come back
-- between this and take_over_leases (register_relay waits for us). A lock
-- held by a live session is only tried, never waited for.
-- Every probe of a relay's lock takes it shared (live_relay_modes, the
-- cursor takes, ...): a live relay holds it exclusively, so the probe fails
-- while it lives; probes do not fail on each other, so a dead relay under a
-- takeover never looks alive to a relay asking meanwhile. Two takeovers of
-- one relay at once: its row, locked here, goes to the first; the other
-- skips it. OFFSET 0: the lock is tried only for rows past the filter
-- (never our own).
SELECT r.lease_owner
FROM :"schema".relays r
WHERE r.lease_owner IN (
    SELECT other.lease_owner
    FROM (SELECT lease_owner, lock_key FROM :"schema".relays WHERE lease_owner <> $1 OFFSET 0) AS other
    WHERE pg_try_advisory_xact_lock_shared(other.lock_key))
FOR UPDATE OF r SKIP LOCKED;

-- name: take_over_leases
-- params: owners
-- The leases of relays find_dead_relays found dead, handed back due now
-- like `release` hands back our own, and the relays forgotten. The attempt
-- number stays: the dead relay may have sent the request (so it counts),
-- and a late outcome from a relay that was not quite dead is refused by the
-- fencing (lease owner and attempt). Every row that names a dead owner:
-- leases that ran out too, which nothing but a claim from the start of the
-- index (a sweep) would find (sql/0014), and a lease an older relay wrote
-- into available_at; one that another relay claimed since names that
-- relay, and every statement that ends a lease clears its owner. The lease
-- owner is in no index: a scan of the table, once per relay found dead.
-- owners: the dead relays' lease owners.
-- Their key holds go by owner: a run's followers carry no lease of their
-- own (sql/0012), and are free again, untouched, once the hold is gone.
WITH forgotten AS (
    DELETE FROM :"schema".relays WHERE lease_owner = ANY ($1::text[])
), events_released AS (
    UPDATE :"schema".events
    SET available_at = clock_timestamp(), lease_owner = NULL, leased_until = NULL
    WHERE lease_owner = ANY ($1::text[])
    RETURNING id, ordering_key
), deliveries_released AS (
    UPDATE :"schema".deliveries
    SET available_at = now(), lease_owner = NULL
    WHERE lease_owner = ANY ($1::text[]) AND available_at > now()
    RETURNING event_id, destination, ordering_key
), unheld AS (
    DELETE FROM :"schema".key_holds h
    WHERE (h.ordering_key, h.destination, h.event_id) IN (
        SELECT ordering_key, '', id FROM events_released WHERE ordering_key IS NOT NULL
        UNION ALL
        SELECT ordering_key, destination, event_id FROM deliveries_released WHERE ordering_key IS NOT NULL)
       OR (h.lease_owner = ANY ($1::text[]) AND h.destination = '')
    RETURNING h.event_id
)
-- One row per lease or hold handed back (a hold that came with a lease
-- counts once: the same id): a freed hold alone, a run's unsent rest, wakes
-- the relay's claims as a lease does.
SELECT id FROM events_released
UNION
SELECT event_id FROM deliveries_released
UNION
SELECT event_id FROM unheld;

-- name: relay_stats
-- params: cap
-- For /metrics and the relay's periodic summary, every few seconds at most,
-- on the outcome connection. Cheap on a table of millions: the work not yet
-- delivered (events not fanned out, plus deliveries) is counted up to `cap`
-- rows of each; how long the oldest due work has been due (available_at
-- <= now() and no lease running; from the first entries of the claim
-- index; not a run's follower being sent under its key's live hold,
-- sql/0012) as `status` counts it; and the schema's migration version.
-- A window event its slot's cursor has passed is delivered, waiting for
-- cleanup, as in `status` (one primary-key probe of cursors per row read;
-- claims outboxes have no txid and skip it); one the owner of that cursor
-- has read (in its B) is in flight, not pending.
SELECT (SELECT count(*) FROM (SELECT 1 FROM :"schema".events e
                              LEFT JOIN :"schema".cursors wc
                                     ON e.txid IS NOT NULL AND wc.destination = ''
                                    AND wc.slot = :"schema".event_slot(e.ordering_key, e.id)
                              WHERE NOT e.fanned_out
                                AND NOT coalesce(pg_visible_in_snapshot(e.txid, wc.snap_a)
                                                 OR (e.id < wc.done_below
                                                     AND pg_visible_in_snapshot(e.txid, wc.snap_b)), false)
                              LIMIT $1) e)
       + (SELECT count(*) FROM (SELECT 1 FROM :"schema".deliveries LIMIT $1) d) AS backlog,
       coalesce(extract(epoch FROM now() - least(
           (SELECT e.available_at FROM :"schema".events e
            LEFT JOIN :"schema".cursors wc
                   ON e.txid IS NOT NULL AND wc.destination = ''
                  AND wc.slot = :"schema".event_slot(e.ordering_key, e.id)
            WHERE e.available_at <= now()
              AND (e.leased_until IS NULL OR e.leased_until <= now())
              AND NOT coalesce(pg_visible_in_snapshot(e.txid, wc.snap_a)
                               OR ((e.id < wc.done_below OR wc.owner IS NOT NULL)
                                   AND pg_visible_in_snapshot(e.txid, wc.snap_b)), false)
              AND NOT (e.ordering_key IS NOT NULL AND e.lease_owner IS NULL AND EXISTS (
                  SELECT 1 FROM :"schema".key_holds h
                  WHERE h.ordering_key = e.ordering_key AND h.destination = '' AND h.lease_owner IS NOT NULL
                    AND h.until > now() AND h.event_id >= e.id))
            ORDER BY e.available_at LIMIT 1),
           (SELECT min(available_at) FROM :"schema".deliveries WHERE available_at <= now()))), 0)::float8
           AS oldest_pending_seconds,
       (SELECT coalesce(max(version), 0) FROM :"schema".schema_migrations) AS schema_version;

-- ---- Commit-ordered windows (sql/0009, relay.consume = "windows") --------
-- docs/commit-ordered-windows.md. A window is "committed after snapshot A
-- and visible in snapshot B"; the relay keeps its cursor (A, B, done_below)
-- in memory and writes it to `cursors` only as a fenced checkpoint.

-- name: read_window
-- params: snap_a, snap_b, done_below, slots, max_events, destinations
-- The window's events in id order: at most max_events of them, from id
-- done_below on (a resumed window; the next chunk of a large one passes its
-- last id + 1, with the same A and B). snap_b NULL: B is this statement's
-- own snapshot (pg_current_snapshot() is the active snapshot, so every row
-- it selects is one it can see); a B given is older than the statement, and
-- so also sees nothing the statement cannot. slots NULL: every slot.
-- Always one row, the events as parallel arrays built in one pass over the
-- sorted page, so in id order (the store checks it) (ids empty: an empty
-- window, whose B still moves A), with B, both xmaxes (to detect an xid
-- regression) and the server's time after the snapshot (to judge
-- available_at in the database's time).
-- Membership as PgQ computes it, without ever bounding a scan by xmin(A),
-- which a long transaction pins: transactions that began between the
-- snapshots (txid from xmax(A) to xmax(B), a range of events_txid_idx) that
-- B sees finished, plus those A saw running (xip(A), equality probes) that
-- B sees finished. The probes are a LATERAL subquery kept apart (OFFSET 0):
-- as a join, the planner hashed xip(A) against every row of the table
-- (one transaction's events counted as half the table after a bulk insert). Aborted ones pass pg_visible_in_snapshot, but their rows
-- are invisible to the statement. The window is materialized before the
-- ORDER BY ... LIMIT, so the planner cannot walk the primary key in id order
-- instead, through every event that is not in the window.
-- A later page (done_below > 0) walks the primary key first, but only two
-- pages of rows from done_below (`walk`), and keeps the window's events
-- among them (`walked`: not visible in A, visible in B, which is the same
-- membership): the rest of a window being drained is mostly there, and
-- reading it from txids would cost every page the rest of the window
-- again. The txid reads (`tail`, as for a first page) run only when the
-- walk neither filled the page nor reached the table's end (`rest`).
-- Their done_below is `id + 0`, no index condition: with `id >= $3` the
-- relay's generic plan (store::plan_once_settings: no bitmap scans)
-- walked events_pkey from done_below through the whole table for both
-- parts, the txids only a filter.
-- Events fanned out are left out: an earlier read parked them in
-- `deliveries`, which owes them now (read again after a restart from an
-- older checkpoint, they would be sent a second time as fresh).
-- The page's bodies come with it (one round trip), and per event
-- key_pending: its key has deliveries waiting (as the claim judges it), or
-- an earlier event of its key from before windows (txid NULL) is still to
-- be sent; then the relay parks it behind them. Both are computed for the
-- page only (after the LIMIT): key_pending once per key of the page (`k`; a
-- page can hold thousands of events of a few keys; a scalar subquery, not
-- EXISTS, which the planner may turn into a hash of all of `deliveries`),
-- the bodies by ctid, a TID scan of the row
-- version `w` read (LIMIT 1 keeps it a nested loop: a custom plan otherwise
-- hash-joined the page with a scan of the whole table). Once per call: whether deliveries to `destinations`
-- (the relay's) are due, and milliseconds until the earliest one that is
-- not due yet (as the claim's next_due_ms, over deliveries only).
WITH s AS MATERIALIZED (
    SELECT $1::pg_snapshot AS a, coalesce($2::pg_snapshot, pg_current_snapshot()) AS b
), clock AS MATERIALIZED (
    SELECT clock_timestamp() AS at
), walk AS MATERIALIZED (
    SELECT e.id, e.ordering_key, e.available_at, e.ctid AS tid, e.txid, e.fanned_out
    FROM :"schema".events e
    WHERE e.id >= $3::bigint AND $3::bigint > 0
    ORDER BY e.id
    LIMIT 2 * $5::bigint
), walked AS MATERIALIZED (
    SELECT k.id, k.ordering_key, k.available_at, k.tid
    FROM s, walk k
    WHERE pg_visible_in_snapshot(k.txid, s.b) AND NOT pg_visible_in_snapshot(k.txid, s.a)
      AND NOT k.fanned_out
), rest AS MATERIALIZED (
    SELECT $3::bigint = 0
           OR ((SELECT count(*) FROM walk) = 2 * $5::bigint
               AND (SELECT count(*) FROM walked k
                    WHERE $4::int[] IS NULL OR :"schema".event_slot(k.ordering_key, k.id) = ANY ($4::int[]))
                   < $5::bigint) AS needed,
           coalesce((SELECT max(k.id) FROM walk k), $3::bigint - 1) AS after_id
), tail AS MATERIALIZED (
    SELECT e.id, e.ordering_key, e.available_at, e.ctid AS tid
    FROM s, :"schema".events e
    WHERE e.txid >= pg_snapshot_xmax(s.a) AND e.txid < pg_snapshot_xmax(s.b)
      AND pg_visible_in_snapshot(e.txid, s.b)
      AND e.id + 0 >= $3::bigint
      AND NOT e.fanned_out
    UNION ALL
    SELECT e.id, e.ordering_key, e.available_at, e.tid
    FROM s, pg_snapshot_xip(s.a) AS x(txid)
    CROSS JOIN LATERAL (SELECT e.id, e.ordering_key, e.available_at, e.ctid AS tid
                        FROM :"schema".events e
                        WHERE e.txid = x.txid AND e.id + 0 >= $3::bigint AND NOT e.fanned_out
                        OFFSET 0) AS e
    WHERE pg_visible_in_snapshot(x.txid, s.b)
), w AS MATERIALIZED (
    SELECT k.id, k.ordering_key, k.available_at, k.tid FROM walked k
    UNION ALL
    SELECT t.id, t.ordering_key, t.available_at, t.tid
    FROM tail t
    WHERE (SELECT r.needed FROM rest r) AND t.id > (SELECT r.after_id FROM rest r)
), p AS MATERIALIZED (
    SELECT w.id, w.ordering_key, :"schema".event_slot(w.ordering_key, w.id) AS slot, w.available_at, w.tid
    FROM w
    WHERE $4::int[] IS NULL OR :"schema".event_slot(w.ordering_key, w.id) = ANY ($4::int[])
    ORDER BY w.id
    LIMIT $5::bigint
), k AS MATERIALIZED (
    SELECT pk.ordering_key,
           coalesce((SELECT true FROM :"schema".deliveries d WHERE d.ordering_key = pk.ordering_key LIMIT 1),
                    false) AS delivering,
           (SELECT min(o.id) FROM :"schema".events o
            WHERE o.ordering_key = pk.ordering_key AND o.txid IS NULL AND NOT o.fanned_out) AS first_pre_window
    FROM (SELECT DISTINCT p.ordering_key FROM p WHERE p.ordering_key IS NOT NULL) AS pk
), page AS (
    SELECT array_agg(p.id) AS ids, array_agg(p.ordering_key) AS ordering_keys, array_agg(p.slot) AS slots,
           array_agg((extract(epoch FROM p.available_at) * 1000000)::bigint) AS available_at_us,
           array_agg(p.key_pending) AS key_pending,
           array_agg(e.topic) AS topics, array_agg(e.payload::text) AS payloads,
           array_agg(e.headers::text) AS headers,
           array_agg((extract(epoch FROM e.created_at) * 1000000)::bigint) AS created_at_us,
           array_agg(array_to_string(e.destinations, ',')) AS destinations,
           array_agg((extract(epoch FROM (SELECT c.at FROM clock c) - e.created_at) * 1000000)::bigint) AS age_us
    FROM (SELECT p.*, coalesce(k.delivering OR k.first_pre_window < p.id, false) AS key_pending
          FROM p LEFT JOIN k ON k.ordering_key = p.ordering_key
          ORDER BY p.id) AS p
    CROSS JOIN LATERAL (SELECT e.topic, e.payload, e.headers, e.created_at, e.destinations
                        FROM :"schema".events e WHERE e.ctid = p.tid LIMIT 1) AS e
)
SELECT s.b::text AS snap_b,
       pg_snapshot_xmax(s.a)::text AS a_xmax,
       pg_snapshot_xmax(s.b)::text AS b_xmax,
       -- clock_timestamp() once (`clock`), not now(): read after the
       -- snapshot, so every event it sees committed without a delay is due.
       (extract(epoch FROM (SELECT c.at FROM clock c)) * 1000000)::bigint AS now_us,
       coalesce(page.ids, '{}') AS ids,
       coalesce(page.ordering_keys, '{}') AS ordering_keys,
       coalesce(page.slots, '{}') AS slots,
       coalesce(page.available_at_us, '{}') AS available_at_us,
       coalesce(page.key_pending, '{}') AS key_pending,
       coalesce(page.topics, '{}') AS topics,
       coalesce(page.payloads, '{}') AS payloads,
       coalesce(page.headers, '{}') AS headers,
       coalesce(page.created_at_us, '{}') AS created_at_us,
       coalesce(page.destinations, '{}') AS destinations,
       coalesce(page.age_us, '{}') AS age_us,
       EXISTS (SELECT 1 FROM :"schema".deliveries
               WHERE available_at <= now() AND destination = ANY ($6::text[])) AS deliveries_due,
       -- ORDER BY ... LIMIT 1, not min(): as in the claim
       ceil(extract(epoch FROM (SELECT available_at FROM :"schema".deliveries WHERE available_at > now()
                                ORDER BY available_at LIMIT 1) - now()) * 1000)::bigint AS next_due_ms
FROM s, page;

-- name: fetch_events
-- params: ids
-- A page of a window's events, by id (a few hundred ids, ascending).
SELECT e.id, e.topic, e.ordering_key, e.payload::text AS payload, e.headers::text AS headers,
       (extract(epoch FROM e.created_at) * 1000000)::bigint AS created_at_us
FROM :"schema".events e
WHERE e.id = ANY ($1::bigint[])
ORDER BY e.id;

-- name: take_cursor
-- params: destination, slot, owner
-- Takes the cursor of (destination, slot) for `owner` (a relay registered in
-- `relays`, holding its session lock: sql/0006), epoch + 1, and returns
-- where it stands. A missing cursor of the relay's one cursor per slot
-- (destination '', docs/windows-in-the-relay.md) is created at the
-- beginning ('1:1:': its first window holds every event with a txid still
-- in the outbox), because it serves every destination: an event committed
-- before the cursor existed is still owed, and cleanup_window_events would
-- delete it as delivered once the cursor had passed it. A missing cursor of
-- a named destination is created at this statement's snapshot (events
-- committed before it are not that destination's). An existing one
-- is taken when nobody owns it, when we do (our session was replaced), when
-- its owner is not a registered relay, or when that relay's session lock is
-- free: its session is gone. The lock is then held until this statement's
-- transaction ends, so that relay cannot register again in between
-- (register_relay only tries it). A live relay's lock is only tried, never
-- waited for. No row: the cursor belongs to a live relay.
INSERT INTO :"schema".cursors AS c (destination, slot, snap_a, owner, epoch, system_identifier)
VALUES ($1, $2, CASE WHEN $1 = '' THEN '1:1:'::pg_snapshot ELSE pg_current_snapshot() END, $3, 1,
        (SELECT system_identifier FROM pg_control_system()))
ON CONFLICT (destination, slot) DO UPDATE
SET owner = excluded.owner, epoch = c.epoch + 1
WHERE c.owner IS NULL OR c.owner = excluded.owner
   OR NOT EXISTS (SELECT 1 FROM :"schema".relays r WHERE r.lease_owner = c.owner)
   OR (SELECT pg_try_advisory_xact_lock_shared(r.lock_key) FROM :"schema".relays r WHERE r.lease_owner = c.owner)
RETURNING c.snap_a::text AS snap_a, c.snap_b::text AS snap_b, c.done_below, c.epoch,
          c.system_identifier;

-- name: checkpoint_cursor
-- params: destination, slot, owner, epoch, snap_a, snap_b, done_below
-- The owner's position, fenced: no row when the cursor was taken from us
-- (then we must send nothing more from that slot).
UPDATE :"schema".cursors
SET snap_a = $5::pg_snapshot, snap_b = $6::pg_snapshot, done_below = $7, checkpointed_at = now()
WHERE destination = $1 AND slot = $2 AND owner = $3 AND epoch = $4
RETURNING epoch;

-- name: release_cursor
-- params: destination, slot, owner, epoch
-- Hands the cursor back (after a last checkpoint); any relay may take it.
UPDATE :"schema".cursors
SET owner = NULL
WHERE destination = $1 AND slot = $2 AND owner = $3 AND epoch = $4
RETURNING epoch;

-- name: take_cursors
-- params: slots, owner
-- take_cursor for the relay's cursors (destination '') of several slots
-- (up to all 64) in one statement, by the same rules: a missing one is
-- created at the beginning, an existing one taken when nobody owns it, we
-- do, its owner is not a registered relay, or that relay's session lock is
-- free (then held until this statement ends). One row per slot taken; a
-- slot a live relay owns is left out. In slot order, so two relays taking
-- overlapping sets lock the rows in one order and cannot deadlock.
INSERT INTO :"schema".cursors AS c (destination, slot, snap_a, owner, epoch, system_identifier)
SELECT '', s.slot, '1:1:'::pg_snapshot, $2, 1, (SELECT system_identifier FROM pg_control_system())
FROM (SELECT DISTINCT u.slot FROM unnest($1::int[]) AS u(slot) ORDER BY u.slot) AS s
ON CONFLICT (destination, slot) DO UPDATE
SET owner = excluded.owner, epoch = c.epoch + 1
WHERE c.owner IS NULL OR c.owner = excluded.owner
   OR NOT EXISTS (SELECT 1 FROM :"schema".relays r WHERE r.lease_owner = c.owner)
   OR (SELECT pg_try_advisory_xact_lock_shared(r.lock_key) FROM :"schema".relays r WHERE r.lease_owner = c.owner)
RETURNING c.slot, c.snap_a::text AS snap_a, c.snap_b::text AS snap_b, c.done_below, c.epoch,
          c.system_identifier;

-- name: checkpoint_cursors
-- params: slots, epochs, snap_a, snap_b, done_below, owner
-- checkpoint_cursor for the relay's cursors of several slots that share one
-- position (read in lockstep), in one statement: epochs[i] is the epoch of
-- slots[i]; each is written only while it is still ours at that epoch.
-- Returns how many were written. The rows are locked in slot order first
-- (as park_window_events locks them), then updated by ctid.
WITH mine AS MATERIALIZED (
    SELECT c.ctid AS tid
    FROM :"schema".cursors c
    JOIN unnest($1::int[], $2::bigint[]) AS m(slot, epoch) ON m.slot = c.slot AND m.epoch = c.epoch
    WHERE c.destination = '' AND c.owner = $6
    ORDER BY c.slot
    FOR NO KEY UPDATE OF c
), written AS (
    UPDATE :"schema".cursors c
    SET snap_a = $3::pg_snapshot, snap_b = $4::pg_snapshot, done_below = $5, checkpointed_at = now()
    WHERE c.ctid = ANY (ARRAY(SELECT tid FROM mine))
    RETURNING 1
)
SELECT count(*) AS written FROM written;

-- name: release_cursors
-- params: slots, epochs, owner
-- release_cursor for several slots in one statement (epochs as in
-- checkpoint_cursors). Returns how many were still ours, now unowned.
WITH mine AS MATERIALIZED (
    SELECT c.ctid AS tid
    FROM :"schema".cursors c
    JOIN unnest($1::int[], $2::bigint[]) AS m(slot, epoch) ON m.slot = c.slot AND m.epoch = c.epoch
    WHERE c.destination = '' AND c.owner = $3
    ORDER BY c.slot
    FOR NO KEY UPDATE OF c
), released AS (
    UPDATE :"schema".cursors c
    SET owner = NULL
    WHERE c.ctid = ANY (ARRAY(SELECT tid FROM mine))
    RETURNING 1
)
SELECT count(*) AS released FROM released;

-- name: window_safety
-- What decides whether windows may be read here (core/window_safety.hpp):
-- never on a standby (its snapshots order commits differently from the
-- primary's); the next xid to be assigned, read from a snapshot since
-- pg_current_xact_id() would assign one (and cannot on a standby); and the
-- cluster's identity.
SELECT pg_is_in_recovery() AS in_recovery,
       pg_snapshot_xmax(pg_current_snapshot())::text AS next_xid,
       (SELECT system_identifier FROM pg_control_system()) AS system_identifier;

-- name: park_window_events
-- params: owner, ids, epochs, owed_ids, owed_destinations, owed_due_ms, owed_attempts, owed_errors, dead_ids, dead_destinations, dead_attempts, dead_errors, dead_statuses, dead_excerpts
-- variant park_window_events: :fence = (b.slot, b.epoch) IN (SELECT m.slot, m.epoch FROM mine m)
-- variant park_pre_window_events: :fence = b.txid IS NULL AND (SELECT 1 FROM :"schema".key_holds h WHERE h.ordering_key = b.ordering_key AND h.destination = '' AND h.until > now() LIMIT 1) IS NULL
-- `fan_out` for events read from a window (not leased), a batch at a time:
-- each event some destination still owes is parked (fanned_out) with one
-- deliveries row per destination owed; every destination that failed for
-- good gets a dead letter (destination NULL: the whole event, one that
-- cannot be sent at all); an event that owes nothing is deleted. From then
-- on it is today's delivery path (claim_deliveries keeps per-key order by
-- id). ids/epochs: the events, in id order, with the epoch of the cursor
-- they were read under. owed_*: one element per (event, destination) owed:
-- due no earlier than now() + due_ms and never before the event's
-- available_at (a delayed event is due then; a key-pending one now), the
-- attempts made there, the last error there (NULL if none). dead_*: one
-- element per dead letter (status: the HTTP status, or NULL).
-- Fenced by the cursor instead of the event's attempt: an event is written
-- only while `owner` owns the cursor of its slot ('', event_slot) at that
-- epoch. The cursor rows are locked FOR SHARE (in slot order, after the
-- events in id order), so a take_cursor that moves the cursor waits for
-- this statement to commit, and one that committed first fences it out.
-- Only events not fanned out and not under a running lease are written, so
-- writing the same park again (an outcome write is retried when its answer
-- is lost) changes nothing. Returns the events this call wrote; one left
-- out was written already, is gone, is leased, or its cursor is not ours.
-- One statement: the event row is updated (parked) or deleted (finished),
-- never both, and dead letters copy the row as it was.
-- park_pre_window_events: the same for events written before `outboxd
-- consume-setup windows` (txid NULL), which no window holds: a windows relay
-- parks them at startup (epochs unused), so that they drain through
-- `deliveries` in id order and the window events of their keys queue behind
-- them (read_window's key_pending). No cursor fences them; what a claiming
-- relay may still be sending is left: a running lease (batch) and any event
-- of a key whose hold is live (a run's followers carry no lease, only the
-- hold). A lease that is over no longer counts: its relay's outcome is
-- fenced out (its attempt and owner no longer match a row in `events`).
WITH batch AS MATERIALIZED (
    SELECT e.id, e.topic, e.ordering_key, e.payload, e.headers, e.idempotency_key, e.created_at,
           e.available_at, e.txid, :"schema".event_slot(e.ordering_key, e.id) AS slot, b.epoch
    FROM unnest($2::bigint[], $3::bigint[]) AS b(id, epoch)
    JOIN :"schema".events e ON e.id = b.id
    WHERE NOT e.fanned_out
      AND NOT (e.lease_owner IS NOT NULL AND e.leased_until > now())
    ORDER BY e.id
    FOR UPDATE OF e
), mine AS MATERIALIZED (
    SELECT c.slot, c.epoch
    FROM :"schema".cursors c
    WHERE c.destination = '' AND c.owner = $1
      AND (c.slot, c.epoch) IN (SELECT slot, epoch FROM batch)
    ORDER BY c.slot
    FOR SHARE
), fenced AS MATERIALIZED (
    SELECT b.* FROM batch b WHERE :fence
), owed AS MATERIALIZED (
    SELECT o.id, o.destination, o.due_ms, o.attempts, o.error
    FROM unnest($4::bigint[], $5::text[], $6::bigint[], $7::integer[], $8::text[])
         AS o(id, destination, due_ms, attempts, error)
), parked AS (
    UPDATE :"schema".events e
    SET fanned_out = true, available_at = 'infinity', lease_owner = NULL, leased_until = NULL
    FROM fenced f
    WHERE e.id = f.id AND f.id IN (SELECT id FROM owed)
), owing AS (
    INSERT INTO :"schema".deliveries (event_id, destination, ordering_key, available_at, attempts, last_error)
    SELECT f.id, o.destination, f.ordering_key,
           greatest(f.available_at, now() + o.due_ms * interval '1 millisecond'), o.attempts, o.error
    FROM fenced f JOIN owed o ON o.id = f.id
    ON CONFLICT (event_id, destination) DO NOTHING
), buried AS (
    INSERT INTO :"schema".dead_letters
        (id, topic, ordering_key, payload, headers, idempotency_key, created_at, attempts,
         last_error, last_status, response_excerpt, destination)
    SELECT f.id, f.topic, f.ordering_key, f.payload, f.headers, f.idempotency_key, f.created_at, d.attempts,
           d.error, d.status, d.excerpt, d.destination
    FROM fenced f
    JOIN unnest($9::bigint[], $10::text[], $11::integer[], $12::text[], $13::integer[], $14::text[])
         AS d(id, destination, attempts, error, status, excerpt) ON d.id = f.id
    ON CONFLICT (id, destination) DO UPDATE
        SET topic = excluded.topic, ordering_key = excluded.ordering_key, payload = excluded.payload,
            headers = excluded.headers, idempotency_key = excluded.idempotency_key,
            created_at = excluded.created_at, attempts = excluded.attempts, last_error = excluded.last_error,
            last_status = excluded.last_status, response_excerpt = excluded.response_excerpt, died_at = now()
), finished AS (
    DELETE FROM :"schema".events e
    USING fenced f
    WHERE e.id = f.id AND f.id NOT IN (SELECT id FROM owed)
)
SELECT id FROM fenced ORDER BY id;

-- name: cleanup_window_events
-- params: batch, done
-- Deletes up to `batch` delivered window events (docs/windows-in-the-relay.md,
-- "Cleanup"): an event read from a window and delivered everywhere leaves
-- no trace but the cursors' move past it. Delivered = committed as seen by
-- the checkpointed A of its own slot's cursor ('') and not fanned out (a
-- parked event is deleted by delete_finished_events). By the cursor's
-- visibility, not below its xmin: a relay with nothing new to read keeps the
-- B of its last window as A, and a writer that was running when that B was
-- taken would hold its xmin below the window's events for as long as the
-- outbox stays quiet. A slot without a cursor counts as one at the
-- beginning (take_cursor creates it there), so nothing is deleted until all
-- 64 exist: an event of a slot nobody has read is never deleted. Rows from
-- before windows (txid NULL) are never in the range. In txid order below
-- the highest xmax of any A (nothing above it is visible to any cursor), so
-- the read is a range of events_txid_idx that stops at `batch` rows (a
-- bitmap scan of the whole range cost 13-20 ms a batch of 1,000 on 200,000
-- delivered events, the ordered scan under 1 ms); the cursors are read once
-- a call; deleted by ctid.
--
-- `done` (NULL: none) is a snapshot whose every visible txid has no event
-- left to delete here, as the previous call returned it: the scan skips
-- those txids, because while an old transaction holds vacuum back, the
-- index entries of the events deleted earlier stay and an ordered scan
-- from the start of the index would walk them all again at every call.
-- A snapshot, not a txid: a transaction still running below later deleted
-- ones (its xid in the xip) may commit events later, and those are read
-- again (one index probe per xip entry). A new `done` is the oldest A of
-- the cursors (an event visible in it is visible in its own slot's A, so
-- every such event not fanned out was deleted now or before), cut below
-- the first event this call could not lock (another session has it) or,
-- for a full batch, below its last txid. An event a lagging cursor has not
-- passed is not visible in the oldest A: it stays above `done`, read again
-- at every call, as many as that cursor lags. `done` speaks of the table
-- only, so any relay's is valid for every relay; one ahead of every
-- cursor (another cluster's) is ignored.
-- Returns how many were deleted (run until it deletes fewer than `batch`)
-- and the next `done` (NULL while fewer than 64 cursors exist).
WITH oldest AS (
    SELECT max(pg_snapshot_xmax(c.snap_a)) AS top,
           -- Of two snapshots, the one taken first has the smaller xmax or,
           -- at an equal xmax, more of it still running.
           (array_agg(c.snap_a ORDER BY pg_snapshot_xmax(c.snap_a),
                                        (SELECT count(*) FROM pg_snapshot_xip(c.snap_a)) DESC))[1] AS a,
           -- Each slot's A at [slot + 1]: the cursors are read once a call,
           -- not once an event (their rows carry a version per checkpoint
           -- while vacuum is held back).
           array_agg(c.snap_a ORDER BY c.slot) AS by_slot
    FROM :"schema".cursors c
    WHERE c.destination = ''
    HAVING count(*) = 64
), since AS (
    SELECT o.top, o.a, o.by_slot, CASE WHEN pg_snapshot_xmax($2::pg_snapshot) <= o.top THEN $2::pg_snapshot END AS done
    FROM oldest o
), candidates AS (
    SELECT u.ctid, u.txid
    FROM ((SELECT w.ctid, w.txid
           FROM :"schema".events w
           WHERE w.txid >= (SELECT coalesce(pg_snapshot_xmax(s.done), '0'::xid8) FROM since s)
             AND w.txid < (SELECT s.top FROM since s)
             AND NOT w.fanned_out
             AND pg_visible_in_snapshot(w.txid, (SELECT s.by_slot[:"schema".event_slot(w.ordering_key, w.id) + 1]
                                                 FROM since s))
           ORDER BY w.txid
           LIMIT $1)
          UNION ALL
          -- One probe per xid (LATERAL: never a join over the whole index).
          (SELECT y.ctid, y.txid
           FROM since s
           CROSS JOIN LATERAL pg_snapshot_xip(s.done) x(txid)
           CROSS JOIN LATERAL (
               SELECT w.ctid, w.txid
               FROM :"schema".events w
               WHERE w.txid = x.txid
                 AND w.txid < s.top
                 AND NOT w.fanned_out
                 AND pg_visible_in_snapshot(w.txid, (SELECT s.by_slot[:"schema".event_slot(w.ordering_key, w.id) + 1]
                                                 FROM since s))
               LIMIT $1) y
           ORDER BY y.txid
           LIMIT $1)) u
    ORDER BY u.txid
    LIMIT $1
), gone AS (
    DELETE FROM :"schema".events e
    WHERE e.ctid = ANY (ARRAY(
        SELECT l.ctid
        FROM :"schema".events l
        WHERE l.ctid = ANY (ARRAY(SELECT c.ctid FROM candidates c))
          AND NOT l.fanned_out
        FOR UPDATE SKIP LOCKED))
    RETURNING e.ctid
), cut AS MATERIALIZED (
    SELECT coalesce((SELECT min(c.txid) FROM candidates c WHERE c.ctid NOT IN (SELECT g.ctid FROM gone g)),
                    (SELECT max(c.txid) FROM candidates c HAVING count(*) >= $1)) AS txid
), next AS (
    SELECT s.done,
           CASE WHEN k.txid IS NULL THEN s.a
                ELSE format('%s:%s:%s', least(pg_snapshot_xmin(s.a), k.txid), least(pg_snapshot_xmax(s.a), k.txid),
                            (SELECT string_agg(x::text, ',' ORDER BY x) FROM pg_snapshot_xip(s.a) x
                             WHERE x < k.txid))::pg_snapshot
           END AS a
    FROM since s, cut k
)
SELECT (SELECT count(*) FROM gone) AS deleted,
       (SELECT CASE WHEN pg_snapshot_xmax(n.done) > pg_snapshot_xmax(n.a) THEN n.done ELSE n.a END
        FROM next n)::text AS done;

-- name: free_dead_cursors
-- params: owners
-- Run with take_over_leases, in its transaction: the cursors of relays
-- find_dead_relays found dead are unowned at once, so another relay takes
-- them at its next poll instead of first finding the owner dead itself. The
-- epoch stays (take_cursor moves it); a late park or checkpoint of the dead
-- relay is fenced by the owner.
UPDATE :"schema".cursors
SET owner = NULL
WHERE owner = ANY ($1::text[])
RETURNING destination, slot;

-- name: take_free_cursors
-- params: owner, held
-- A relay's share of the 64 window cursors (destination ''), in one
-- statement: up to ceil(64 / relays alive) less the slots it holds
-- (`held`, int[]), from the cursors that are free by take_cursor's rules
-- (missing: created at the beginning; no owner; an owner that is not a
-- registered relay or whose session lock is free), and ours that we do not
-- hold (given up in a hand-over that failed, or lost). Never one we hold:
-- taking it again would fence our own checkpoints out. Returns what it
-- took, each row with the share it was computed with.
WITH share AS (
    -- Relays alive: ourselves and those whose session lock is held (a row
    -- left by a relay that died waits for the takeover; counting it would
    -- leave half the slots unread until then).
    SELECT ceil(64.0 / greatest(count(*) FILTER (WHERE r.lease_owner = $1
                                                OR NOT pg_try_advisory_xact_lock_shared(r.lock_key)), 1))::int AS n
    FROM :"schema".relays r
), free AS (
    SELECT g.slot
    FROM generate_series(0, 63) AS g(slot)
    LEFT JOIN :"schema".cursors c ON c.destination = '' AND c.slot = g.slot
    WHERE c.slot IS NULL
       OR c.owner IS NULL
       OR (c.owner = $1 AND NOT g.slot = ANY ($2::int[]))
       OR (c.owner <> $1 AND NOT EXISTS (SELECT 1 FROM :"schema".relays r WHERE r.lease_owner = c.owner))
       OR (c.owner <> $1 AND (SELECT pg_try_advisory_xact_lock_shared(r.lock_key) FROM :"schema".relays r
                              WHERE r.lease_owner = c.owner))
    ORDER BY g.slot
    LIMIT greatest((SELECT n FROM share) - cardinality($2::int[]), 0)
)
INSERT INTO :"schema".cursors AS c (destination, slot, snap_a, owner, epoch, system_identifier)
SELECT '', f.slot, '1:1:'::pg_snapshot, $1, 1, (SELECT system_identifier FROM pg_control_system())
FROM free f
ON CONFLICT (destination, slot) DO UPDATE
SET owner = excluded.owner, epoch = c.epoch + 1
WHERE c.owner IS NULL OR c.owner = excluded.owner
   OR NOT EXISTS (SELECT 1 FROM :"schema".relays r WHERE r.lease_owner = c.owner)
   OR (SELECT pg_try_advisory_xact_lock_shared(r.lock_key) FROM :"schema".relays r WHERE r.lease_owner = c.owner)
RETURNING c.slot, c.snap_a::text AS snap_a, c.snap_b::text AS snap_b, c.done_below, c.epoch,
          c.system_identifier, (SELECT n FROM share) AS share;

-- name: cursor_share
-- params: owner
-- A relay's share of the 64 window cursors: ceil(64 / relays alive), as in
-- take_free_cursors.
SELECT ceil(64.0 / greatest(count(*) FILTER (WHERE r.lease_owner = $1
                                            OR NOT pg_try_advisory_xact_lock_shared(r.lock_key)), 1))::int AS share
FROM :"schema".relays r;

-- name: pre_window_events
-- Events written before `outboxd consume-setup windows` (no txid) and not
-- yet parked: no window holds them, and no delivery row owes them yet.
SELECT count(*) AS events FROM :"schema".events WHERE txid IS NULL AND NOT fanned_out;

-- name: pre_window_page
-- params: after_id, max_events
-- The next of those events after `after_id`, in id order, with what routing
-- them needs (park_pre_window_events writes what they owe).
SELECT e.id, e.topic, array_to_string(e.destinations, ',') AS destinations, e.attempts, e.last_error
FROM :"schema".events e
WHERE e.txid IS NULL AND NOT e.fanned_out AND e.id > $1::bigint
ORDER BY e.id
LIMIT $2::bigint;
