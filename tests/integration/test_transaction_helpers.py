"""`Producer.transaction()` and `Producer.run_in_transaction()` on a real cluster,
with injected abortable and fatal errors. KIP-98 design document, "Transactional
Producer": Error Handling."""
from __future__ import annotations

import json

import pytest

from exactly import Consumer, OffsetAndMetadata, Producer, TopicPartition, errors

from .test_producer import _name, create_topic, producer, read_all

pytestmark = pytest.mark.integration


def test_transaction_block_commits_on_exit_and_aborts_on_error(cluster):
    topic = create_topic(cluster, 2)
    p = producer(cluster, **{"transactional.id": _name("tx")})
    try:
        p.init_transactions()
        with p.transaction():
            for i in range(3):
                p.send(topic, f"kept-{i}".encode(), key=b"k")
        with pytest.raises(RuntimeError, match="application bug"):
            with p.transaction():
                p.send(topic, b"dropped-0", key=b"k")
                p.flush()  # in the log, then aborted
                raise RuntimeError("application bug")
        with p.transaction():
            p.send(topic, b"kept-3", key=b"k")
    finally:
        p.close()
    values = sorted(r.value for r in read_all(cluster, topic, 2, "read_committed", expected=4))
    assert values == [b"kept-0", b"kept-1", b"kept-2", b"kept-3"]
    uncommitted = [r.value for r in read_all(cluster, topic, 2, "read_uncommitted", expected=5)]
    assert b"dropped-0" in uncommitted


def test_fatal_error_in_transaction_block_closes_the_producer(cluster):
    topic = create_topic(cluster, 1)
    tid = _name("tx")
    zombie = producer(cluster, **{"transactional.id": tid})
    zombie.init_transactions()
    successor = producer(cluster, **{"transactional.id": tid})
    try:
        successor.init_transactions()  # fences the zombie
        with pytest.raises(errors.ProducerFencedError) as info:
            with zombie.transaction():
                zombie.send(topic, b"zombie")
        assert info.value.fatal
        with pytest.raises(errors.IllegalStateError, match="closed"):
            zombie.send(topic, b"after")
    finally:
        zombie.close()
        successor.close()
    assert read_all(cluster, topic, 1, "read_committed") == []


def _seed_input(cluster, topic: str, n: int) -> None:
    with producer(cluster) as p:
        for i in range(n):
            p.send(topic, json.dumps({"order": i}).encode(), key=str(i).encode())
        p.flush()


def test_run_in_transaction_retries_abortable_errors_and_copies_each_record_once(cluster):
    src, dst = create_topic(cluster, 3), create_topic(cluster, 3)
    _seed_input(cluster, src, 90)
    group = _name("g")
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    p = producer(cluster, **{"transactional.id": _name("tx"), "max.request.size": 4096,
                             "retry.backoff.ms": 10})
    calls = {"n": 0, "injected": 0}

    def copy_one_poll(prod: Producer) -> int:
        calls["n"] += 1
        records = consumer.poll(timeout=1.0, max_records=20)
        offsets = {}
        for r in records:
            prod.send(dst, r.value, key=r.key)
            offsets[TopicPartition(r.topic, r.partition)] = OffsetAndMetadata(r.offset + 1)
        if records and calls["n"] % 3 == 1:
            # Injected abortable error, after the copies reached the log: a record
            # above max.request.size.
            prod.flush()
            calls["injected"] += 1
            prod.send(dst, b"x" * 8192)
        if offsets:
            prod.send_offsets_to_transaction(offsets, consumer.group_metadata())
        return len(records)

    try:
        consumer.subscribe([src])
        p.init_transactions()
        copied = 0
        for _ in range(200):
            if copied >= 90:
                break
            copied += p.run_in_transaction(copy_one_poll, attempts=3, consumer=consumer)
    finally:
        consumer.close()
        p.close()
    assert calls["injected"] >= 3
    out = [json.loads(r.value)["order"] for r in read_all(cluster, dst, 3, "read_committed", expected=90)]
    assert sorted(out) == list(range(90))  # every record exactly once
    everything = read_all(cluster, dst, 3, "read_uncommitted")
    assert len(everything) > 90  # aborted attempts did write, and read_committed filtered them


def test_run_in_transaction_does_not_retry_a_fatal_error(cluster):
    topic = create_topic(cluster, 1)
    tid = _name("tx")
    p = producer(cluster, **{"transactional.id": tid})
    successor = producer(cluster, **{"transactional.id": tid})
    calls = {"n": 0}

    def fenced_midway(prod: Producer) -> None:
        calls["n"] += 1
        prod.send(topic, b"from-zombie")
        successor.init_transactions()  # a newer instance takes over the transactional.id

    try:
        p.init_transactions()
        with pytest.raises(errors.ProducerFencedError):
            p.run_in_transaction(fenced_midway, attempts=5)
        assert calls["n"] == 1
        with pytest.raises(errors.IllegalStateError, match="closed"):
            p.begin_transaction()
    finally:
        p.close()
        successor.close()
    assert read_all(cluster, topic, 1, "read_committed") == []


def test_run_in_transaction_rejects_zero_attempts(cluster):
    p = producer(cluster, **{"transactional.id": _name("tx")})
    try:
        with pytest.raises(ValueError, match="attempts"):
            p.run_in_transaction(lambda prod: None, attempts=0)
    finally:
        p.close()
