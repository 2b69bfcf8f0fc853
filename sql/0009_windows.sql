-- outboxd migration 0009: the foundation of commit-ordered windows.
--
-- What a relay needs to consume the outbox the way PgQ does, by "committed
-- after snapshot A and visible in snapshot B", with no write per event
-- (docs/commit-ordered-windows.md). This migration only adds what costs
-- producers nothing: a nullable column, a function and the cursors table.
-- What producers pay for (the column's default and its index: one more
-- index entry per event) is installed by `outboxd consume-setup windows`
-- when an operator switches a relay to relay.consume = "windows", and
-- removed by `outboxd consume-setup claims` (src/pg/queries.sql,
-- consume_setup_*). A relay that claims events ignores all of it.
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).
-- Every statement here only changes the catalog (no table rewrite, no index
-- build).

-- The top-level id of the transaction that inserted the event, once
-- `consume-setup windows` gives the column its default
-- (pg_current_xact_id(): 64 bits, epoch-extended, never wraps; an insert
-- under a savepoint gets its top-level transaction's id, which is what
-- snapshots speak of). NULL means "inserted before windows were set up":
-- such an event is in no window; a claiming relay delivers it as always.
ALTER TABLE :"schema".events ADD COLUMN txid xid8;

-- Which of the 64 slots an event belongs to: several relays split the
-- outbox by slot, and all events of one ordering key share a slot (unkeyed
-- events spread by id). Computed by the window read, not stored: a stored
-- generated column rewrites the table when added (ACCESS EXCLUSIVE for the
-- length of the rewrite), a trigger costs every producer, and a column
-- default cannot read ordering_key; the read fetches each window row from
-- the heap anyway (to check its visibility), so computing the slot there
-- costs only the hash (docs/commit-ordered-windows.md has the numbers).
-- `& 63`, not abs() % 64: abs() of the one hash value -2^31 is an error.
-- The number of slots is fixed here; changing it means draining first.
CREATE FUNCTION :"schema".event_slot(ordering_key text, id bigint) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN hashtext(coalesce(ordering_key, id::text)) & 63;

-- A consumer's position per (destination, slot). snap_a: every event it
-- sees is done at this destination for this slot. While a window is being
-- worked through, snap_b is the window's end and done_below the id below
-- which the window's events are all settled; a finished window has
-- snap_a = its B, snap_b NULL, done_below 0. The owning relay keeps the
-- position in memory and writes it here as a checkpoint (at most about once
-- a second, and when it hands the slot over), fenced by epoch: +1 at every
-- take, so a relay that lost the cursor writes nothing. owner is a relay
-- registered in `relays` (sql/0006): a cursor is taken from it only once
-- its session is gone. system_identifier (pg_control_system()) says which
-- cluster the snapshots belong to: snapshots of another cluster (a restore
-- into a new one) mean nothing here and must not be trusted.
-- fillfactor: checkpoints rewrite each row about once a second; room on the
-- page keeps those updates HOT.
CREATE TABLE :"schema".cursors (
    destination       text        NOT NULL,
    slot              integer     NOT NULL CHECK (slot BETWEEN 0 AND 63),
    snap_a            pg_snapshot NOT NULL,
    snap_b            pg_snapshot CHECK (pg_snapshot_xmax(snap_b) >= pg_snapshot_xmax(snap_a)),
    done_below        bigint      NOT NULL DEFAULT 0,
    owner             text,
    epoch             bigint      NOT NULL DEFAULT 0,
    checkpointed_at   timestamptz NOT NULL DEFAULT now(),
    system_identifier bigint      NOT NULL,
    PRIMARY KEY (destination, slot)
) WITH (fillfactor = 50);

INSERT INTO :"schema".schema_migrations (version, name) VALUES (9, 'windows')
    ON CONFLICT (version) DO NOTHING;
