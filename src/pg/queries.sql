-- Every statement outboxd runs at run time, one named block each
-- ("-- name: NAME" starts a block). Embedded into the binary by
-- tools/embed_sql.py; :"schema" is replaced by the quoted schema name.
-- Logs name the statement that failed.

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
-- Session-level: held for the whole `outboxd migrate`, so two migrators run
-- one after the other, and the second finds nothing left to do.
SELECT pg_advisory_lock(hashtextextended('outboxd.migrate.' || $1, 0));

-- name: migration_unlock
SELECT pg_advisory_unlock(hashtextextended('outboxd.migrate.' || $1, 0));

-- name: schema_installed
-- $1 = the quoted name of the schema_migrations table.
SELECT to_regclass($1) IS NOT NULL;

-- name: schema_version
SELECT coalesce(max(version), 0) FROM :"schema".schema_migrations;

-- name: record_migration
-- Inserted first inside the migration's transaction: a concurrent migrator
-- that slipped past the lock would fail on the primary key, not apply twice.
INSERT INTO :"schema".schema_migrations (version, name) VALUES ($1, $2);

-- name: claim
-- Picks due events and stamps our lease in one short statement; no
-- transaction stays open while events are delivered.
-- An event with an ordering key is due only while no earlier event of its key
-- is still in the table (in flight, waiting for a retry, or not yet due) and
-- no other event of its key is leased (a replayed dead letter has an older id
-- than events of its key that may be out already). So a key never has two
-- events out at once, across any number of relays.
-- $1 = how many (free delivery slots), $2 = lease owner, $3 = lease in ms.
WITH due AS (
    SELECT e.id
    FROM :"schema".events e
    WHERE e.available_at <= now()
      AND (e.ordering_key IS NULL OR NOT EXISTS (
              SELECT 1 FROM :"schema".events other
              WHERE other.ordering_key = e.ordering_key
                AND (other.id < e.id OR (other.lease_owner IS NOT NULL AND other.available_at > now()))))
    ORDER BY e.available_at, e.id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE :"schema".events e
    SET attempts = e.attempts + 1,
        lease_owner = $2,
        available_at = now() + $3 * interval '1 millisecond'
    FROM due
    WHERE e.id = due.id
    RETURNING e.id, e.topic, e.ordering_key, e.payload::text AS payload, e.headers::text AS headers, e.attempts
)
SELECT id, topic, ordering_key, payload, headers, attempts, NULL::bigint
FROM claimed
UNION ALL
-- One more row: milliseconds until the earliest event that is not due yet (a
-- retry, a delayed event, a lease expiring), or NULL. Computed in the same
-- statement, with the same now() and snapshot as the claim, so no event can
-- fall due in a gap between "claim what is due" and "when is the next one".
SELECT NULL, NULL, NULL, NULL, NULL, NULL,
       (SELECT ceil(extract(epoch FROM (min(available_at) - now())) * 1000)::bigint
        FROM :"schema".events
        WHERE available_at > now());

-- name: complete
-- Delivered: the events leave the hot table. Fenced: only rows that still
-- carry our lease and the attempt number we claimed them with.
-- $1 = ids, $2 = attempts (parallel arrays), $3 = lease owner.
DELETE FROM :"schema".events e
USING unnest($1::bigint[], $2::integer[]) AS done(id, attempt)
WHERE e.id = done.id AND e.attempts = done.attempt AND e.lease_owner = $3
RETURNING e.id;

-- name: reschedule
-- Failed, to be retried after $4 ms. Fenced like `complete`.
UPDATE :"schema".events
SET available_at = now() + $4 * interval '1 millisecond',
    last_error = $5,
    lease_owner = NULL
WHERE id = $1 AND attempts = $2 AND lease_owner = $3
RETURNING id;

-- name: bury
-- Failed for good: moved to dead letters in one statement. Fenced like `complete`.
WITH gone AS (
    DELETE FROM :"schema".events
    WHERE id = $1 AND attempts = $2 AND lease_owner = $3
    RETURNING id, topic, ordering_key, payload, headers, idempotency_key, created_at, attempts
)
INSERT INTO :"schema".dead_letters
    (id, topic, ordering_key, payload, headers, idempotency_key, created_at, attempts,
     last_error, last_status, response_excerpt)
SELECT id, topic, ordering_key, payload, headers, idempotency_key, created_at, attempts,
       $4, $5, $6
FROM gone
RETURNING id;

-- name: release
-- Graceful shutdown: hand back what we hold but could not finish, due now,
-- so another relay (or our successor) picks it up without waiting for the lease.
UPDATE :"schema".events
SET available_at = now(), lease_owner = NULL
WHERE lease_owner = $1
RETURNING id;

-- name: enqueue
SELECT :"schema".enqueue($1, $2::jsonb, $3, $4, $5::jsonb, now() + $6 * interval '1 millisecond');

-- name: dead_list
-- $1 = topic or NULL, $2 = only those that died more than $2 ms ago (or NULL),
-- $3 = limit. Oldest first.
SELECT id, topic, ordering_key, attempts, last_status, last_error, response_excerpt,
       created_at, died_at, payload::text
FROM :"schema".dead_letters
WHERE ($1::text IS NULL OR topic = $1)
  AND ($2::bigint IS NULL OR died_at < now() - $2 * interval '1 millisecond')
ORDER BY id
LIMIT $3;

-- name: dead_replay
-- Moves dead letters back into the outbox under their original id (consumers
-- still recognise a replayed event), due now, attempts from zero.
-- $1 = one id or NULL, $2 = topic or NULL, $3 = older than $3 ms or NULL.
WITH revived AS (
    DELETE FROM :"schema".dead_letters
    WHERE ($1::bigint IS NULL OR id = $1)
      AND ($2::text IS NULL OR topic = $2)
      AND ($3::bigint IS NULL OR died_at < now() - $3 * interval '1 millisecond')
    RETURNING id, topic, ordering_key, payload, headers, idempotency_key, created_at, last_error
)
INSERT INTO :"schema".events
    (id, topic, ordering_key, payload, headers, idempotency_key, created_at, available_at, attempts, last_error)
OVERRIDING SYSTEM VALUE
SELECT id, topic, ordering_key, payload, headers, idempotency_key, created_at, now(), 0, last_error
FROM revived
RETURNING id;

-- name: dead_purge
-- $1 = older than $1 ms, $2 = topic or NULL.
DELETE FROM :"schema".dead_letters
WHERE died_at < now() - $1 * interval '1 millisecond'
  AND ($2::text IS NULL OR topic = $2)
RETURNING id;

-- name: status
-- Per topic: what waits in the outbox and what died. For `outboxd status`.
WITH live AS (
    SELECT topic,
           count(*) AS pending,
           count(*) FILTER (WHERE lease_owner IS NOT NULL) AS in_flight,
           count(*) FILTER (WHERE lease_owner IS NULL AND attempts > 0) AS retrying,
           extract(epoch FROM now() - min(created_at)) AS oldest_seconds
    FROM :"schema".events GROUP BY topic
), dead AS (
    SELECT topic, count(*) AS dead FROM :"schema".dead_letters GROUP BY topic
)
SELECT coalesce(live.topic, dead.topic), coalesce(pending, 0), coalesce(in_flight, 0),
       coalesce(retrying, 0), coalesce(oldest_seconds, 0)::float8, coalesce(dead, 0)
FROM live FULL JOIN dead ON dead.topic = live.topic
ORDER BY 1;
