-- outboxd migration 0013: a new event's available_at is the time it is
-- written, not the time its transaction began.
--
-- Why: a relay's claim starts at a low mark, behind which everything due was
-- taken by an earlier claim, and for the low mark it needs to know how far
-- back an event that is not committed yet can be due. Until now the answer
-- was "its transaction's start" (now()), which can be any time before the
-- event was written; so the low mark lay 5 seconds back, and every claim
-- walked the index entries of every event delivered in those 5 seconds
-- (under a long transaction elsewhere, a heap visit each). With the time of
-- writing (clock_timestamp()), an event not yet committed is either written
-- by a transaction that holds a lock on this table now, whose start bounds
-- it, or written later than now; the relay reads the first from pg_locks
-- (see the claim in the relay's queries) and its low mark follows the
-- oldest writer in progress instead of a fixed 5 seconds.
--
-- An explicit available_at (a delayed event) is unchanged. One earlier than
-- the time of writing, by a transaction that commits later, may wait for the
-- relay's sweep (as one more than 5 s earlier did before).
--
-- Upgrade: nothing to stop or wait for; pending events are untouched.
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).

ALTER TABLE :"schema".events ALTER COLUMN available_at SET DEFAULT clock_timestamp();

-- As in 0001, with clock_timestamp() evaluated when the row is written (an
-- enqueue with an idempotency key may first wait for another one's commit).
CREATE OR REPLACE FUNCTION :"schema".enqueue(
    topic           text,
    payload         jsonb,
    ordering_key    text        DEFAULT NULL,
    idempotency_key text        DEFAULT NULL,
    headers         jsonb       DEFAULT '{}',
    available_at    timestamptz DEFAULT NULL
) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path = :"schema", pg_temp
AS $$
DECLARE
    new_id bigint;
BEGIN
    IF enqueue.idempotency_key IS NULL THEN
        INSERT INTO events (topic, ordering_key, payload, headers, available_at)
        VALUES (enqueue.topic, enqueue.ordering_key, enqueue.payload,
                coalesce(enqueue.headers, '{}'), coalesce(enqueue.available_at, clock_timestamp()))
        RETURNING id INTO new_id;
        RETURN new_id;
    END IF;

    -- Reserve the key first: a concurrent enqueue of the same key waits here
    -- for our commit and then takes the branch below.
    INSERT INTO idempotency_keys (topic, idempotency_key, event_id)
    VALUES (enqueue.topic, enqueue.idempotency_key,
            nextval(pg_get_serial_sequence('events', 'id')))
    ON CONFLICT DO NOTHING
    RETURNING event_id INTO new_id;

    IF new_id IS NULL THEN
        SELECT k.event_id INTO new_id
        FROM idempotency_keys k
        WHERE k.topic = enqueue.topic AND k.idempotency_key = enqueue.idempotency_key;
        RETURN new_id;
    END IF;

    INSERT INTO events (id, topic, ordering_key, payload, headers, idempotency_key, available_at)
    OVERRIDING SYSTEM VALUE
    VALUES (new_id, enqueue.topic, enqueue.ordering_key, enqueue.payload,
            coalesce(enqueue.headers, '{}'), enqueue.idempotency_key,
            coalesce(enqueue.available_at, clock_timestamp()));
    RETURN new_id;
END
$$;

-- Recorded as applied, so that this file applied on its own (psql, your
-- migration tool) leaves the outbox as `outboxd migrate` would; migrate
-- records it first, and then this does nothing.
INSERT INTO :"schema".schema_migrations (version, name) VALUES (13, 'available_at_written_time')
    ON CONFLICT (version) DO NOTHING;
