-- outboxd migration 0002: per-destination delivery state.
--
-- An event whose topic routes to several destinations is delivered to each
-- independently: one destination failing neither blocks nor duplicates the
-- others. The routes live in outboxd's configuration, not here; the database
-- only learns about destinations when it has to remember one.
--
-- The fast path writes nothing new: a claimed event is sent straight from
-- `events` to every destination its topic routes to, and deleted once all of
-- them accepted it. Only when some destination fails is the event "fanned
-- out": one `deliveries` row per destination still owed, each with its own
-- retry schedule, attempt count and lease. The event row stays, because it
-- holds the payload, marked fanned_out and parked at available_at =
-- 'infinity' (so the event claim never sees it); it leaves together with its
-- last delivery.
--
-- Per-key order holds per destination: a delivery is due only while no
-- earlier delivery of its key to the same destination is waiting, and an
-- event whose key still has deliveries waiting anywhere is fanned out
-- instead of being sent straight away (see the claim in src/pg/queries.sql).
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).

ALTER TABLE :"schema".events
    ADD COLUMN fanned_out boolean NOT NULL DEFAULT false;

CREATE TABLE :"schema".deliveries (
    event_id     bigint      NOT NULL,
    -- A destination name from outboxd's configuration.
    destination  text        NOT NULL CHECK (destination ~ '^[A-Za-z0-9_-]{1,64}$'),
    -- Copied from the event, so the per-key rule needs no join.
    ordering_key text,
    -- As in events: the next due time, or the lease expiry while leased.
    available_at timestamptz NOT NULL DEFAULT now(),
    -- Attempts at this destination; the fencing token of this row's lease.
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    lease_owner  text,
    PRIMARY KEY (event_id, destination)
);

CREATE INDEX deliveries_available_at_idx ON :"schema".deliveries (available_at, event_id);
-- Serves both "an earlier delivery of this key to this destination" and
-- "this key has deliveries waiting anywhere".
CREATE INDEX deliveries_ordering_key_idx ON :"schema".deliveries (ordering_key, destination, event_id)
    WHERE ordering_key IS NOT NULL;

-- A dead letter is now either a whole event (destination NULL: it could not
-- be sent at all, or no route matched it) or one destination's delivery of
-- it; an event can die at two destinations, so the id alone is no longer a key.
ALTER TABLE :"schema".dead_letters
    ADD COLUMN destination text;
ALTER TABLE :"schema".dead_letters
    DROP CONSTRAINT dead_letters_pkey;
CREATE UNIQUE INDEX dead_letters_id_destination_idx
    ON :"schema".dead_letters (id, destination) NULLS NOT DISTINCT;

-- Rows put into `deliveries` (by a fan-out with nothing to wait for, or by
-- replaying one destination's dead letter) wake the relays like new events.
CREATE TRIGGER deliveries_notify
    AFTER INSERT ON :"schema".deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION :"schema".notify_events();
