-- outboxd migration 0005: message ids that are unique across outboxes.
--
-- Consumers de-duplicate on webhook-id. A bare event id (1, 2, ...) is
-- reused by every other outbox schema or database and by an outbox that is
-- dropped and installed again, so a consumer fed by two of them would drop
-- real events as duplicates. Each outbox therefore gets a random identity,
-- made once, here; an event's message id is that identity plus its id:
--     msg_<16 hex digits of the outbox>_<event id>
-- It is the same for every attempt and every replay of the event (a replay
-- keeps the event id), and different for every outbox.
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).

CREATE TABLE :"schema".outbox_identity (
    -- One row only.
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    id        uuid    NOT NULL DEFAULT gen_random_uuid()
);
INSERT INTO :"schema".outbox_identity DEFAULT VALUES;

-- The webhook-id of an event, for producers and consumers who want to know
-- it in SQL: SELECT outbox.message_id(outbox.enqueue(...)).
CREATE FUNCTION :"schema".message_id(event_id bigint) RETURNS text
    LANGUAGE sql STABLE
    SET search_path = :"schema", pg_temp
AS $$
    SELECT 'msg_' || left(replace(id::text, '-', ''), 16) || '_' || event_id FROM outbox_identity
$$;

-- Recorded as applied, so that this file applied on its own (psql, your
-- migration tool) leaves the outbox as `outboxd migrate` would; migrate
-- records it first, and then this does nothing.
INSERT INTO :"schema".schema_migrations (version, name) VALUES (5, 'message_ids')
    ON CONFLICT (version) DO NOTHING;
