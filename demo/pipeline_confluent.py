"""The purchases -> invoices + shipments worker written with confluent-kafka
(librdkafka), talking to Exactly's Kafka protocol listeners: an unmodified Kafka
client doing consume-transform-produce with send_offsets_to_transaction.

    python -m demo.pipeline_confluent --bootstrap-servers KAFKA_H:P[,...] [--transactional-id ID]
        [--group-id G] [--status-file F] [--hold-open-after N] [--max-records 200]

The same flow and flags as demo.pipeline: each batch of consumed records becomes one
transaction with the consumer's offsets; an abortable error aborts and rewinds to the
committed offsets; a fatal error (fenced by a newer instance) exits.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import pathlib
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from .common import INVOICES, PURCHASES, SHIPMENTS, invoice_for, item_key, shipment_for
from .pipeline import _status, worker_arguments

_stop = False


def _on_signal(signum, frame) -> None:
    global _stop
    _stop = True


def rewind(consumer: Consumer) -> None:
    """After an abort, go back to the committed offsets (the beginning where none)."""
    parts = consumer.assignment()
    for tp in consumer.committed(parts, timeout=30):
        consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))


def run(args: argparse.Namespace) -> int:
    status_file = pathlib.Path(args.status_file) if args.status_file else None
    consumer = Consumer({"bootstrap.servers": args.bootstrap_servers, "group.id": args.group_id,
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": args.bootstrap_servers, "transactional.id": args.transactional_id,
                         "transaction.timeout.ms": 60000, "linger.ms": 5})
    consumer.subscribe([PURCHASES])
    producer.init_transactions(60)
    copied = 0
    _status(status_file, state="running", copied=copied)
    try:
        while not _stop:
            batch = [m for m in consumer.consume(num_messages=args.max_records, timeout=0.5) if m.error() is None]
            if not batch:
                continue
            producer.begin_transaction()
            try:
                offsets: dict[tuple[str, int], int] = {}
                for msg in batch:
                    purchase = json.loads(msg.value())
                    key = item_key(purchase).encode()
                    producer.produce(INVOICES, json.dumps(invoice_for(purchase)).encode(), key=key)
                    producer.produce(SHIPMENTS, json.dumps(shipment_for(purchase)).encode(), key=key)
                    offsets[(msg.topic(), msg.partition())] = msg.offset() + 1
                if args.hold_open_after is not None and copied >= args.hold_open_after:
                    producer.flush(60)
                    _status(status_file, state="holding", copied=copied, open_records=len(batch))
                    while True:  # inside an open transaction, until killed
                        time.sleep(1)
                producer.send_offsets_to_transaction([TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                                     consumer.consumer_group_metadata(), 60)
                producer.commit_transaction(60)
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal():
                    print(f"pipeline: fatal error {err}; exiting", file=sys.stderr)
                    return 3
                print(f"pipeline: aborting transaction after {err}", file=sys.stderr)
                producer.abort_transaction(60)
                rewind(consumer)
                continue
            copied += len(batch)
            _status(status_file, state="running", copied=copied)
    finally:
        _status(status_file, state="stopped", copied=copied)
        producer.flush(10)
        consumer.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = worker_arguments("python -m demo.pipeline_confluent", __doc__, argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
