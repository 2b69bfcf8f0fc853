-- outboxd migration 0001: the outbox.
--
-- :"schema" is the schema the outbox lives in, written the way psql writes a
-- variable as a quoted identifier, so this file also runs on its own:
--     psql -v schema=outbox -f sql/0001_outbox.sql
-- `outboxd migrate` and `outboxd sql --schema NAME` substitute it themselves.
-- Function bodies never use the placeholder (psql does not substitute inside
-- dollar quotes); the functions pin search_path to the schema instead.

CREATE SCHEMA IF NOT EXISTS :"schema";

-- The hot table holds only events that are not delivered yet: a delivered
-- event is deleted (never flagged in place), so the index every claim reads
-- does not fill up with delivered rows.
CREATE TABLE :"schema".events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Topic and ordering key travel in HTTP headers: no control characters.
    topic           text        NOT NULL
                                CHECK (topic <> '' AND octet_length(topic) <= 255
                                       AND topic !~ '[\x01-\x1f\x7f]'),
    -- Events that share an ordering key are delivered one at a time, in id order.
    ordering_key    text        CHECK (octet_length(ordering_key) <= 255
                                       AND ordering_key !~ '[\x01-\x1f\x7f]'),
    payload         jsonb       NOT NULL,
    -- Extra HTTP headers for this event: an object of string values, whose
    -- names are HTTP tokens and whose values hold no control characters
    -- (CR/LF would let an event inject headers). Checked here, at write
    -- time, so every producer gets the error, not a dead letter later.
    headers         jsonb       NOT NULL DEFAULT '{}'
                                CHECK (jsonb_typeof(headers) = 'object'
                                       AND NOT jsonb_path_exists(headers, '$.* ? (@.type() != "string")')
                                       AND NOT jsonb_path_exists(headers,
                                           '$.keyvalue() ? (!(@.key like_regex "^[-!#$%&''*+.^_`|~0-9A-Za-z]+$"))')
                                       AND NOT jsonb_path_exists(headers,
                                           '$.* ? (@ like_regex "[\\x01-\\x08\\x0a-\\x1f\\x7f]")')),
    idempotency_key text        CHECK (octet_length(idempotency_key) <= 255),
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- When the event may next be claimed. While a relay holds the event
    -- (lease_owner set) this is the lease expiry: one column and one index
    -- then answer "what is claimable now", for new, retried and abandoned
    -- events alike.
    available_at    timestamptz NOT NULL DEFAULT now(),
    -- Incremented by every claim; doubles as the fencing token: an outcome is
    -- recorded only while the row still has the attempt number it was claimed with.
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    lease_owner     text
);

-- The claim walks this index in order and stops after LIMIT rows, however
-- many events have come and gone.
CREATE INDEX events_available_at_idx ON :"schema".events (available_at, id);

-- Per-key order: "is an earlier event of this key still here?" is one probe.
CREATE INDEX events_ordering_key_idx ON :"schema".events (ordering_key, id)
    WHERE ordering_key IS NOT NULL;

-- Idempotency keys outlive their events (a delivered event leaves the hot
-- table, a retried producer must still get the same id back), so they live
-- in their own table. purge_idempotency_keys() trims it.
CREATE TABLE :"schema".idempotency_keys (
    topic           text        NOT NULL,
    idempotency_key text        NOT NULL,
    event_id        bigint      NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, idempotency_key)
);
CREATE INDEX idempotency_keys_created_at_idx ON :"schema".idempotency_keys (created_at);

-- Events that failed permanently or ran out of attempts. They keep their id,
-- so a replayed event is still recognised by consumers that de-duplicate.
-- A dead letter no longer blocks its ordering key.
CREATE TABLE :"schema".dead_letters (
    id               bigint      PRIMARY KEY,
    topic            text        NOT NULL,
    ordering_key     text,
    payload          jsonb       NOT NULL,
    headers          jsonb       NOT NULL,
    idempotency_key  text,
    created_at       timestamptz NOT NULL,
    attempts         integer     NOT NULL,
    last_error       text,
    last_status      integer,
    response_excerpt text,
    died_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_died_at_idx ON :"schema".dead_letters (died_at);
CREATE INDEX dead_letters_topic_idx ON :"schema".dead_letters (topic, died_at);

-- Wake-up: one NOTIFY per inserting statement, with a constant payload, so
-- PostgreSQL folds them into one per transaction and no event data ever
-- travels through the notification queue. The channel is per schema so two
-- outboxes in one database do not wake each other's relays.
CREATE FUNCTION :"schema".notify_events() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('outboxd.' || TG_TABLE_SCHEMA, '');
    RETURN NULL;
END
$$;

CREATE TRIGGER events_notify
    AFTER INSERT ON :"schema".events
    FOR EACH STATEMENT EXECUTE FUNCTION :"schema".notify_events();

-- enqueue: call it in the same transaction as the business change.
-- Returns the event id. A repeated (topic, idempotency_key) inserts nothing
-- and returns the id of the first event.
CREATE FUNCTION :"schema".enqueue(
    topic           text,
    payload         jsonb,
    ordering_key    text        DEFAULT NULL,
    idempotency_key text        DEFAULT NULL,
    headers         jsonb       DEFAULT '{}',
    available_at    timestamptz DEFAULT now()
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
                coalesce(enqueue.headers, '{}'), coalesce(enqueue.available_at, now()))
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
            coalesce(enqueue.available_at, now()));
    RETURN new_id;
END
$$;

-- Forget idempotency keys older than `older_than`; after that a repeated key
-- makes a new event. Returns how many keys were removed.
CREATE FUNCTION :"schema".purge_idempotency_keys(older_than interval) RETURNS bigint
    LANGUAGE sql
    SET search_path = :"schema", pg_temp
AS $$
    WITH gone AS (
        DELETE FROM idempotency_keys WHERE created_at < now() - older_than RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;
