-- outboxd migration 0010: the wake-up trigger asks a sequence, not a table.
--
-- Since 0008 the wake-up trigger notifies only while some relay has
-- declared itself idle. It asked by running a query on relay_wake in a
-- PL/pgSQL function at every producer's insert: a plan executed, a table
-- and its index opened and locked, a snapshot taken. Under 32 producer
-- connections that cost about 8-19 µs of CPU a commit (5-9% of the commit
-- rate) with every relay busy, when nothing is notified at all (README
-- "Wake-up modes" has the measurements).
--
-- Now the answer is kept in a sequence: relay_idle_until holds the latest
-- `until` (milliseconds since the epoch) of the relays declared idle, and
-- the triggers' WHEN clause compares it with now(). A sequence is read
-- without a snapshot or a plan; its value changes at once and outside any
-- transaction (setval), which is what a producer should see. While no relay
-- is idle, the trigger's function is not even called.
--
-- relay_wake stays the record of each relay's declaration (the relay writes
-- it as before, and so can an older relay during an upgrade); a trigger on
-- it recomputes the sequence after every change. Declarations serialize on
-- an advisory lock, so that of two relays changing their rows at the same
-- moment, the later one sees the earlier one's committed row: otherwise a
-- relay going busy could overwrite the sequence with 0 just after another
-- declared itself idle, and that one would wait for its sweep.
--
-- Like 0001, runs as one transaction with :"schema" set (psql -v schema=...).

CREATE SEQUENCE :"schema".relay_idle_until AS bigint MINVALUE 0;

-- Producers read it in the trigger's WHEN clause, with their own
-- privileges: the only thing it tells is until when some relay is idle.
GRANT SELECT ON SEQUENCE :"schema".relay_idle_until TO PUBLIC;

-- Runs as the outbox's owner (SECURITY DEFINER): relays need no privilege
-- on the sequence.
CREATE FUNCTION :"schema".publish_idle_until() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = :"schema", pg_temp
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('outboxd.relay_wake.' || TG_TABLE_SCHEMA, 0));
    -- A new statement, so a new snapshot: it sees every declaration
    -- committed before the lock was granted.
    PERFORM setval('relay_idle_until',
                   coalesce((SELECT max(greatest(least(extract(epoch FROM until) * 1000,
                                                       9000000000000000), 0))::bigint
                             FROM relay_wake WHERE idle), 0));
    RETURN NULL;
END
$$;

CREATE TRIGGER relay_wake_publish
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON :"schema".relay_wake
    FOR EACH STATEMENT EXECUTE FUNCTION :"schema".publish_idle_until();

-- The triggers' function asks the sequence too, not relay_wake: a trigger
-- created without the WHEN clause (by an older binary's `wake-setup`)
-- still notifies only while a relay is idle. And a producer in REPEATABLE
-- READ whose snapshot predates a relay's busy -> idle transition now sees
-- that relay idle: relay_wake, read in that snapshot, showed it busy, and
-- the producer's event waited for the next claim or the sweep.
CREATE OR REPLACE FUNCTION :"schema".notify_events() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = :"schema", pg_temp
AS $$
BEGIN
    IF pg_sequence_last_value('relay_idle_until') > date_part('epoch', now()) * 1000 THEN
        PERFORM pg_notify('outboxd.' || TG_TABLE_SCHEMA, '');
    END IF;
    RETURN NULL;
END
$$;

-- (Re)creates the wake-up triggers on events and deliveries, with the
-- sequence in their WHEN clause. `outboxd wake-setup auto|notify` calls it;
-- replace_only (this migration): only where a trigger is installed now, so
-- an outbox set up for poll or wal stays without one. The sequence is
-- named by a constant in the clause, which the schema's name cannot be
-- spliced into safely here; the function builds it from its own schema.
CREATE FUNCTION :"schema".install_wake_triggers(replace_only boolean) RETURNS void
    LANGUAGE plpgsql
    SET search_path = :"schema", pg_temp
AS $$
DECLARE
    outbox text := current_schema();
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['events', 'deliveries'] LOOP
        CONTINUE WHEN replace_only AND NOT EXISTS (
            SELECT 1 FROM pg_catalog.pg_trigger
            WHERE tgrelid = format('%I.%I', outbox, t)::regclass AND tgname = t || '_notify');
        EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER INSERT ON %I.%I FOR EACH STATEMENT '
                       'WHEN (pg_catalog.pg_sequence_last_value(%L::pg_catalog.regclass) '
                       '      > pg_catalog.date_part(''epoch'', pg_catalog.now()) * 1000) '
                       'EXECUTE FUNCTION %I.notify_events()',
                       t || '_notify', outbox, t, format('%I.relay_idle_until', outbox), outbox);
    END LOOP;
END
$$;

SELECT :"schema".install_wake_triggers(true);

-- Publishes the declarations of the relays running now (a statement
-- trigger fires even when no row changes).
UPDATE :"schema".relay_wake SET idle = idle;

INSERT INTO :"schema".schema_migrations (version, name) VALUES (10, 'idle_until_sequence')
    ON CONFLICT (version) DO NOTHING;
