"""The purchases -> invoices + shipments worker of demo.pipeline, written with exactly.aio.

    python -m demo.pipeline_aio --bootstrap-servers H:P[,H:P] [--transactional-id ID]
        [--group-id G] [--status-file F] [--hold-open-after N] [--max-records 200]

Same contract as demo.pipeline: a read_committed AIOConsumer; each poll's records
become one transaction (`async with producer.transaction()`) holding an invoice and
a shipment per purchased item plus the consumer offsets
(send_offsets_to_transaction), so the output holds every input exactly once across
crashes (design doc "Consume-transform-produce"). --hold-open-after N: once N items
are copied, send and flush one more batch, report "holding" in the status file and
wait inside the open transaction until killed. Runs until SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import signal
import sys

from exactly import OffsetAndMetadata, TopicPartition, errors
from exactly.aio import AIOConsumer, AIOProducer
from exactly.consumer import seek_to_committed

from .common import INVOICES, PURCHASES, SHIPMENTS, invoice_for, item_key, shipment_for
from .pipeline import _status, worker_arguments, worker_confs


async def _rewind(consumer: AIOConsumer) -> None:
    """After an abort, go back to the last committed offsets so nothing is skipped."""
    parts = list(consumer.assignment())
    seek_to_committed(consumer, parts, await consumer.committed(parts))


async def run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    status_file = pathlib.Path(args.status_file) if args.status_file else None
    consumer_conf, producer_conf = worker_confs(args)
    consumer = AIOConsumer(consumer_conf)
    producer = AIOProducer(producer_conf)
    await consumer.subscribe([PURCHASES])
    await producer.init_transactions()
    copied = 0
    _status(status_file, state="running", copied=copied)
    try:
        while not stop.is_set():
            batch = await consumer.poll(timeout=0.5, max_records=args.max_records)
            if not batch:
                continue
            try:
                async with producer.transaction():
                    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
                    deliveries = []
                    for rec in batch:
                        purchase = json.loads(rec.value)
                        key = item_key(purchase).encode()
                        deliveries.append(producer.send_nowait(INVOICES, json.dumps(invoice_for(purchase)).encode(),
                                                               key=key))
                        deliveries.append(producer.send_nowait(SHIPMENTS,
                                                               json.dumps(shipment_for(purchase)).encode(), key=key))
                        offsets[TopicPartition(rec.topic, rec.partition)] = OffsetAndMetadata(rec.offset + 1)
                    if args.hold_open_after is not None and copied >= args.hold_open_after:
                        await producer.flush()
                        _status(status_file, state="holding", copied=copied, open_records=len(batch))
                        await asyncio.Event().wait()  # inside an open transaction, until killed
                    await producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
                    await asyncio.gather(*deliveries)
            except errors.ProducerFencedError:
                print("pipeline_aio: fenced by a newer instance; exiting", file=sys.stderr)
                return 3
            except errors.ExactlyError as exc:
                if isinstance(exc, errors.IllegalStateError):
                    raise
                print(f"pipeline_aio: transaction aborted after {exc!r}", file=sys.stderr)
                await _rewind(consumer)
                continue
            copied += len(batch)
            _status(status_file, state="running", copied=copied)
    finally:
        _status(status_file, state="stopped", copied=copied)
        await producer.close()
        await consumer.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(worker_arguments("python -m demo.pipeline_aio", __doc__, argv)))


if __name__ == "__main__":
    sys.exit(main())
