-- The shop of the order-webhook example (the producer): its orders table,
-- and the function its checkout calls. The outbox is installed beside it by
-- `outboxd migrate` (schema "outbox").
--
--     psql -1 -v ON_ERROR_STOP=1 -f examples/order-webhook/shop.sql

CREATE SCHEMA shop;

CREATE TABLE shop.orders (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer  text        NOT NULL,
    -- [{"sku": "mug", "qty": 2}, ...]
    lines     jsonb       NOT NULL CHECK (jsonb_typeof(lines) = 'array'),
    placed_at timestamptz NOT NULL DEFAULT now()
);

-- Place an order and enqueue its order.placed event in one transaction:
-- both are committed or neither. Returns the order id.
CREATE FUNCTION shop.place_order(p_customer text, p_lines jsonb) RETURNS bigint
    LANGUAGE plpgsql
AS $$
DECLARE
    order_id bigint;
BEGIN
    INSERT INTO shop.orders (customer, lines) VALUES (p_customer, p_lines) RETURNING id INTO order_id;
    PERFORM outbox.enqueue(
        'order.placed',
        jsonb_build_object('order_id', order_id, 'customer', p_customer, 'lines', p_lines),
        -- Later events of the same order (order.paid, order.cancelled) reach
        -- the warehouse after this one.
        ordering_key => 'order:' || order_id);
    RETURN order_id;
END
$$;
