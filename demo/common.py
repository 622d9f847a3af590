"""Shared pieces of the purchases demo: the CSV, record shapes and a reader."""
from __future__ import annotations

import csv
import json
import pathlib
from decimal import Decimal

from exactly import Consumer, TopicPartition

ROOT = pathlib.Path(__file__).resolve().parent.parent
ORDER_ITEMS = ROOT / "data" / "olist" / "order_items.csv"

PURCHASES, INVOICES, SHIPMENTS = "purchases", "invoices", "shipments"
GROUP_ID = "purchases-pipeline"
TRANSACTIONAL_ID = "purchases-pipeline-0"


def read_order_items(path: pathlib.Path = ORDER_ITEMS) -> list[dict[str, str]]:
    """Rows of order_items.csv as dicts (strings as in the file)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def item_key(row: dict) -> str:
    """The key of a purchased item: "order_id:order_item_id"."""
    return f"{row['order_id']}:{row['order_item_id']}"


def invoice_for(purchase: dict) -> dict:
    """One invoice per purchased item; total = price + freight (exact decimals)."""
    total = Decimal(purchase["price"]) + Decimal(purchase["freight_value"])
    return {"order_id": purchase["order_id"], "order_item_id": purchase["order_item_id"],
            "seller_id": purchase["seller_id"], "price": purchase["price"],
            "freight_value": purchase["freight_value"], "total": str(total)}


def shipment_for(purchase: dict) -> dict:
    """One shipment per purchased item."""
    return {"order_id": purchase["order_id"], "order_item_id": purchase["order_item_id"],
            "product_id": purchase["product_id"], "seller_id": purchase["seller_id"],
            "ship_by": purchase["shipping_limit_date"]}


def read_topic(bootstrap: str, topic: str, isolation_level: str, timeout_s: float = 120.0) -> list:
    """Every record of `topic` up to its current end (the LSO under read_committed),
    read from the beginning without a group. Returns list[ConsumerRecord]."""
    import time
    c = Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation_level,
                  "enable.auto.commit": False})
    try:
        parts = [TopicPartition(topic, p) for p in range(_partition_count(c, bootstrap, topic))]
        c.assign(parts)
        c.seek_to_end(parts)
        ends = {tp: c.position(tp) for tp in parts}
        c.seek_to_beginning(parts)
        out = []
        deadline = time.monotonic() + timeout_s
        while any(c.position(tp) < ends[tp] for tp in parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end in {timeout_s:.0f} s")
            out.extend(c.poll(timeout=1.0))
        return out
    finally:
        c.close()


def _partition_count(consumer, bootstrap: str, topic: str) -> int:
    from exactly import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        return len(admin.list_topics()[topic])
    finally:
        admin.close()


def loads(value: bytes) -> dict:
    return json.loads(value)
