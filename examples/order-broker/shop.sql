-- The shop of the order-broker example (the producer): its orders table and
-- the two functions its API calls. The outbox is installed beside it by
-- `outboxd migrate` (schema "outbox").
--
--     psql -1 -v ON_ERROR_STOP=1 -f examples/order-broker/shop.sql

CREATE SCHEMA shop;

CREATE TABLE shop.orders (
    -- Chosen by the client (its order number) and sent again when it retries
    -- the request after a timeout or a lost answer.
    id          text        PRIMARY KEY,
    customer    text        NOT NULL,
    total_cents bigint      NOT NULL CHECK (total_cents > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    paid_at     timestamptz
);

-- Create an order and enqueue its OrderCreated event in one transaction:
-- both are committed or neither. Safe to call again with the same order id:
-- the order's primary key absorbs the repeated insert (ON CONFLICT DO
-- NOTHING) and the event's idempotency key the repeated enqueue, which
-- returns the first event's id and inserts nothing, also long after that
-- event was delivered. Returns the event id.
CREATE FUNCTION shop.place_order(p_order_id text, p_customer text, p_total_cents bigint)
    RETURNS bigint
    LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO shop.orders (id, customer, total_cents)
    VALUES (p_order_id, p_customer, p_total_cents)
    ON CONFLICT (id) DO NOTHING;

    RETURN outbox.enqueue(
        'orders.OrderCreated',
        jsonb_build_object('type', 'OrderCreated', 'order_id', p_order_id,
                           'customer', p_customer, 'total_cents', p_total_cents),
        -- Aggregate type and id: all events of one order reach the stream
        -- one at a time, in the order they were committed.
        ordering_key => 'Order/' || p_order_id,
        idempotency_key => 'order:' || p_order_id || ':OrderCreated');
END
$$;

-- Mark an order paid and enqueue OrderPaid in one transaction; as safe to
-- call again as place_order(). Returns the event id.
CREATE FUNCTION shop.pay_order(p_order_id text) RETURNS bigint
    LANGUAGE plpgsql
AS $$
DECLARE
    order_row shop.orders;
BEGIN
    UPDATE shop.orders SET paid_at = coalesce(paid_at, now())
    WHERE id = p_order_id
    RETURNING * INTO order_row;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no order %', p_order_id;
    END IF;

    RETURN outbox.enqueue(
        'orders.OrderPaid',
        jsonb_build_object('type', 'OrderPaid', 'order_id', p_order_id,
                           'total_cents', order_row.total_cents),
        ordering_key => 'Order/' || p_order_id,
        idempotency_key => 'order:' || p_order_id || ':OrderPaid');
END
$$;
