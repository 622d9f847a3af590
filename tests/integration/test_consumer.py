"""The Consumer against a real cluster (real ZooKeeper, real service processes):
isolation levels, the LSO, seek_to_end, consumer groups, committed offsets and a
partition leader going down. Design doc "Consumer" (READ_COMMITTED, "Discussion
on Seeks"); docs/design.md, "Last stable offset and read_committed" and "Decisions"."""
from __future__ import annotations

import time
import uuid

import pytest

from exactly import AdminClient, Consumer, NewTopic, OffsetAndMetadata, Producer, TopicPartition, errors

pytestmark = pytest.mark.integration


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(cluster, partitions: int = 1) -> str:
    topic = _name("t")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    try:
        admin.create_topics([NewTopic(topic, partitions)], timeout=60)
    finally:
        admin.close()
    return topic


def consumer(cluster, **conf) -> Consumer:
    base = {"bootstrap.servers": cluster.bootstrap_servers, "auto.offset.reset": "earliest",
            "fetch.max.wait.ms": 100, "enable.auto.commit": False}
    base.update({k.replace("_", "."): v for k, v in conf.items()})
    return Consumer(base)


def producer(cluster, **conf) -> Producer:
    base = {"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 0}
    base.update({k.replace("_", "."): v for k, v in conf.items()})
    return Producer(base)


def consume(c: Consumer, count: int, timeout_s: float = 30.0) -> list:
    """Poll until `count` records arrived or the timeout passed."""
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        out += c.poll(0.2)
    return out


def consume_for(c: Consumer, seconds: float) -> list:
    out: list = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out += c.poll(0.1)
    return out


def test_aborted_data_invisible_to_read_committed_visible_to_read_uncommitted(cluster):
    topic = create_topic(cluster)
    tp = TopicPartition(topic, 0)
    txn = producer(cluster, transactional_id=_name("tx"))
    plain = producer(cluster)
    try:
        txn.init_transactions()
        txn.begin_transaction()
        for i in range(3):
            txn.send(topic, f"aborted-{i}".encode(), partition=0)
        txn.flush()
        plain.send(topic, b"plain-0", partition=0).result(30)
        txn.abort_transaction()
        txn.begin_transaction()
        for i in range(2):
            txn.send(topic, f"committed-{i}".encode(), partition=0)
        txn.commit_transaction()
        plain.send(topic, b"plain-1", partition=0).result(30)
    finally:
        txn.close()
        plain.close()

    rc = consumer(cluster, isolation_level="read_committed")
    ru = consumer(cluster, isolation_level="read_uncommitted")
    try:
        rc.assign([tp])
        ru.assign([tp])
        committed_view = consume(rc, 4) + consume_for(rc, 1.0)
        uncommitted_view = consume(ru, 7) + consume_for(ru, 1.0)
        assert [r.value for r in committed_view] == [b"plain-0", b"committed-0", b"committed-1", b"plain-1"]
        assert sorted(r.value for r in uncommitted_view) == sorted(
            [b"aborted-0", b"aborted-1", b"aborted-2", b"plain-0", b"committed-0", b"committed-1", b"plain-1"])
        offsets = [r.offset for r in uncommitted_view]
        assert offsets == sorted(offsets)
        # 7 records and 2 markers: both end at the log end, past the markers
        assert rc.position(tp) == ru.position(tp) == 9
    finally:
        rc.close()
        ru.close()


def test_read_committed_never_reads_past_the_lso_of_an_open_transaction(cluster):
    topic = create_topic(cluster)
    tp = TopicPartition(topic, 0)
    txn = producer(cluster, transactional_id=_name("tx"))
    plain = producer(cluster)
    rc = consumer(cluster, isolation_level="read_committed")
    ru = consumer(cluster, isolation_level="read_uncommitted")
    try:
        plain.send(topic, b"before", partition=0).result(30)
        txn.init_transactions()
        txn.begin_transaction()
        open_md = txn.send(topic, b"open-0", partition=0).result(30)
        plain.send(topic, b"after-open", partition=0).result(30)
        rc.assign([tp])
        ru.assign([tp])
        assert [r.value for r in consume(rc, 1) + consume_for(rc, 2.0)] == [b"before"]
        assert rc.position(tp) == open_md.offset  # stuck at the LSO
        assert [r.value for r in consume(ru, 3)] == [b"before", b"open-0", b"after-open"]

        txn.send(topic, b"open-1", partition=0).result(30)
        txn.commit_transaction()
        after = consume(rc, 3)
        assert [r.value for r in after] == [b"open-0", b"after-open", b"open-1"]
        assert [r.offset for r in after] == sorted(r.offset for r in after)
    finally:
        txn.close()
        plain.close()
        rc.close()
        ru.close()


def test_seek_to_end_goes_to_the_lso_under_read_committed(cluster):
    topic = create_topic(cluster)
    tp = TopicPartition(topic, 0)
    txn = producer(cluster, transactional_id=_name("tx"))
    plain = producer(cluster)
    rc = consumer(cluster, isolation_level="read_committed", auto_offset_reset="latest")
    ru = consumer(cluster, isolation_level="read_uncommitted", auto_offset_reset="latest")
    try:
        for i in range(3):
            plain.send(topic, f"p{i}".encode(), partition=0).result(30)
        txn.init_transactions()
        txn.begin_transaction()
        first_open = txn.send(topic, b"open", partition=0).result(30).offset
        last_plain = plain.send(topic, b"p3", partition=0).result(30).offset
        rc.assign([tp])
        ru.assign([tp])
        rc.seek_to_end([tp])
        ru.seek_to_end([tp])
        assert rc.position(tp) == first_open == 3
        assert ru.position(tp) == last_plain + 1 == 5
        # auto.offset.reset=latest follows the same rule
        rc2 = consumer(cluster, isolation_level="read_committed", auto_offset_reset="latest")
        try:
            rc2.assign([tp])
            assert rc2.position(tp) == first_open
        finally:
            rc2.close()
        txn.commit_transaction()
        assert [r.value for r in consume(rc, 2)] == [b"open", b"p3"]
        rc.seek_to_end()
        assert rc.position(tp) == 6  # past the COMMIT marker
        rc.seek_to_beginning([tp])
        assert rc.position(tp) == 0
    finally:
        txn.close()
        plain.close()
        rc.close()
        ru.close()


def test_two_consumers_in_one_group_split_the_partitions(cluster):
    topic = create_topic(cluster, partitions=4)
    group = _name("g")
    p = producer(cluster)
    try:
        for part in range(4):
            for i in range(5):
                p.send(topic, f"{part}-{i}".encode(), partition=part)
        p.flush()
    finally:
        p.close()
    conf = dict(group_id=group, heartbeat_interval_ms=200, session_timeout_ms=6000)
    events: dict[str, list] = {"c1": [], "c2": []}
    c1 = consumer(cluster, **conf)
    c2 = consumer(cluster, **conf)
    try:
        c1.subscribe([topic], on_assign=lambda tps: events["c1"].append(("assign", tps)),
                     on_revoke=lambda tps: events["c1"].append(("revoke", tps)))
        seen1 = []
        deadline = time.monotonic() + 30
        while len(c1.assignment()) < 4 and time.monotonic() < deadline:
            seen1 += c1.poll(0.2)
        assert len(c1.assignment()) == 4

        c2.subscribe([topic], on_assign=lambda tps: events["c2"].append(("assign", tps)))
        seen2 = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen1 += c1.poll(0.1)
            seen2 += c2.poll(0.1)
            a1, a2 = c1.assignment(), c2.assignment()
            if len(a1) == 2 and len(a2) == 2:
                break
        a1, a2 = c1.assignment(), c2.assignment()
        assert len(a1) == 2 and len(a2) == 2, (a1, a2)
        assert a1 | a2 == {TopicPartition(topic, i) for i in range(4)}
        assert ("revoke", sorted(TopicPartition(topic, i) for i in range(4))) in events["c1"]
        assert events["c2"][-1] == ("assign", sorted(a2))
        m1, m2 = c1.group_metadata(), c2.group_metadata()
        assert m1.group_id == m2.group_id == group
        assert m1.generation_id == m2.generation_id >= 2
        assert m1.member_id and m2.member_id and m1.member_id != m2.member_id

        # each consumer reads its own partitions (from the start: nothing was committed)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got2 = {(r.partition, r.offset) for r in seen2}
            if len(got2) >= 10:
                break
            seen2 += c2.poll(0.1)
            seen1 += c1.poll(0.1)
        assert {r.partition for r in seen2} <= {tp.partition for tp in a2}
        assert {(r.partition, r.offset) for r in seen2} == {(tp.partition, i) for tp in a2 for i in range(5)}
    finally:
        c1.close()
        c2.close()


def test_committed_offsets_resume_a_group(cluster):
    topic = create_topic(cluster)
    tp = TopicPartition(topic, 0)
    group = _name("g")
    p = producer(cluster)
    try:
        for i in range(6):
            p.send(topic, f"v{i}".encode(), partition=0)
        p.flush()
    finally:
        p.close()
    c = consumer(cluster, group_id=group, isolation_level="read_committed")
    try:
        c.subscribe([topic])
        first = consume(c, 6)
        assert len(first) == 6
        c.commit({tp: OffsetAndMetadata(4, "checkpoint")})
        assert c.committed([tp]) == {tp: OffsetAndMetadata(4, "checkpoint")}
    finally:
        c.close()
    again = consumer(cluster, group_id=group, isolation_level="read_committed")
    try:
        again.subscribe([topic])
        assert [r.value for r in consume(again, 2)] == [b"v4", b"v5"]
        again.commit()
        assert again.committed([tp])[tp].offset == 6
    finally:
        again.close()


def test_poll_keeps_going_while_a_partition_leader_is_down(cluster):
    topic = create_topic(cluster, partitions=3)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    try:
        leaders = {i: d.leader for i, d in admin.describe_topics([topic])[topic].partitions.items()}
    finally:
        admin.close()
    victim_addr = leaders[0]
    victim = next(name for name, s in cluster.services.items() if s.address == victim_addr)
    survivors = [i for i, a in leaders.items() if a != victim_addr]
    p = producer(cluster)
    c = consumer(cluster)
    try:
        for i in range(3):
            p.send(topic, f"{i}-a".encode(), partition=i)
        p.flush()
        c.assign([TopicPartition(topic, i) for i in range(3)])
        assert len(consume(c, 3)) == 3
        cluster.kill(victim)
        start = time.monotonic()
        assert c.position(TopicPartition(topic, 0)) == 1
        assert time.monotonic() - start < 1.0
        for i in survivors:
            p.send(topic, f"{i}-b".encode(), partition=i).result(30)
        got = consume(c, len(survivors), timeout_s=20)
        assert sorted(r.value for r in got) == sorted(f"{i}-b".encode() for i in survivors)
        assert consume_for(c, 1.0) == []
        cluster.restart(victim)
        p.send(topic, b"0-c", partition=0).result(60)
        assert [r.value for r in consume(c, 1, timeout_s=60)] == [b"0-c"]
    finally:
        p.close()
        c.close()


def test_position_finds_the_new_leader_after_a_failover(cluster):
    """position() alone (no poll) resolves a seek after the partition's leader died
    and another replica was elected: the ListOffsets to the dead leader fails, the
    consumer refreshes its metadata and asks the new leader (not the cached address
    until metadata.max.age.ms)."""
    topic = _name("t")
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, 1, replication_factor=2)], timeout=60)
    tp = TopicPartition(topic, 0)
    p = producer(cluster, acks="all")
    c = consumer(cluster)
    try:
        for i in range(2):
            p.send(topic, f"v{i}".encode(), partition=0)
        p.flush(30)
        c.assign([tp])
        assert c.position(tp) == 0  # the consumer's metadata now names the leader
        with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
            old = admin.describe_topics([topic])[topic].partitions[0].leader
            cluster.kill(next(name for name, s in cluster.services.items() if s.address == old))

            def new_leader():
                d = admin.describe_topics([topic])[topic].partitions[0]
                return d.leader not in (None, "", old)
            deadline = time.monotonic() + 60
            while not new_leader():
                assert time.monotonic() < deadline, "no new leader elected"
                time.sleep(0.2)
        c.seek_to_end([tp])
        assert c.position(tp, timeout=30) == 2
    finally:
        p.close()
        c.close()


