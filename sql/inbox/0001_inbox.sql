-- The inbox: the consumer's half of at-least-once delivery (not an outboxd
-- migration; outboxd never installs or reads it).
--
-- outboxd delivers every event at least once, so a consumer sometimes gets
-- one again: after a timeout whose request did arrive, after it crashed
-- between applying an event and answering, after a dead letter is replayed.
-- The inbox makes applying an event happen once: the consumer records the
-- event's message id (the `webhook-id` header) in the SAME transaction as
-- the change the event causes, and applies the change only when the id was
-- new. A duplicate then commits nothing and is answered 2xx like the first.
--
-- Install it in the consumer's own database, like the outbox:
--     psql -1 -v ON_ERROR_STOP=1 -v schema=inbox -f sql/inbox/0001_inbox.sql
-- or copy it into your migration tool with :"schema" replaced by the schema
-- name. A later change to this file would come as 0002, never as an edit.
--
-- Use, in the handler (after verifying the webhook signature):
--     BEGIN;
--     SELECT inbox.receive('msg_5f0c2a9be1d34c07_42', 'order.placed');
--     -- true:  the first time: apply the change here, in this transaction
--     -- false: applied before: change nothing
--     COMMIT;
--     -- then answer 2xx, in both cases
-- Answering only after COMMIT is what makes a crash safe: a crash before the
-- commit applied nothing and recorded nothing (outboxd retries, the retry
-- applies it); a crash after the commit applied it and recorded it (the
-- retry finds the id and changes nothing).

CREATE SCHEMA IF NOT EXISTS :"schema";

CREATE TABLE :"schema".received_messages (
    -- The whole webhook-id (msg_<outbox>_<event id>): unique across outboxes,
    -- the same for every retry and replay of one event.
    message_id  text        PRIMARY KEY CHECK (message_id <> ''),
    topic       text,
    received_at timestamptz NOT NULL DEFAULT now()
);

-- purge() deletes by age.
CREATE INDEX received_messages_received_at_idx ON :"schema".received_messages (received_at);

-- Record a message id; true if it was new (apply the message), false if it
-- was recorded before (skip it). A concurrent transaction that is recording
-- the same id makes this wait for its outcome: its commit means false here,
-- its rollback true. Relies on the primary key: ON CONFLICT needs it to see
-- a duplicate at all.
CREATE FUNCTION :"schema".receive(message_id text, topic text DEFAULT NULL) RETURNS boolean
    LANGUAGE sql
    SET search_path = :"schema", pg_temp
AS $$
    WITH recorded AS (
        INSERT INTO received_messages (message_id, topic)
        VALUES (receive.message_id, receive.topic)
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM recorded);
$$;

-- Forget ids recorded longer ago than `older_than`; returns how many. An
-- event can come back as long as outboxd may still send it: through its
-- retries (about 2 days with the default retry settings) and, as a replayed
-- dead letter, until outboxd deletes it (relay.dead_letter_retention, 30
-- days by default). Keep ids longer than both together, e.g. 45 days:
--     SELECT inbox.purge(interval '45 days');
CREATE FUNCTION :"schema".purge(older_than interval) RETURNS bigint
    LANGUAGE sql
    SET search_path = :"schema", pg_temp
AS $$
    WITH gone AS (
        DELETE FROM received_messages WHERE received_at < now() - older_than RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;
