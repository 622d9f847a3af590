"""A transactional message copier for the transactions system test (in the spirit
of Kafka's TransactionalMessageCopier): consume one input partition
(read_committed), copy every record to the output topic and commit the consumed
offsets in the same transaction (send_offsets_to_transaction; design doc
"Consume-transform-produce"). About one transaction in three is aborted on purpose
after its records and offsets were sent; the copier then rewinds to the last
committed offset and copies the same records again.

    python tests/system/copier.py --bootstrap-servers H:P[,H:P] --transactional-id ID
        --group-id G --input-topic IN --input-partition P --output-topic OUT
        --end-offset N --status-file F [--gate-file G] [--transaction-size 300]
        [--abort-every 3] [--max-rate RECORDS_PER_S] [--client-config FILE]

Starts from the group's committed offset of the input partition (so a restarted
copier with the same transactional.id resumes where the last committed transaction
ended; init_transactions fences and aborts whatever its predecessor left open) and
exits 0 once the committed offset reaches --end-offset. --gate-file, when given,
holds {"fraction": f}: the copier does not consume past ceil(f * end offset), so a
test can pace the copy against its fault schedule; --max-rate caps the records sent
per second (aborted ones included) by pausing inside the transactions, between
sends, so that a fault most likely lands in an open transaction with records in the
log. --client-config names a JSON file of further SDK settings of both clients (a
secured cluster's security.protocol, certificates, SASL user).
SIGTERM/SIGINT: finish (commit or
abort) the current transaction, then exit 0. The status file (JSON, replaced
atomically) has state, position (committed offset), end, committed and aborted
transaction counts, the pid, and max_commit_gap_s: the longest time (s) the copier
went without a commit while it had input to copy (from the start of its first
transaction, or from the moment the gate let it consume again, to the next commit).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import signal
import sys
import time

from exactly import Consumer, OffsetAndMetadata, Producer, TopicPartition, errors

_stop = False
PACE_EVERY = 50  # records sent between two pauses of the pacer


def _on_signal(signum, frame) -> None:
    global _stop
    _stop = True


class Status:
    """The status file the test reads."""

    def __init__(self, path: pathlib.Path, end: int):
        self.path = path
        self.fields = {"state": "starting", "position": 0, "end": end, "committed_txns": 0,
                       "aborted_txns": 0, "failed_txns": 0, "pid": os.getpid(), "max_commit_gap_s": 0.0}

    def update(self, **fields) -> None:
        self.fields.update(fields)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.fields))
        tmp.replace(self.path)


def gate_limit(gate_file: pathlib.Path | None, end: int) -> int:
    """The offset the copier may consume up to (exclusive)."""
    if gate_file is None:
        return end
    try:
        fraction = float(json.loads(gate_file.read_text())["fraction"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError, ValueError):
        return 0
    return min(end, math.ceil(fraction * end))


def retry_until(fn, what: str, timeout_s: float = 180.0):
    """Call `fn` until it does not raise a timeout (the cluster may be failing over)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except errors.KafkaTimeoutError as exc:
            if time.monotonic() > deadline:
                raise
            print(f"copier: {what} timed out ({exc}); retrying", file=sys.stderr, flush=True)


def committed_position(consumer: Consumer, tp: TopicPartition) -> int:
    def fetch() -> int:
        om = consumer.committed([tp], timeout=30).get(tp)
        return om.offset if om is not None else 0
    deadline = time.monotonic() + 180
    while True:
        try:
            return fetch()
        except errors.ExactlyError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def poll_batch(consumer: Consumer, want: int) -> list:
    """Up to `want` consecutive records; returns what arrived once no more come for
    a short while (the input is complete before the copy starts)."""
    out: list = []
    idle_until = time.monotonic() + 2.0
    while len(out) < want and not _stop:
        got = consumer.poll(timeout=0.2, max_records=want - len(out))
        if got:
            out += got
            idle_until = time.monotonic() + 0.3
        elif out and time.monotonic() > idle_until:
            break
        elif not out and time.monotonic() > idle_until + 30:
            break
    return out


class Pacer:
    """Sleeps between sends so that records sent stay under `rate` per second."""

    def __init__(self, rate: float):
        self.rate = rate
        self.started = time.monotonic()
        self.sent = 0

    def wait(self) -> None:
        if self.rate <= 0:
            return
        ahead = self.sent / self.rate - (time.monotonic() - self.started)
        while ahead > 0 and not _stop:
            time.sleep(min(ahead, 0.1))
            ahead -= 0.1

    def record(self, n: int) -> None:
        self.sent += n


