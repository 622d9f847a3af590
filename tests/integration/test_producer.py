"""The Producer against a real cluster (real ZooKeeper, real service processes):
transactional round trips, zombie fencing, transactional offsets, idempotence
across a partition leader restart. KIP-98 design document, "Transactional
Producer" (Public APIs, Error Handling) and data flow steps 1-5; KIP-447."""
from __future__ import annotations

import threading
import time
import uuid

import pytest

from exactly import (AdminClient, Consumer, ConsumerGroupMetadata, NewTopic, OffsetAndMetadata, Producer,
                     TopicPartition, errors)
from exactly._accumulator import partition_for_key

pytestmark = pytest.mark.integration


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(cluster, partitions: int = 3) -> str:
    topic = _name("t")
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, partitions)], timeout=60)
    return topic


def producer(cluster, **conf) -> Producer:
    base = {"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5}
    base.update(conf)
    return Producer(base)


def read_all(cluster, topic: str, partitions: int, isolation: str, expected: int | None = None,
             timeout_s: float = 30.0) -> list:
    """Every record of `topic` from the beginning, read with `isolation`; waits for
    `expected` records, or for a quiet second when None."""
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "isolation.level": isolation,
                  "enable.auto.commit": False, "fetch.max.wait.ms": 100})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(tps)
        out: list = []
        deadline = time.monotonic() + timeout_s
        quiet_until = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            got = c.poll(0.2)
            out += got
            if expected is not None and len(out) >= expected:
                break
            if expected is None:
                if got:
                    quiet_until = time.monotonic() + 1.5
                elif time.monotonic() > quiet_until:
                    break
        return out
    finally:
        c.close()


def test_transactional_round_trip(cluster):
    topic = create_topic(cluster, 3)
    p = producer(cluster, **{"transactional.id": _name("tx")})
    try:
        p.init_transactions(30)
        p.begin_transaction()
        committed = [p.send(topic, f"c{i}", key=f"k{i}") for i in range(60)]
        p.commit_transaction(30)
        p.begin_transaction()
        aborted = [p.send(topic, f"a{i}", key=f"k{i}") for i in range(30)]
        p.flush(30)
        p.abort_transaction(30)
        p.begin_transaction()
        last = p.send(topic, "last", partition=1)
        p.commit_transaction(30)
        metas = [f.result(0) for f in committed]
        for i, md in enumerate(metas):
            assert md.topic == topic and md.partition == partition_for_key(f"k{i}".encode(), 3)
        assert all(f.done() and f.exception() is None for f in aborted)  # written, then aborted
    finally:
        p.close(30)

    records = read_all(cluster, topic, 3, "read_committed", expected=61)
    values = sorted(r.value for r in records)
    assert values == sorted([f"c{i}".encode() for i in range(60)] + [b"last"])
    # RecordMetadata carries the real log offset
    by_value = {r.value: (r.partition, r.offset) for r in records}
    for i, md in enumerate(metas):
        assert by_value[f"c{i}".encode()] == (md.partition, md.offset)
    assert by_value[b"last"] == (1, last.result(0).offset)
    uncommitted = read_all(cluster, topic, 3, "read_uncommitted", expected=91)
    assert len([r for r in uncommitted if r.value.startswith(b"a")]) == 30


def test_zombie_is_fenced(cluster):
    """A second instance with the same transactional.id fences the first: the old
    one gets ProducerFencedError from the send future, from
    send_offsets_to_transaction and from commit_transaction (design doc "Error
    Handling": InvalidProducerEpoch is fatal)."""
    topic = create_topic(cluster, 2)
    tid = _name("zombie")
    old = producer(cluster, **{"transactional.id": tid})
    new = producer(cluster, **{"transactional.id": tid})
    try:
        old.init_transactions(30)
        old.begin_transaction()
        old.send(topic, b"zombie-1", partition=0).result(30)
        new.init_transactions(30)  # bumps the epoch, aborts old's open transaction
        with pytest.raises(errors.ProducerFencedError):
            old.send(topic, b"zombie-2", partition=0).result(30)
        with pytest.raises(errors.ProducerFencedError):
            old.send_offsets_to_transaction({TopicPartition(topic, 0): OffsetAndMetadata(1)},
                                            ConsumerGroupMetadata(_name("g")))
        with pytest.raises(errors.ProducerFencedError):
            old.commit_transaction(30)
        with pytest.raises(errors.ProducerFencedError):
            old.begin_transaction()

        new.begin_transaction()
        new.send(topic, b"new", partition=1).result(30)
        new.commit_transaction(30)
    finally:
        old.close(5)
        new.close(30)
    values = [r.value for r in read_all(cluster, topic, 2, "read_committed", expected=1)]
    assert values == [b"new"]


