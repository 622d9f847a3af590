"""The purchases -> invoices + shipments worker with ONE group-aware transactional
producer per process (the KIP-447 draft's read-process-write loop).

    python -m demo.pipeline_group --bootstrap-servers H:P[,H:P] --transactional-id ID
        [--group-id G] [--input-topic purchases] [--status-file F] [--hold-open-after N]
        [--max-records 200] [--session-timeout-ms 6000] [--pause-ms 0]

The consumer's rebalance callback re-initialises the producer with the partitions
and the generation of each new assignment
(`producer.init_transactions_for_group(partitions, group_id, generation)`): the transaction
coordinator of the group then aborts and fences any open transaction of another
worker on those partitions and returns once it is complete, so a partition that moves
between workers is never processed by two of them at once. The producer is never
closed on a rebalance; the transactional.id only has to be unique per worker.
Each poll's records become one transaction with the consumer offsets. Runs until
SIGTERM/SIGINT; --hold-open-after N stays inside an open transaction after N items
(status "holding") so the worker can be SIGKILLed there.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import signal
import sys
import time

from exactly import Consumer, OffsetAndMetadata, Producer, TopicPartition, errors, rewind_to_committed

from .common import GROUP_ID, INVOICES, PURCHASES, SHIPMENTS, invoice_for, item_key, shipment_for
from .pipeline import _on_signal, _status, stopping


def run(args: argparse.Namespace) -> int:
    status_file = pathlib.Path(args.status_file) if args.status_file else None
    consumer = Consumer({"bootstrap.servers": args.bootstrap_servers, "group.id": args.group_id,
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": args.session_timeout_ms,
                         "heartbeat.interval.ms": max(args.session_timeout_ms // 5, 100)})
    producer = Producer({"bootstrap.servers": args.bootstrap_servers, "transactional.id": args.transactional_id,
                         "transaction.timeout.ms": 60000, "linger.ms": 5})

    initialised = {"generation": -1}

    def init(partitions: list[TopicPartition], generation: int) -> None:
        # KIP-447 draft: after every rebalance, with the new assignment and generation.
        # A failure (a newer rebalance already happened, a timeout) is retried from the
        # loop, which checks the generation before every transaction.
        try:
            producer.init_transactions_for_group(partitions, args.group_id, generation)
        except errors.ExactlyError as exc:
            print(f"pipeline: init_transactions_for_group(generation {generation}) failed: {exc!r}", file=sys.stderr)
            return
        initialised["generation"] = generation
        _status(status_file, state="running", copied=copied, generation=generation,
                partitions=sorted(tp.partition for tp in partitions))

    def on_assign(partitions: list[TopicPartition], generation: int) -> None:
        init(partitions, generation)

    copied = 0
    consumer.subscribe([args.input_topic], on_assign=on_assign)
    _status(status_file, state="running", copied=copied)
    try:
        while not stopping():
            batch = consumer.poll(timeout=0.5, max_records=args.max_records)
            if not batch:
                continue
            generation = consumer.group_metadata().generation_id
            if generation != initialised["generation"]:
                init(sorted(consumer.assignment()), generation)
                if generation != initialised["generation"]:
                    rewind_to_committed(consumer)
                    continue
            try:
                with producer.transaction():
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
            except errors.ExactlyError as exc:
                # Aborted (or fenced: another worker took these partitions over, and the
                # next rebalance re-initialises the producer). Read from the committed
                # offsets again.
                print(f"pipeline: transaction not committed: {exc!r}", file=sys.stderr)
                if exc.fatal and not isinstance(exc, errors.ProducerFencedError):
                    raise
                if isinstance(exc, (errors.ProducerFencedError, errors.IllegalGenerationError)):
                    initialised["generation"] = -1  # initialise again before the next transaction
                rewind_to_committed(consumer)
                continue
            copied += len(batch)
            _status(status_file, state="running", copied=copied, generation=initialised["generation"])
            if args.pause_ms:
                time.sleep(args.pause_ms / 1000)  # pacing, so tests can land faults mid-run
    finally:
        _status(status_file, state="stopped", copied=copied)
        producer.close()
        consumer.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.pipeline_group", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--transactional-id", required=True, help="unique per worker")
    parser.add_argument("--group-id", default=GROUP_ID)
    parser.add_argument("--input-topic", default=PURCHASES)
    parser.add_argument("--status-file")
    parser.add_argument("--hold-open-after", type=int)
    parser.add_argument("--max-records", type=int, default=200)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--pause-ms", type=int, default=0, help="pause after each committed transaction")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
