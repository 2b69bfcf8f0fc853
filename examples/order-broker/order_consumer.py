#!/usr/bin/python3
"""The billing service: a consumer of the ORDERS stream, the reading side of
the order-broker example.

It reads with a durable pull consumer ("billing"): JetStream remembers what
it acknowledged, so a restarted consumer goes on where it stopped. For each
message, in stream order:
  1. a Nats-Msg-Id it has processed before (a redelivery) is acknowledged
     and skipped;
  2. an order's events must come in their order, OrderCreated then
     OrderPaid: one that does not (an OrderCreated twice, an OrderPaid
     first) is recorded as out_of_order;
  3. then it is applied, recorded and acknowledged.
It drains what is in the stream now and exits. Its state (the processed ids
and each order's events) is a JSON file here; a real service keeps it in its
own database, in the transaction of its change (see the inbox in
examples/order-webhook).

Each message is logged as one JSON line to --log (result: applied,
duplicate, out_of_order).

    order_consumer.py --nats-url nats://127.0.0.1:4222 --state billing.json --log billing.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from nats_client import Client, NatsError

STREAM = "ORDERS"
EVENT_ORDER = ["OrderCreated", "OrderPaid"]   # the events of one order, in their order


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nats-url", required=True)
    p.add_argument("--durable", default="billing")
    p.add_argument("--state", required=True, help="JSON: processed message ids, each order's events")
    p.add_argument("--log", required=True, help="JSON lines, one per message")
    args = p.parse_args()

    state_path = Path(args.state)
    state = json.loads(state_path.read_text()) if state_path.exists() else {"seen": [], "orders": {}}
    seen = set(state["seen"])
    orders: dict = state["orders"]   # order id -> its event types, as received
    client = Client(args.nats_url)
    processed = 0
    try:
        with open(args.log, "a") as log:
            while batch := client.fetch(STREAM, args.durable, batch=100):
                for m in batch:
                    msg_id = m.headers["Nats-Msg-Id"]
                    event = json.loads(m.data)
                    order = orders.setdefault(event["order_id"], [])
                    if msg_id in seen:
                        result = "duplicate"
                    else:
                        # The next event of this order must be the next in EVENT_ORDER.
                        expected = EVENT_ORDER[len(order)] if len(order) < len(EVENT_ORDER) else None
                        result = "applied" if event["type"] == expected else "out_of_order"
                        order.append(event["type"])
                        seen.add(msg_id)
                    log.write(json.dumps({"stream_seq": m.stream_seq, "delivered": m.delivered,
                                          "msg_id": msg_id, "order_id": event["order_id"],
                                          "type": event["type"], "ordering_key":
                                          m.headers.get("outbox-ordering-key"), "result": result,
                                          "pid": os.getpid()}) + "\n")
                    log.flush()
                    # Recorded before the ack: a crash in between makes a
                    # redelivery, which step 1 recognises.
                    state_path.write_text(json.dumps({"seen": sorted(seen), "orders": orders}))
                    client.ack(m)
                    processed += 1
    except NatsError as e:
        print(f"order_consumer.py: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"billing: {processed} messages processed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
