-- outboxd migration 0014: a lease's end in a column of its own.
--
-- Why: until now a claim wrote its lease's end into available_at, an
-- indexed column. So every lease wrote a new row version and an entry in
-- each of the table's indexes, and left behind, in the claim index
-- (available_at, id), an entry in the next lease period that outlived the
-- event's delete until vacuum. A relay's claim that asks when the next
-- event falls due walked those entries, a heap visit each while a long
-- transaction elsewhere held vacuum back (bench/lease_column_probe.py:
-- 12,800 heap fetches and 2-3 ms against 0.01 ms).
-- Now the lease writes leased_until, which no index covers: the update is
-- heap-only (HOT), on the row's own page, with no index entry at all. A
-- leased row keeps its place in the claim index and claims pass over it
-- while its lease runs. A backlog drain without ordering keys went from
-- about 29,000 to 36,000 events/s on the project's benchmark, its
-- PostgreSQL work from 54 to 31 us an event
-- (bench/results/lease-column-2026-12-03.md).
--
-- fillfactor 50: a heap-only update needs room on the row's page for the
-- new version, and rows are leased once each, right after they were
-- written; half of each page is left for that. Pages written before this
-- migration keep their layout (their leases are ordinary updates until
-- their rows are gone).
--
-- What changes for a lease that runs out: it was found by the claim at its
-- end (its available_at came due); now by a claim from the start of the
-- index, which the relay makes at every sweep (relay.sweep_interval). A
-- dead relay's leases are taken over with its session as before
-- (sql/0006); this only delays the events of a relay that hangs with its
-- session alive, or of one without live leases (behind a transaction
-- pooler), by up to one sweep interval after the lease's end.
--
-- Upgrade: stop the relays of an older version before starting this one.
-- An older relay does not read leased_until and could claim an event a
-- newer one holds. Leases an older relay left (one killed before the
-- upgrade) are left as they are: their end is in available_at, and they run
-- out, or are taken over with their relay's session, as before.
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).

ALTER TABLE :"schema".events ADD COLUMN leased_until timestamptz;
ALTER TABLE :"schema".events SET (fillfactor = 50);

-- Recorded as applied, so that this file applied on its own (psql, your
-- migration tool) leaves the outbox as `outboxd migrate` would; migrate
-- records it first, and then this does nothing.
INSERT INTO :"schema".schema_migrations (version, name) VALUES (14, 'lease_column')
    ON CONFLICT (version) DO NOTHING;
