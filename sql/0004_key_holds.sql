-- outboxd migration 0004: per-key holds that concurrent claims cannot miss,
-- and replayed dead letters of one destination that keep to them.
--
-- Why: the claim's per-key rule ("no other event of the key is leased") is
-- read from the claiming statement's snapshot, which does not show a lease
-- that another relay's claim has stamped but not yet committed. With an
-- older event of the key appearing meanwhile (a replayed dead letter, or a
-- producer committing after a later id), two relays could each put one
-- event of the key out at once.
--
-- A hold is one row per key (and per destination, for deliveries). A claim
-- takes it with INSERT ... ON CONFLICT, whose unique-index check sees every
-- holder, committed or in progress, whatever the snapshot: it waits for an
-- in-progress holder's commit and then reads the row's latest version. Only
-- events whose hold was taken are leased. The outcome of the event (or
-- delivery) removes its hold; a crashed relay's hold expires with its lease.
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).

-- From this migration on, each file records itself in schema_migrations at
-- its end, so that files applied by hand (psql, your migration tool) leave
-- the outbox as `outboxd migrate` would. The table is made here for that
-- case (`outboxd migrate` makes it before the first migration).
CREATE TABLE IF NOT EXISTS :"schema".schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE :"schema".key_holds (
    ordering_key text        NOT NULL,
    -- '' while the event is sent straight from `events` (to every
    -- destination it routes to); a destination name while one delivery of
    -- a fanned-out event is out (see sql/0002).
    destination  text        NOT NULL,
    -- The event out now; its lease is the hold.
    event_id     bigint      NOT NULL,
    -- The lease expiry: a hold past it is free, so a crashed relay's holds
    -- are taken over with its leases.
    until        timestamptz NOT NULL,
    PRIMARY KEY (ordering_key, destination)
);

-- A replayed dead letter of one destination whose event has left the outbox
-- comes back as an event again, owed to that destination only, instead of
-- as a lone delivery row: as an event it is held to its key's order like
-- any other (it waits while a later event of its key is out, and the later
-- ones wait for it). NULL: every destination its topic routes to.
ALTER TABLE :"schema".events
    ADD COLUMN destinations text[];

-- 0001 to 0003 came before that rule and do not record themselves; this one
-- runs only after them (it alters their tables), so it records them too.
INSERT INTO :"schema".schema_migrations (version, name)
VALUES (1, 'outbox'), (2, 'destinations'), (3, 'validate_on_write')
    ON CONFLICT (version) DO NOTHING;

-- Recorded as applied, so that this file applied on its own (psql, your
-- migration tool) leaves the outbox as `outboxd migrate` would; migrate
-- records it first, and then this does nothing.
INSERT INTO :"schema".schema_migrations (version, name) VALUES (4, 'key_holds')
    ON CONFLICT (version) DO NOTHING;
