"""Producer and consumer throughput runs, like kafka-producer-perf-test /
kafka-consumer-perf-test: one SDK producer sending as fast as it can to one
partition (plain: acks=1 without idempotence; idempotent: acks=all; transactional:
a commit every `commit_interval_ms`), one consumer reading a partition back, and the
same records through confluent-kafka (librdkafka) on the Kafka protocol listener.
Used by the suite (`python -m bench`, bench/suite.py)."""
from __future__ import annotations

import os
import time

from exactly import Consumer, Producer, TopicPartition

from .common import percentile


# Send latency is sampled on one record in 16 (a done-callback on every record costs
# the loop more than the peers' loops pay: the Redis pipeline keeps no per-command
# callback), so the throughput figure measures the producer, not the bookkeeping.
LATENCY_SAMPLE_MASK = 15


def produce_run(bootstrap: str, topic: str, mode: str, n: int, size: int, commit_interval_ms: int = 0,
                security: dict | None = None, on_started=None) -> dict:
    """Send `n` records of `size` bytes to partition 0 of `topic`; records/s from the
    first send to the last acknowledgement (flush). Send latency (p50_ms, p99_ms) from
    one record in 16; `acknowledged` counts the sampled records acknowledged.
    `on_started`: called once the producer is ready (the profiler attaches then)."""
    conf = {"bootstrap.servers": bootstrap, **(security or {}), "linger.ms": 5, "batch.size": 262144}
    if mode == "plain":
        conf.update({"enable.idempotence": False, "acks": 1})
    elif mode == "idempotent":
        conf.update({"enable.idempotence": True, "acks": "all"})
    else:
        conf.update({"transactional.id": f"bench-{os.getpid()}-{time.time_ns()}", "acks": "all"})
    producer = Producer(conf)
    payload = os.urandom(size // 2 + 1).hex().encode()[:size]
    latencies: list[float] = []
    transactional = mode == "transactional"
    if transactional:
        producer.init_transactions()
    if on_started is not None:
        on_started()
    if transactional:
        producer.begin_transaction()
    commits = 0
    start = time.perf_counter()
    last_commit = start
    for i in range(n):
        if i & LATENCY_SAMPLE_MASK:
            producer.send(topic, payload, partition=0)
        else:
            t0 = time.perf_counter()
            fut = producer.send(topic, payload, partition=0)
            fut.add_done_callback(lambda _f, t0=t0: latencies.append(time.perf_counter() - t0))
        if transactional and (i & 63) == 0:
            now = time.perf_counter()
            if (now - last_commit) * 1000 >= commit_interval_ms:
                producer.commit_transaction()
                commits += 1
                producer.begin_transaction()
                last_commit = now
    if transactional:
        producer.commit_transaction()
        commits += 1
    producer.flush()
    elapsed = time.perf_counter() - start
    producer.close()
    latencies.sort()
    return {"mode": mode, "records": n, "acknowledged": len(latencies), "seconds": elapsed,
            "records_per_s": n / elapsed, "mb_per_s": n * size / elapsed / 1e6,
            "p50_ms": percentile(latencies, 0.5) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000,
            "commits": commits}


def consume_run(bootstrap: str, topic: str, isolation: str, expected: int) -> dict:
    """Read partition 0 of `topic` from the beginning until `expected` records came."""
    c = Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation, "enable.auto.commit": False,
                  "max.poll.records": 5000})
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning([tp])
    got = 0
    start = time.perf_counter()
    while got < expected:
        got += len(c.poll(timeout=1.0))
        if time.perf_counter() - start > 300:
            break
    elapsed = time.perf_counter() - start
    c.close()
    return {"isolation.level": isolation, "records": got, "seconds": elapsed, "records_per_s": got / elapsed}


def kafka_produce_run(kafka_bootstrap: str, topic: str, n: int, size: int) -> dict:
    """confluent-kafka (librdkafka) producing `n` records of `size` bytes through the
    Kafka protocol listener, acks=1, no idempotence: records/s from the first send to
    the last delivery report."""
    from confluent_kafka import Producer as KafkaProducer
    p = KafkaProducer({"bootstrap.servers": kafka_bootstrap, "acks": 1, "enable.idempotence": False,
                       "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
    value = os.urandom(size)
    delivered = [0]

    def done(err, msg):
        if err is None:
            delivered[0] += 1
    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value, partition=0, on_delivery=done)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(300)
    elapsed = time.perf_counter() - start
    return {"records": delivered[0], "seconds": elapsed, "records_per_s": delivered[0] / elapsed,
            "mb_per_s": delivered[0] * size / elapsed / 1e6}
