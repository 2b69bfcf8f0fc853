-- Least-privilege roles for outboxd: run as the role that owns the outbox
-- schema (the one that ran `outboxd migrate`), after migrating. Plain SQL
-- with psql variables, like the migrations:
--   psql -v schema=outbox -v producer=app -v relay=outboxd -f config/grants.sql
--
-- Three roles:
--   the owner     runs `outboxd migrate` (it creates and alters the outbox):
--                 it needs CREATE on the database (GRANT CREATE ON DATABASE app
--                 TO owner), even when the schema exists already, because
--                 PostgreSQL checks it for CREATE SCHEMA IF NOT EXISTS first;
--   :producer     the application: writes events with enqueue() in its own
--                 transactions; nothing else
--   :relay        `outboxd run`, and the operators' `status` and `dead`
--                 commands: reads, updates and deletes what is in the outbox
--
-- enqueue() runs with the caller's privileges, so the producer needs INSERT
-- (and SELECT, for the id it returns) on the tables it writes, and the
-- events id sequence for idempotency keys.

GRANT USAGE ON SCHEMA :"schema" TO :"producer", :"relay";

GRANT SELECT, INSERT ON :"schema".events, :"schema".idempotency_keys TO :"producer";
-- message_id(): the outbox's identity, which every webhook-id carries.
GRANT SELECT ON :"schema".outbox_identity TO :"producer";
GRANT USAGE ON ALL SEQUENCES IN SCHEMA :"schema" TO :"producer";

GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA :"schema" TO :"relay";
GRANT USAGE ON ALL SEQUENCES IN SCHEMA :"schema" TO :"relay";
-- Tables a later migration adds (run by the same owner) come with the same grants.
ALTER DEFAULT PRIVILEGES IN SCHEMA :"schema" GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"relay";
ALTER DEFAULT PRIVILEGES IN SCHEMA :"schema" GRANT USAGE ON SEQUENCES TO :"relay";
