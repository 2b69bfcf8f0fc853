-- The ledger of the ledger-sms example: the application's own tables, and
-- the one function its API calls to post a deposit. The outbox is installed
-- beside it by `outboxd migrate` (schema "outbox").
--
--     psql -1 -v ON_ERROR_STOP=1 -f examples/ledger-sms/ledger.sql

CREATE SCHEMA ledger;

CREATE TABLE ledger.accounts (
    id            bigint PRIMARY KEY,
    holder        text   NOT NULL,
    phone         text   NOT NULL,
    balance_cents bigint NOT NULL DEFAULT 0
);

CREATE TABLE ledger.deposits (
    -- Chosen by the client and sent again when it retries the request (a
    -- timeout, a lost answer): the primary key is what makes a retried
    -- request post nothing twice.
    deposit_id   text        PRIMARY KEY,
    account_id   bigint      NOT NULL REFERENCES ledger.accounts,
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    posted_at    timestamptz NOT NULL DEFAULT now(),
    -- The outbox event of the deposit's SMS, so a retried request gets the
    -- first request's answer.
    sms_event_id bigint
);

-- Post a deposit and enqueue its SMS in one transaction: both happen or
-- neither. Returns the SMS event's id, the same one when the request is
-- repeated with the same deposit_id (then nothing else happens).
CREATE FUNCTION ledger.post_deposit(p_deposit_id text, p_account_id bigint, p_amount_cents bigint)
    RETURNS bigint
    LANGUAGE plpgsql
AS $$
DECLARE
    account ledger.accounts;
    event_id bigint;
BEGIN
    -- A concurrent request with the same deposit_id waits here for our
    -- commit, then finds the row and takes the branch below.
    INSERT INTO ledger.deposits (deposit_id, account_id, amount_cents)
    VALUES (p_deposit_id, p_account_id, p_amount_cents)
    ON CONFLICT (deposit_id) DO NOTHING;
    IF NOT FOUND THEN
        SELECT d.sms_event_id INTO event_id FROM ledger.deposits d WHERE d.deposit_id = p_deposit_id;
        RETURN event_id;
    END IF;

    UPDATE ledger.accounts SET balance_cents = balance_cents + p_amount_cents
    WHERE id = p_account_id
    RETURNING * INTO account;

    event_id := outbox.enqueue(
        'sms.deposit',
        jsonb_build_object(
            'deposit_id', p_deposit_id,
            'to', account.phone,
            'text', format('Hi %s, %s.%s was credited to your account. Balance: %s.%s.',
                           account.holder,
                           p_amount_cents / 100, lpad((p_amount_cents % 100)::text, 2, '0'),
                           account.balance_cents / 100, lpad((account.balance_cents % 100)::text, 2, '0'))),
        -- One account's texts arrive in the order they were posted, so the
        -- last balance a customer reads is the newest.
        ordering_key => 'account:' || p_account_id,
        -- The event itself is idempotent too: enqueueing it again with the
        -- same key returns this event's id and inserts nothing.
        idempotency_key => p_deposit_id);

    UPDATE ledger.deposits SET sms_event_id = event_id WHERE deposit_id = p_deposit_id;
    RETURN event_id;
END
$$;
