-- outboxd migration 0012: each key hold names the relay that took it.
--
-- Why: a claim sends a key's consecutive events as a run, and from this
-- version on it leases only the run's first event; the rest of the run is
-- covered by the key's hold alone (no write per event). A relay that dies,
-- shuts down or loses a claim's answer must then free its holds by owner:
-- its runs' later events carry no lease of their own that could name it.
-- NULL on a hold taken by an older relay, or by a fanned-out delivery's
-- claim (whose rows carry their own leases).
--
-- Upgrade: stop the relays of an older version before starting this one
-- (a rolling upgrade could let an older relay's claim take a run's last
-- event while a newer relay still sends that run). Pending events need
-- nothing: they are untouched.
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).

ALTER TABLE :"schema".key_holds ADD COLUMN lease_owner text;

-- Recorded as applied, so that this file applied on its own (psql, your
-- migration tool) leaves the outbox as `outboxd migrate` would; migrate
-- records it first, and then this does nothing.
INSERT INTO :"schema".schema_migrations (version, name) VALUES (12, 'key_hold_owner')
    ON CONFLICT (version) DO NOTHING;