@pytest.mark.parametrize("first_call", ["send_offsets", "commit"])
def test_zombie_fenced_on_its_first_coordinator_call(cluster, first_call):
    topic = create_topic(cluster, 1)
    tid = _name("zombie")
    old = producer(cluster, **{"transactional.id": tid})
    new = producer(cluster, **{"transactional.id": tid})
    try:
        old.init_transactions(30)
        old.begin_transaction()
        old.send(topic, b"x", partition=0).result(30)
        new.init_transactions(30)
        with pytest.raises(errors.ProducerFencedError):
            if first_call == "send_offsets":
                old.send_offsets_to_transaction({TopicPartition(topic, 0): OffsetAndMetadata(1)}, _name("g"))
            else:
                old.commit_transaction(30)
    finally:
        old.close(5)
        new.close(30)


def test_send_offsets_to_transaction(cluster):
    """Offsets sent in a transaction become the group's committed offsets only when
    it commits (data flow 4.3, 4.4, 5.2); the group metadata carries the generation
    and member id (KIP-447)."""
    src = create_topic(cluster, 1)
    dst = create_topic(cluster, 1)
    warm = producer(cluster)
    for i in range(10):
        warm.send(src, f"in{i}", partition=0)
    warm.flush(30)
    warm.close(30)

    group = _name("g")
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "fetch.max.wait.ms": 100})
    p = producer(cluster, **{"transactional.id": _name("tx")})
    tp = TopicPartition(src, 0)
    try:
        c.subscribe([src])
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            got += c.poll(0.2)
        assert len(got) == 10
        p.init_transactions(30)

        p.begin_transaction()
        p.send(dst, b"out-aborted", partition=0)
        p.send_offsets_to_transaction({tp: OffsetAndMetadata(4)}, c.group_metadata())
        p.abort_transaction(30)
        assert c.committed([tp]).get(tp) is None

        p.begin_transaction()
        p.send(dst, b"out", partition=0)
        gm = c.group_metadata()
        assert gm.group_id == group and gm.generation_id >= 0 and gm.member_id
        p.send_offsets_to_transaction({tp: OffsetAndMetadata(10, "done")}, gm)
        p.commit_transaction(30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            om = c.committed([tp]).get(tp)
            if om is not None:
                break
            time.sleep(0.1)
        assert om is not None and om.offset == 10

        p.begin_transaction()
        with pytest.raises(errors.IllegalGenerationError):
            p.send_offsets_to_transaction({tp: OffsetAndMetadata(11)},
                                          ConsumerGroupMetadata(group, gm.generation_id + 5, gm.member_id))
        with pytest.raises(errors.IllegalGenerationError):
            p.commit_transaction(30)  # abortable: the transaction must be aborted
        p.abort_transaction(30)
    finally:
        p.close(30)
        c.close()
    values = [r.value for r in read_all(cluster, dst, 1, "read_committed", expected=1)]
    assert values == [b"out"]


def test_idempotent_producer_survives_a_leader_restart(cluster):
    """Records sent while the partition's leader restarts are retried (metadata
    refresh, backoff) and written once each."""
    topic = create_topic(cluster, 3)
    p = producer(cluster, **{"delivery.timeout.ms": 120000, "request.timeout.ms": 5000})
    futures = []
    stop = threading.Event()

    def keep_sending():
        i = 0
        while not stop.is_set():
            futures.append(p.send(topic, f"r{i}", key=f"k{i % 50}"))
            i += 1
            time.sleep(0.002)

    th = threading.Thread(target=keep_sending)
    th.start()
    try:
        time.sleep(0.5)
        with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
            leader = admin.describe_topics([topic])[topic].partitions[0].leader_id
        if leader not in cluster.services:
            leader = next(s.name for s in cluster.services.values() if s.role == "partition_leader")
        cluster.kill(leader)  # SIGKILL: answers in flight are lost
        time.sleep(1.0)
        cluster.restart(leader)
        time.sleep(1.0)
    finally:
        stop.set()
        th.join()
    try:
        p.flush(120)
    finally:
        p.close(30)
    failed = [f.exception() for f in futures if f.exception() is not None]
    assert failed == []
    sent = sorted(f"r{i}".encode() for i in range(len(futures)))
    got = read_all(cluster, topic, 3, "read_uncommitted", expected=len(sent), timeout_s=60)
    assert sorted(r.value for r in got) == sent  # no loss, no duplicates


def test_idempotent_and_plain_round_trip(cluster):
    topic = create_topic(cluster, 2)
    confs = ({}, {"enable.idempotence": False, "acks": 1}, {"compression.type": "gzip"},
             {"compression.type": "snappy"}, {"compression.type": "lz4"}, {"compression.type": "zstd"})
    for conf in confs:
        p = producer(cluster, **conf)
        try:
            futs = [p.send(topic, f"{conf}-{i}", key=f"k{i}", headers=[("h", b"v")]) for i in range(100)]
            p.flush(30)
            offsets = {}
            for f in futs:
                md = f.result(0)
                offsets.setdefault(md.partition, []).append(md.offset)
            for offs in offsets.values():
                assert offs == sorted(offs) and len(set(offs)) == len(offs)
        finally:
            p.close(30)
    got = read_all(cluster, topic, 2, "read_uncommitted", expected=100 * len(confs))
    assert len(got) == 100 * len(confs) and all(r.headers and r.headers[0] == ("h", b"v") for r in got)
    assert {r.value.decode() for r in got} == {f"{conf}-{i}" for conf in confs for i in range(100)}


def test_transactions_with_every_codec_read_committed(cluster):
    """Each codec through a real partition leader inside transactions: the committed
    records are read back under read_committed, the aborted ones are filtered out."""
    topic = create_topic(cluster, 2)
    codecs = ("none", "gzip", "snappy", "lz4", "zstd")
    for codec in codecs:
        p = producer(cluster, **{"transactional.id": _name(f"tx-{codec}"), "compression.type": codec})
        try:
            p.init_transactions(30)
            with p.transaction():
                for i in range(50):
                    p.send(topic, f"{codec}-kept-{i}" * 10, key=f"k{i}")
            p.begin_transaction()
            for i in range(50):
                p.send(topic, f"{codec}-aborted-{i}" * 10, key=f"k{i}")
            p.flush(30)
            p.abort_transaction(30)
        finally:
            p.close(30)
    committed = read_all(cluster, topic, 2, "read_committed", expected=50 * len(codecs))
    assert sorted(r.value.decode() for r in committed) == sorted(
        f"{codec}-kept-{i}" * 10 for codec in codecs for i in range(50))
    everything = read_all(cluster, topic, 2, "read_uncommitted", expected=100 * len(codecs))
    assert len(everything) == 100 * len(codecs)


def test_create_existing_topic_raises(cluster):
    topic = create_topic(cluster, 1)
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        with pytest.raises(errors.TopicAlreadyExistsError):
            admin.create_topics([NewTopic(topic, 1)])
        assert admin.list_topics()[topic] == [0]


def test_commit_after_the_transaction_coordinator_restarts(cluster):
    """The coordinator goes away mid-transaction: the producer finds it again and
    retries (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, network errors) until
    the commit succeeds (design doc "Error Handling")."""
    topic = create_topic(cluster, 2)
    p = producer(cluster, **{"transactional.id": _name("tx"), "request.timeout.ms": 10000})
    try:
        p.init_transactions(30)
        p.begin_transaction()
        futs = [p.send(topic, f"v{i}", key=f"k{i}") for i in range(20)]
        p.flush(30)
        coordinator = next(s.name for s in cluster.services.values() if s.role == "txn_coordinator")
        cluster.kill(coordinator)
        cluster.restart(coordinator)
        p.commit_transaction(60)
        assert all(f.result(0).offset >= 0 for f in futs)
        p.begin_transaction()
        p.send(topic, b"next", partition=0)
        p.commit_transaction(60)
    finally:
        p.close(30)
    got = read_all(cluster, topic, 2, "read_committed", expected=21, timeout_s=60)
    assert sorted(r.value for r in got) == sorted([f"v{i}".encode() for i in range(20)] + [b"next"])


def test_a_producer_holds_no_memory_per_committed_transaction(cluster):
    """The SDK keeps nothing of a transaction once it is committed: a transactional
    producer's process holds as many objects after 500 more 3-partition transactions as
    before them (within 1 per transaction; the streams' deadline timer once held about 100
    per transaction for request.timeout.ms, which made Python's full collections grow to
    100-150 ms)."""
    import gc
    topic = create_topic(cluster, 3)
    p = producer(cluster, **{"transactional.id": _name("tx"), "linger.ms": 0})

    def transactions(n: int) -> None:
        for i in range(n):
            p.begin_transaction()
            for partition in range(3):
                p.send(topic, b"v", partition=partition)
            p.commit_transaction(30)

    try:
        p.init_transactions(30)
        transactions(100)
        gc.collect()
        before = len(gc.get_objects())
        transactions(500)
        gc.collect()
        held = len(gc.get_objects()) - before
    finally:
        p.close(30)
    print(f"{held} more objects after 500 transactions")
    assert held < 500, f"{held} more objects after 500 transactions"
