-- outboxd migration 0008: producers notify only while some relay is idle.
--
-- A transaction that ran NOTIFY takes one cluster-wide lock at commit and
-- holds it until its commit record is flushed, so notifying commits flush
-- one at a time instead of sharing a group commit (README "Wake-up modes"
-- has the measurements). A relay that is busy claims back to back and needs
-- no notification; one that is idle does. So each relay declares here
-- whether it is idle, and the wake-up trigger notifies only while one is:
-- a read of a few rows, no lock beyond the table's AccessShareLock, no
-- write. How a relay leaves the busy state without missing a commit that
-- read "busy" (it watches the transactions in progress at that moment) is
-- in the README.
--
-- until: a relay refreshes its row at every sweep; a row not refreshed (its
-- relay died) stops counting, so a crashed idle relay does not make every
-- commit notify for ever, and a crashed busy one never counted anyway.
CREATE TABLE :"schema".relay_wake (
    owner text        PRIMARY KEY,  -- the relay's lease owner
    idle  boolean     NOT NULL,
    until timestamptz NOT NULL
);

-- Runs as the outbox's owner (SECURITY DEFINER), so producers need no
-- privilege on relay_wake: their existing grants keep working.
CREATE OR REPLACE FUNCTION :"schema".notify_events() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = :"schema", pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM relay_wake WHERE idle AND until > now()) THEN
        PERFORM pg_notify('outboxd.' || TG_TABLE_SCHEMA, '');
    END IF;
    RETURN NULL;
END
$$;

INSERT INTO :"schema".schema_migrations (version, name) VALUES (8, 'wake_when_idle')
    ON CONFLICT (version) DO NOTHING;