def test_consume_transform_produce_offsets_visible_only_on_commit(cluster):
    """KIP-447: the consumer's group metadata goes with the transactional offsets;
    under read_committed, committed() waits out a pending transactional offset
    commit (require_stable) and sees it only after the transaction commits."""
    src, dst = create_topic(cluster), create_topic(cluster)
    tp = TopicPartition(src, 0)
    group = _name("g")
    p = producer(cluster)
    try:
        for i in range(4):
            p.send(src, f"in-{i}".encode(), partition=0)
        p.flush()
    finally:
        p.close()
    c = consumer(cluster, group_id=group, isolation_level="read_committed")
    txn = producer(cluster, transactional_id=_name("tx"))
    out = consumer(cluster, isolation_level="read_committed")
    try:
        c.subscribe([src])
        batch = consume(c, 4)
        assert len(batch) == 4
        meta = c.group_metadata()
        assert meta.generation_id >= 1 and meta.member_id
        txn.init_transactions()

        txn.begin_transaction()
        for r in batch:
            txn.send(dst, r.value.replace(b"in", b"out"), partition=0)
        txn.send_offsets_to_transaction({tp: OffsetAndMetadata(c.position(tp))}, meta)
        txn.abort_transaction()
        assert c.committed([tp]) == {tp: None}

        txn.begin_transaction()
        for r in batch:
            txn.send(dst, r.value.replace(b"in", b"out"), partition=0)
        txn.send_offsets_to_transaction({tp: OffsetAndMetadata(c.position(tp))}, meta)
        txn.flush()
        with pytest.raises(errors.UnstableOffsetCommitError):
            c.committed([tp], timeout=1.0)
        txn.commit_transaction()
        assert c.committed([tp]) == {tp: OffsetAndMetadata(4, "")}

        out.assign([TopicPartition(dst, 0)])
        assert [r.value for r in consume(out, 4) + consume_for(out, 1.0)] == [
            b"out-0", b"out-1", b"out-2", b"out-3"]
    finally:
        txn.close()
        c.close()
        out.close()