def abort(producer: Producer) -> None:
    retry_until(lambda: producer.abort_transaction(30), "abort_transaction")


def run(args: argparse.Namespace) -> int:
    tp = TopicPartition(args.input_topic, args.input_partition)
    status = Status(pathlib.Path(args.status_file), args.end_offset)
    gate_file = pathlib.Path(args.gate_file) if args.gate_file else None
    extra = json.loads(pathlib.Path(args.client_config).read_text()) if args.client_config else {}
    consumer = Consumer({**extra, "bootstrap.servers": args.bootstrap_servers, "group.id": args.group_id,
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100,
                         "max.poll.records": args.transaction_size, "request.timeout.ms": 10000})
    producer = Producer({**extra, "bootstrap.servers": args.bootstrap_servers,
                         "transactional.id": args.transactional_id,
                         "transaction.timeout.ms": 30000, "linger.ms": 5, "request.timeout.ms": 10000,
                         "max.block.ms": 60000})
    try:
        consumer.assign([tp])
        retry_until(lambda: producer.init_transactions(60), "init_transactions")
        position = committed_position(consumer, tp)
        consumer.seek(tp, position)
        status.update(state="running", position=position)
        txn_index = 0
        pacer = Pacer(args.max_rate)
        waiting_since = time.monotonic()  # since when the copier had input and no commit
        while position < args.end_offset and not _stop:
            limit = gate_limit(gate_file, args.end_offset)
            if position >= limit:
                time.sleep(0.05)
                waiting_since = time.monotonic()  # held by the gate: not a stall
                continue
            batch = poll_batch(consumer, min(args.transaction_size, limit - position))
            if not batch:
                continue
            if batch[0].offset != position:
                raise RuntimeError(f"expected offset {position}, polled {batch[0].offset}")
            abort_on_purpose = args.abort_every > 0 and txn_index % args.abort_every == args.abort_every - 1
            txn_index += 1
            producer.begin_transaction()
            try:
                for i, rec in enumerate(batch, 1):
                    producer.send(args.output_topic, rec.value, key=rec.key)
                    pacer.record(1)
                    if i % PACE_EVERY == 0:
                        producer.flush(60)  # records of the open transaction reach the log
                        pacer.wait()
                next_offset = batch[-1].offset + 1
                producer.send_offsets_to_transaction({tp: OffsetAndMetadata(next_offset)},
                                                     consumer.group_metadata(), timeout=60)
                if abort_on_purpose:
                    producer.flush(60)
                    abort(producer)
                    consumer.seek(tp, position)
                    status.update(aborted_txns=status.fields["aborted_txns"] + 1)
                    continue
                retry_until(lambda: producer.commit_transaction(60), "commit_transaction")
            except errors.ProducerFencedError:
                print("copier: fenced by a newer instance; exiting", file=sys.stderr, flush=True)
                status.update(state="fenced")
                return 3
            except errors.ExactlyError as exc:
                if not _abortable(exc):
                    raise
                print(f"copier: aborting after {exc!r}", file=sys.stderr, flush=True)
                abort(producer)
                consumer.seek(tp, position)
                status.update(failed_txns=status.fields["failed_txns"] + 1)
                continue
            position = next_offset
            now = time.monotonic()
            gap = max(status.fields["max_commit_gap_s"], round(now - waiting_since, 3))
            waiting_since = now
            status.update(position=position, committed_txns=status.fields["committed_txns"] + 1,
                          max_commit_gap_s=gap)
        status.update(state="done" if position >= args.end_offset else "stopped")
        return 0
    finally:
        producer.close(30)
        consumer.close()


def _abortable(exc: errors.ExactlyError) -> bool:
    """Errors after which the transaction can be aborted and retried: retriable
    ones, timeouts, and abortable transaction errors (not fatal ones)."""
    fatal = (errors.ProducerFencedError, errors.IllegalStateError)
    return not isinstance(exc, fatal)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--group-id", required=True)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--input-partition", type=int, required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--end-offset", type=int, required=True)
    parser.add_argument("--status-file", required=True)
    parser.add_argument("--gate-file")
    parser.add_argument("--transaction-size", type=int, default=300)
    parser.add_argument("--abort-every", type=int, default=3, help="abort every Nth transaction on purpose (0: never)")
    parser.add_argument("--max-rate", type=float, default=0, help="records sent per second at most (0: no cap)")
    parser.add_argument("--client-config", help="JSON file of further SDK settings (security)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
