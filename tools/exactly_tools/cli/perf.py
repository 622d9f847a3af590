"""`exactly perf produce|consume`: throughput and latency tests in the manner of
kafka-producer-perf-test and kafka-consumer-perf-test."""
from __future__ import annotations

import json
import os
import threading
import time

import click

from exactly import Consumer, Producer, TopicPartition

from .common import connection_options, options, parse_key_values, progress
from .clients import _check_topic

REPORT_INTERVAL_S = 5.0


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ascending values (nearest rank); 0 for none."""
    if not sorted_values:
        return 0.0
    i = min(int(q * len(sorted_values)), len(sorted_values) - 1)
    return sorted_values[i]


@click.group()
def perf() -> None:
    """Measure producer and consumer throughput against a live cluster."""


@perf.command("produce")
@click.option("--topic", required=True)
@click.option("--num-records", type=click.IntRange(min=1), required=True)
@click.option("--record-size", type=click.IntRange(min=0), default=100, show_default=True, help="Value bytes.")
@click.option("--throughput", type=int, default=-1, show_default=True,
              help="Records/s to aim for; -1: as fast as possible.")
@click.option("--transactional-id", metavar="ID", help="Send in transactions of --transaction-size records.")
@click.option("--transaction-size", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--producer-props", "props", multiple=True, metavar="KEY=VALUE",
              help="Producer config (repeatable), e.g. acks=1 linger.ms=10.")
@connection_options
def produce(topic: str, num_records: int, record_size: int, throughput: int, transactional_id: str | None,
            transaction_size: int, props: tuple[str, ...]) -> None:
    """Send --num-records records of --record-size bytes and report records/s, MB/s
    and send-to-acknowledgement latency percentiles (ms); progress every 5 s on stderr."""
    _check_topic(topic)
    extra = parse_key_values(props, "--producer-props")
    if transactional_id:
        extra["transactional.id"] = transactional_id
    producer = Producer(options().conf("producer", extra))
    payload = os.urandom(record_size)
    latencies: list[float] = []
    lock = threading.Lock()
    window = {"n": 0, "bytes": 0, "lat": 0.0, "max": 0.0, "start": time.monotonic()}
    errors_seen: list[BaseException] = []

    def _done(fut, sent_at: float) -> None:
        if fut.exception() is not None:
            errors_seen.append(fut.exception())
            return
        ms = (time.monotonic() - sent_at) * 1000
        with lock:
            latencies.append(ms)
            window["n"] += 1
            window["bytes"] += record_size
            window["lat"] += ms
            window["max"] = max(window["max"], ms)

    start = time.monotonic()
    try:
        if transactional_id:
            producer.init_transactions()
        for i in range(num_records):
            if errors_seen:
                raise errors_seen[0]
            if transactional_id and i % transaction_size == 0:
                if i:
                    producer.commit_transaction()
                producer.begin_transaction()
            if throughput > 0:
                ahead = i / throughput - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
            sent_at = time.monotonic()
            producer.send(topic, value=payload).add_done_callback(lambda f, t=sent_at: _done(f, t))
            _report(window, lock)
        if transactional_id:
            producer.commit_transaction()
        producer.flush()
    finally:
        producer.close()
    if errors_seen:
        raise errors_seen[0]
    elapsed = time.monotonic() - start
    lat = sorted(latencies)
    result = {"records": num_records, "elapsed_s": round(elapsed, 3),
              "records_per_s": round(num_records / elapsed, 1),
              "mb_per_s": round(num_records * record_size / elapsed / 1048576, 3),
              "avg_latency_ms": round(sum(lat) / len(lat), 2) if lat else 0.0,
              "max_latency_ms": round(lat[-1], 2) if lat else 0.0,
              **{f"p{k}_ms": round(percentile(lat, q), 2) for k, q in (("50", .5), ("95", .95), ("99", .99),
                                                                       ("99_9", .999))}}
    if options().as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"{num_records} records sent, {result['records_per_s']} records/sec ({result['mb_per_s']} MB/sec), "
                   f"{result['avg_latency_ms']} ms avg latency, {result['max_latency_ms']} ms max latency, "
                   f"{result['p50_ms']} ms 50th, {result['p95_ms']} ms 95th, {result['p99_ms']} ms 99th, "
                   f"{result['p99_9_ms']} ms 99.9th.")


def _report(window: dict, lock: threading.Lock) -> None:
    now = time.monotonic()
    if now - window["start"] < REPORT_INTERVAL_S:
        return
    with lock:
        n, b, lat, mx, t0 = window["n"], window["bytes"], window["lat"], window["max"], window["start"]
        window.update(n=0, bytes=0, lat=0.0, max=0.0, start=now)
    secs = now - t0
    progress(f"{n} records sent, {n / secs:.1f} records/sec ({b / secs / 1048576:.2f} MB/sec), "
             f"{lat / n if n else 0:.1f} ms avg latency, {mx:.1f} ms max latency.")


@perf.command("consume")
@click.option("--topic", required=True)
@click.option("--messages", type=click.IntRange(min=1), required=True, help="Records to read.")
@click.option("--group", metavar="GROUP", help="Read as a group member (default: assign every partition).")
@click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]),
              default="read_uncommitted", show_default=True)
@click.option("--timeout-ms", type=click.IntRange(min=1), default=10000, show_default=True,
              help="Give up when no record arrived for this many ms.")
@connection_options
def consume(topic: str, messages: int, group: str | None, isolation_level: str, timeout_ms: int) -> None:
    """Read --messages records from the log start and report records/s and MB/s;
    progress every 5 s on stderr."""
    parts = _check_topic(topic)
    extra = {"isolation.level": isolation_level, "auto.offset.reset": "earliest"}
    if group:
        extra.update({"group.id": group, "enable.auto.commit": "false"})
    consumer = Consumer(options().conf("consumer", extra))
    n = nbytes = 0
    start = last_report = idle = time.monotonic()
    last_n = 0
    try:
        if group:
            consumer.subscribe([topic])
        else:
            tps = [TopicPartition(topic, p) for p in parts]
            consumer.assign(tps)
            consumer.seek_to_beginning(tps)
        while n < messages:
            batch = consumer.poll(0.2, max_records=messages - n)
            now = time.monotonic()
            if batch:
                idle = now
                n += len(batch)
                nbytes += sum(len(r.value or b"") + len(r.key or b"") for r in batch)
            elif (now - idle) * 1000 >= timeout_ms:
                break
            if now - last_report >= REPORT_INTERVAL_S:
                progress(f"{n} records read, {(n - last_n) / (now - last_report):.1f} records/sec")
                last_report, last_n = now, n
    finally:
        consumer.close()
    elapsed = max(time.monotonic() - start, 1e-9)
    result = {"records": n, "elapsed_s": round(elapsed, 3), "records_per_s": round(n / elapsed, 1),
              "mb": round(nbytes / 1048576, 3), "mb_per_s": round(nbytes / elapsed / 1048576, 3),
              "complete": n >= messages}
    if options().as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"{n} records read in {result['elapsed_s']} s, {result['records_per_s']} records/sec, "
                   f"{result['mb']} MB, {result['mb_per_s']} MB/sec.")
    if n < messages:
        raise click.ClickException(f"only {n} of {messages} records arrived within {timeout_ms} ms of idleness")
