-- The prototype's statements, one `-- name:` block each (read by
-- bench/windows/window_drain.py). :"schema" is replaced by the driver.

-- name: open_window
-- params: destination, slot, epoch
-- Takes snapshot B (this statement's own snapshot: pg_current_snapshot()
-- is the active snapshot, so every row it returns is one the statement can
-- see), or resumes the window the cursor records (B and done_below, after a
-- takeover), and returns the ids and keys of the events committed after A and by
-- B, in id order, with B on every row; one row with a NULL id when the
-- window is empty, so that A can still move up to B.
-- Membership, as PgQ does it, without a scan that grows behind a long
-- transaction: ids that began at or after A's xmax and before B's xmax (a
-- range of the txid index), plus the transactions A saw running that B
-- sees finished (equality probes). A's xmin is never used as a bound: it is
-- where a long transaction would pin the scan. Aborted transactions are
-- "visible" to pg_visible_in_snapshot but their rows are not to the
-- statement, so they drop out by themselves. `id + 0`: the resume bound
-- must not tempt the generic plan into walking the primary key from it
-- (through every delivered event still in the table).
WITH c AS MATERIALIZED (
    SELECT snap_a, coalesce(snap_b, pg_current_snapshot()) AS snap_b, done_below
    FROM :"schema".cursors
    WHERE destination = $1 AND slot = $2 AND epoch = $3
)
SELECT w.id, w.ordering_key, c.snap_b::text
FROM c
LEFT JOIN LATERAL (
    -- Began between the snapshots: a range of the txid index.
    SELECT e.id, e.ordering_key
    FROM :"schema".events e
    WHERE e.txid >= pg_snapshot_xmax(c.snap_a) AND e.txid < pg_snapshot_xmax(c.snap_b)
      AND pg_visible_in_snapshot(e.txid, c.snap_b)
      AND e.id + 0 >= c.done_below
    UNION ALL
    -- Running at A, finished by B: equality probes.
    SELECT e.id, e.ordering_key
    FROM pg_snapshot_xip(c.snap_a) x
    JOIN :"schema".events e ON e.txid = x
    WHERE pg_visible_in_snapshot(x, c.snap_b)
      AND e.id + 0 >= c.done_below
) w ON true
ORDER BY w.id;

-- name: read_window
-- params: snap_a, snap_b (NULL: take B now), done_below
-- open_window with the cursor the relay keeps in memory: the read touches
-- no cursor row. A cursor row updated at every window piles up dead
-- versions while a long transaction holds back pruning, and every read of
-- it walks them (measured: bench/NOTES.md, "Commit-ordered windows"); so
-- the relay writes its cursor as a checkpoint (finish_window or
-- advance_within, fenced by the epoch) at most once a second and when it
-- hands a slot over.
WITH c AS MATERIALIZED (
    SELECT $1::pg_snapshot AS snap_a, coalesce($2::pg_snapshot, pg_current_snapshot()) AS snap_b,
           $3::bigint AS done_below
)
SELECT w.id, w.ordering_key, c.snap_b::text
FROM c
LEFT JOIN LATERAL (
    -- Began between the snapshots: a range of the txid index.
    SELECT e.id, e.ordering_key
    FROM :"schema".events e
    WHERE e.txid >= pg_snapshot_xmax(c.snap_a) AND e.txid < pg_snapshot_xmax(c.snap_b)
      AND pg_visible_in_snapshot(e.txid, c.snap_b)
      AND e.id + 0 >= c.done_below
    UNION ALL
    -- Running at A, finished by B: equality probes.
    SELECT e.id, e.ordering_key
    FROM pg_snapshot_xip(c.snap_a) x
    JOIN :"schema".events e ON e.txid = x
    WHERE pg_visible_in_snapshot(x, c.snap_b)
      AND e.id + 0 >= c.done_below
) w ON true
ORDER BY w.id;

-- name: fetch_page
-- params: ids (a page of the window's ids, ascending)
SELECT e.id, e.topic, e.ordering_key, e.payload, e.headers
FROM :"schema".events e
WHERE e.id = ANY ($1::bigint[])
ORDER BY e.id;

-- name: advance_within
-- params: destination, slot, epoch, snap_b, done_below
-- Progress inside a window: everything below done_below is acknowledged.
-- Fenced by the epoch: a relay that lost the cursor writes nothing.
UPDATE :"schema".cursors
SET snap_b = $4::pg_snapshot, done_below = $5
WHERE destination = $1 AND slot = $2 AND epoch = $3
RETURNING 1;

-- name: finish_window
-- params: destination, slot, epoch, snap_b
UPDATE :"schema".cursors
SET snap_a = $4::pg_snapshot, snap_b = NULL, done_below = 0
WHERE destination = $1 AND slot = $2 AND epoch = $3
RETURNING 1;
