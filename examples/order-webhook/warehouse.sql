-- The warehouse of the order-webhook example (the consumer): its own
-- database, apart from the shop's. Install the inbox first:
--
--     psql -1 -v ON_ERROR_STOP=1 -v schema=inbox -f sql/inbox/0001_inbox.sql
--     psql -1 -v ON_ERROR_STOP=1 -f examples/order-webhook/warehouse.sql

CREATE SCHEMA warehouse;

CREATE TABLE warehouse.stock (
    sku      text    PRIMARY KEY,
    on_hand  integer NOT NULL CHECK (on_hand >= 0),
    reserved integer NOT NULL DEFAULT 0 CHECK (reserved >= 0)
);

-- What an order.placed event does here: one pick per order line, and the
-- stock reserved. Nothing in these tables stops a second application of the
-- same event (no unique order id): the inbox is what does.
CREATE TABLE warehouse.picks (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id   bigint      NOT NULL,
    sku        text        NOT NULL REFERENCES warehouse.stock,
    qty        integer     NOT NULL CHECK (qty > 0),
    message_id text        NOT NULL,   -- the webhook-id that made it
    created_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO warehouse.stock (sku, on_hand) VALUES ('mug', 100), ('tee', 50), ('cap', 30);
