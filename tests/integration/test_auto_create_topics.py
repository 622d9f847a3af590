"""Kafka's auto.create.topics.enable on the services: a producer's first send to a topic
that does not exist creates it (num.partitions, default.replication.factor); consumers and
admin clients never create one; with it off, send() says at WARNING what it waits for and
run_in_transaction does not retry the unknown topic. (The SDK guide's examples, which rely
on it from a fresh dev cluster, run in tests/docs.)"""
from __future__ import annotations

import logging
import time

import pytest

from exactly import AdminClient, Consumer, Producer, TopicPartition, errors

pytestmark = pytest.mark.integration


def read_committed(bootstrap: str, topic: str) -> list[str]:
    """The values of every partition of `topic` under read_committed, up to its end."""
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        tps = [TopicPartition(topic, p) for p in admin.describe_topics([topic])[topic].partitions]
    with Consumer({"bootstrap.servers": bootstrap, "isolation.level": "read_committed"}) as c:
        c.assign(tps)
        c.seek_to_beginning(tps)
        end = c.end_offsets(tps)
        out: list[str] = []
        deadline = time.monotonic() + 60
        while any(c.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline
            out += [r.value.decode() for r in c.poll(0.5)]
        return out


def test_a_first_send_creates_the_topic(make_cluster):
    cluster = make_cluster(1, props={"num.partitions": "2"})
    bs = cluster.bootstrap_servers
    with Producer({"bootstrap.servers": bs}) as p:
        started = time.monotonic()
        assert p.send("created-by-send", b"v").result(30).topic == "created-by-send"
        assert time.monotonic() - started < 20
    with AdminClient({"bootstrap.servers": bs}) as admin:
        desc = admin.describe_topics(["created-by-send"])["created-by-send"]
        assert sorted(desc.partitions) == [0, 1]
        # Consumers and admin clients never create topics.
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            admin.describe_topics(["never-created"])
    assert read_committed(bs, "created-by-send") == ["v"]


def test_without_auto_create_send_warns_and_run_in_transaction_does_not_retry(make_cluster, caplog):
    cluster = make_cluster(1, props={"auto.create.topics.enable": "false"})
    bs = cluster.bootstrap_servers
    caplog.set_level(logging.WARNING, logger="exactly.producer")
    with Producer({"bootstrap.servers": bs, "transactional.id": "unknown-topic", "max.block.ms": 3000}) as p:
        p.init_transactions()
        calls = []
        started = time.monotonic()
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            p.run_in_transaction(lambda prod: calls.append(prod.send("missing", b"v")), attempts=5)
        elapsed = time.monotonic() - started
    assert calls == [] and elapsed < 10, elapsed   # one wait of max.block.ms, not five
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("'missing'" in m and "auto.create.topics.enable" in m for m in warned), warned
    with AdminClient({"bootstrap.servers": bs}) as admin:
        assert "missing" not in admin.list_topics()
