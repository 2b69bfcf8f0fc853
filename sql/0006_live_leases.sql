-- outboxd migration 0006: leases bound to a live relay.
--
-- Why: a relay killed with -9 (or whose machine went away) leaves its
-- leases behind, and until now they were claimable only when they expired
-- (30 s by default). Each relay now holds a session-level advisory lock for
-- its lease owner on the connection that claims, for as long as that
-- session lives, and registers here which lock that is. Another relay (or
-- its own restart) that can take that lock knows the session is gone: it
-- hands the dead relay's leases back, due now, and forgets the row.
--
-- Only relays listed here are ever taken over: a relay that holds no lock
-- (an older outboxd during a rolling upgrade, or one behind a transaction
-- pooler with live leases off) is never mistaken for a dead one; its leases
-- expire as before.
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).

CREATE TABLE :"schema".relays (
    lease_owner text        PRIMARY KEY,
    -- The key of the advisory lock its claiming session holds
    -- (pg_advisory_lock(bigint)).
    lock_key    bigint      NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now()
);

-- Recorded as applied, so that this file applied on its own (psql, your
-- migration tool) leaves the outbox as `outboxd migrate` would; migrate
-- records it first, and then this does nothing.
INSERT INTO :"schema".schema_migrations (version, name) VALUES (6, 'live_leases')
    ON CONFLICT (version) DO NOTHING;
