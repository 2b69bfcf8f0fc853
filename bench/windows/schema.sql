-- Prototype of commit-ordered windows (issue 14, docs/commit-ordered-windows.md).
-- Not a migration: a throwaway schema for bench/windows/*.py.
--     psql -v schema=win -1 -f bench/windows/schema.sql
--
-- Events carry the top-level id of the transaction that inserted them; a
-- relay reads "committed between cursor snapshot A and snapshot B" and
-- writes nothing per event. Cleanup would drop whole partitions once every
-- cursor has passed them; the prototype keeps one table (the drain reads
-- only the window, through the txid index, so delivered rows that are still
-- there cost the read nothing but index pages it never visits).

CREATE SCHEMA :"schema";

CREATE TABLE :"schema".events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The inserting transaction's top-level id (a savepoint's subtransaction
    -- commits with it, and the snapshot functions speak top-level ids).
    txid         xid8        NOT NULL DEFAULT pg_current_xact_id(),
    topic        text        NOT NULL,
    ordering_key text,
    payload      jsonb       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL DEFAULT now()
);

-- Window membership: a range scan over the ids of transactions that began
-- between the two snapshots, plus equality probes for the few that were
-- running at A and committed by B. `id` in the index lets the window's ids
-- be read from it in one pass.
CREATE INDEX events_txid_idx ON :"schema".events (txid, id);

-- One row per (destination, slot). `snap_a`: everything visible in it is
-- done. While a window is being worked through, `snap_b` is its end and
-- `done_below` the id below which the window's events are all acknowledged
-- (the low-water mark of what is in flight); the window is finished by
-- setting snap_a = snap_b, snap_b = NULL.
CREATE TABLE :"schema".cursors (
    destination text        NOT NULL,
    slot        integer     NOT NULL,
    snap_a      pg_snapshot NOT NULL,
    snap_b      pg_snapshot,
    done_below  bigint      NOT NULL DEFAULT 0,
    -- Lease: the relay holding the cursor and its fencing epoch (+1 at every
    -- takeover); an advance is written only with the epoch it was read with.
    owner       text,
    epoch       bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (destination, slot)
);
