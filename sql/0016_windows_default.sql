-- outboxd migration 0016: commit-ordered windows are the default.
--
-- Why: a relay that reads windows (relay.consume = "windows") writes nothing
-- per delivered event, drains keyed streams about as fast as unkeyed ones
-- and sends each key's events in commit order (README "Consumption modes",
-- bench/results/windows-vs-claims-2026-12-07.md). Relays now choose windows
-- by themselves (relay.consume = "auto", the default) where the outbox is
-- set up for them; this sets every outbox up, as `outboxd consume-setup
-- windows` does: every new event records the id of the transaction that
-- inserts it, and the window read gets its two indexes. Producers pay one
-- more index entry per event. To keep claiming and not pay it, run
-- `outboxd consume-setup claims` after this migration (its relays then
-- claim by themselves).
--
-- Events already in the outbox keep txid NULL: they are in no window, and
-- the first windows relay parks them ahead of the later events of their
-- keys (nothing lost or reordered). Relays already running keep their mode,
-- and a new relay joins it; the outbox switches to windows once every relay
-- has stopped and one starts again.
--
-- Locks: the index builds read the events table once under a SHARE lock
-- (inserts wait for them: 0.64 s for a million pending events, half of
-- them keyed, on a 2-core machine; an outbox that keeps up holds few).
-- Same statements and names as `consume-setup windows`, so either may come
-- first.
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).

ALTER TABLE :"schema".events ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

CREATE INDEX IF NOT EXISTS events_txid_idx ON :"schema".events (txid, id) WHERE txid IS NOT NULL;

CREATE INDEX IF NOT EXISTS events_pre_window_key_idx ON :"schema".events (ordering_key, id)
    WHERE txid IS NULL AND ordering_key IS NOT NULL;

-- Recorded as applied, so that this file applied on its own (psql, your
-- migration tool) leaves the outbox as `outboxd migrate` would; migrate
-- records it first, and then this does nothing.
INSERT INTO :"schema".schema_migrations (version, name) VALUES (16, 'windows_default')
    ON CONFLICT (version) DO NOTHING;
