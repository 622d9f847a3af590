"""The purchases -> invoices + shipments consume-transform-produce worker.

    python -m demo.pipeline --bootstrap-servers H:P[,H:P] [--transactional-id ID]
        [--group-id G] [--status-file F] [--hold-open-after N] [--max-records 200]

Each poll's records become one transaction: an invoice and a shipment per purchased
item, plus the consumer offsets (send_offsets_to_transaction), committed atomically
(design doc "Consume-transform-produce"). --hold-open-after N makes the worker, once
it has copied N items, send and flush one more batch, report "holding" in the
status file and wait there inside the open transaction (so it can be SIGKILLed
with transactional data already in the log). Runs until SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import signal
import sys
import time

from exactly import Consumer, OffsetAndMetadata, Producer, TopicPartition, errors, rewind_to_committed

from .common import (GROUP_ID, INVOICES, PURCHASES, SHIPMENTS, TRANSACTIONAL_ID, invoice_for, item_key,
                     shipment_for)

_stop = False


def _on_signal(signum, frame) -> None:
    global _stop
    _stop = True


def stopping() -> bool:
    """Whether SIGTERM or SIGINT asked the worker to stop."""
    return _stop


def _status(path: pathlib.Path | None, **fields) -> None:
    if path is not None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(fields))
        tmp.replace(path)




def run(args: argparse.Namespace) -> int:
    status_file = pathlib.Path(args.status_file) if args.status_file else None
    consumer_conf, producer_conf = worker_confs(args)
    consumer = Consumer(consumer_conf)
    producer = Producer(producer_conf)
    consumer.subscribe([PURCHASES])
    producer.init_transactions()
    copied = 0
    _status(status_file, state="running", copied=copied)
    try:
        while not _stop:
            batch = consumer.poll(timeout=0.5, max_records=args.max_records)
            if not batch:
                continue
            producer.begin_transaction()
            try:
                offsets: dict[TopicPartition, OffsetAndMetadata] = {}
                for rec in batch:
                    purchase = json.loads(rec.value)
                    key = item_key(purchase).encode()
                    producer.send(INVOICES, json.dumps(invoice_for(purchase)).encode(), key=key)
                    producer.send(SHIPMENTS, json.dumps(shipment_for(purchase)).encode(), key=key)
                    offsets[TopicPartition(rec.topic, rec.partition)] = OffsetAndMetadata(rec.offset + 1)
                if args.hold_open_after is not None and copied >= args.hold_open_after:
                    producer.flush()
                    _status(status_file, state="holding", copied=copied, open_records=len(batch))
                    while True:  # inside an open transaction, until killed
                        time.sleep(1)
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
                producer.commit_transaction()
            except errors.ProducerFencedError:
                print("pipeline: fenced by a newer instance; exiting", file=sys.stderr)
                return 3
            except errors.ExactlyError as exc:
                if isinstance(exc, (errors.IllegalStateError,)):
                    raise
                print(f"pipeline: aborting transaction after {exc!r}", file=sys.stderr)
                producer.abort_transaction()
                rewind_to_committed(consumer)  # after an abort, nothing is skipped
                continue
            copied += len(batch)
            _status(status_file, state="running", copied=copied)
    finally:
        _status(status_file, state="stopped", copied=copied)
        producer.close()
        consumer.close()
    return 0


def worker_confs(args: argparse.Namespace) -> tuple[dict, dict]:
    """(consumer, producer) settings of a worker: a read_committed consumer without
    auto commit, a transactional producer."""
    extra = json.loads(pathlib.Path(args.client_config).read_text()) if args.client_config else {}
    return ({"bootstrap.servers": args.bootstrap_servers, **extra, "group.id": args.group_id,
             "isolation.level": "read_committed", "enable.auto.commit": False, "auto.offset.reset": "earliest"},
            {"bootstrap.servers": args.bootstrap_servers, **extra, "transactional.id": args.transactional_id,
             "transaction.timeout.ms": 60000, "linger.ms": 5})


def worker_arguments(prog: str, doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line of a pipeline worker (see the module docstring)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--transactional-id", default=TRANSACTIONAL_ID)
    parser.add_argument("--group-id", default=GROUP_ID)
    parser.add_argument("--status-file")
    parser.add_argument("--hold-open-after", type=int)
    parser.add_argument("--max-records", type=int, default=200)
    parser.add_argument("--client-config", help="JSON file of extra client settings (TLS, SASL)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = worker_arguments("python -m demo.pipeline", __doc__, argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
