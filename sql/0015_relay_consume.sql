-- outboxd migration 0015: each relay says how it consumes.
--
-- Why: a relay that claims (relay.consume = "claims") and one that reads
-- commit-ordered windows ("windows") on the same outbox both send every
-- event the windows relay reads: the window read takes no lease for a claim
-- to skip, and the claim's lease is not a window's business. Side by side
-- they send events twice, and the two copies of a key's events can arrive
-- interleaved, out of order. Until now the README asked for every relay of
-- an outbox to use the same mode; now a relay refuses to start while a live
-- relay of the other mode is registered here (sql/0006: its session lock is
-- held), so a switch cannot happen by halves.
-- NULL on the row of a relay older than this version (it registers without
-- saying); such a relay is not checked against.
--
-- Upgrade: nothing to stop; rows already here keep NULL until their relay
-- registers again.
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).

ALTER TABLE :"schema".relays ADD COLUMN consume text
    CHECK (consume IN ('claims', 'windows'));

-- Recorded as applied, so that this file applied on its own (psql, your
-- migration tool) leaves the outbox as `outboxd migrate` would; migrate
-- records it first, and then this does nothing.
INSERT INTO :"schema".schema_migrations (version, name) VALUES (15, 'relay_consume')
    ON CONFLICT (version) DO NOTHING;
