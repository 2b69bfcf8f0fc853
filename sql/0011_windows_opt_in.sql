-- outboxd migration 0011: windows cost producers nothing until asked.
--
-- 0009 as first released gave events.txid its default and built the two
-- indexes the window read uses, on every outbox, so every producer paid one
-- more index entry per event (7-11% of a producer's backend CPU, README
-- "Consumption modes") whether or not any relay read windows. Those are now
-- installed by `outboxd consume-setup windows` when an operator switches a
-- relay to relay.consume = "windows", and removed by `consume-setup claims`.
-- This migration takes them away again where no windows relay has used the
-- outbox (no cursor): the outbox is then as `consume-setup claims` leaves
-- it. An outbox with cursors is in windows use and keeps them (taking the
-- default away under a windows relay would hide every later event from it).
-- An outbox set up with `consume-setup windows` whose relays have not run
-- yet loses them: its windows relay then refuses to start (exit 4) and says
-- to run `outboxd consume-setup windows` again.
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).
-- Dropping an index takes the events table's ACCESS EXCLUSIVE lock for a
-- moment (see README "Upgrading" on lock_timeout).

-- A function for the condition (a migration is plain SQL; PL/pgSQL decides),
-- with the schema on its search_path so that no name is spliced into text.
CREATE FUNCTION :"schema".windows_opt_in_0011() RETURNS void
    LANGUAGE plpgsql
    SET search_path = :"schema", pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM cursors) THEN
        RETURN;
    END IF;
    ALTER TABLE events ALTER COLUMN txid DROP DEFAULT;
    DROP INDEX IF EXISTS events_txid_idx;
    DROP INDEX IF EXISTS events_pre_window_key_idx;
END
$$;

SELECT :"schema".windows_opt_in_0011();
DROP FUNCTION :"schema".windows_opt_in_0011();

INSERT INTO :"schema".schema_migrations (version, name) VALUES (11, 'windows_opt_in')
    ON CONFLICT (version) DO NOTHING;
