-- outboxd migration 0007: circuits published by each relay.
--
-- Why: a destination's circuit breaker lives in each relay's memory, so an
-- operator could not see that a relay had stopped sending to a failing
-- destination. Each relay writes the state of every circuit that changed
-- (opened or closed) into its own row of `relays`; `outboxd status` shows
-- it per destination. An object of destination name -> {"state": "open" |
-- "closed", "failures": N}; a destination not named is closed. `status`
-- reads only the rows of relays whose session lives (their lock is held).
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).

ALTER TABLE :"schema".relays ADD COLUMN circuits jsonb NOT NULL DEFAULT '{}';

-- Recorded as applied, so that this file applied on its own (psql, your
-- migration tool) leaves the outbox as `outboxd migrate` would; migrate
-- records it first, and then this does nothing.
INSERT INTO :"schema".schema_migrations (version, name) VALUES (7, 'published_circuits')
    ON CONFLICT (version) DO NOTHING;
