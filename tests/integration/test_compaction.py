"""Compaction of the coordinators' internal topics on real processes
(docs/design.md, "Retention and compaction").

One transactional.id runs N transactions, each committing the consumer offsets of
one group inside the transaction (TxnOffsetCommit), and the group commits N plain
offsets as well. With small internal segments (`transaction.state.log.segment.bytes`,
`offsets.topic.segment.bytes`) and a short `log.cleaner.delete.retention.ms`, the
cleaner compacts `__transaction_state` and `__consumer_offsets`: the records left
on disk stay bounded (they do not grow with N), and a restarted transaction
coordinator and group coordinator load their partitions with the right state in
under a second.

N is `EXACTLY_COMPACTION_TXNS` (default 1,500 in `make test`); `make soak` runs
50,000.
"""
from __future__ import annotations

import os
import re
import time
import uuid

import pytest

from exactly import Consumer, NewTopic, AdminClient, OffsetAndMetadata, Producer, TopicPartition
from exactly_wire import records

from waiting import wait_for

pytestmark = pytest.mark.integration

N = int(os.environ.get("EXACTLY_COMPACTION_TXNS", "1500"))
SEGMENT_BYTES = 32768
PROPS = {
    "transaction.state.log.num.partitions": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.segment.bytes": str(SEGMENT_BYTES),
    "offsets.topic.segment.bytes": str(SEGMENT_BYTES),
    "log.retention.check.interval.ms": "500",
    "log.cleaner.delete.retention.ms": "1000",
}
# A bound independent of N: one record per live key in the cleaned segments, plus the
# records of the uncleaned active segment (at most SEGMENT_BYTES of small batches) and
# the markers and tombstones younger than delete.retention.ms.
MAX_RECORDS = 1500


def records_on_disk(cluster, topic: str) -> int:
    """Records in the segment files of partition 0 of `topic` on its one replica: the
    transaction coordinator for __transaction_state (it leads its own log), else the
    partition leader."""
    return sum(h.record_count for h in _headers(cluster, topic))


def end_offset_on_disk(cluster, topic: str) -> int:
    """The offset after the last batch: how many offsets were ever written."""
    return max((h.last_offset + 1 for h in _headers(cluster, topic)), default=0)


def _headers(cluster, topic: str):
    replica = "txn-0" if topic == "__transaction_state" else "pl-0"
    for f in sorted((cluster.dir / replica / "logs" / f"{topic}-0").glob("*.log")):
        for _pos, h in records.iter_batches(f.read_bytes()):
            yield h


def load_lines(cluster, service: str, pattern: str) -> list[re.Match]:
    text = (cluster.dir / "logs" / f"{service}.log").read_text(errors="replace")
    return list(re.finditer(pattern, text))


TXN_LOADED = (r"loaded __transaction_state-0 \(coordinator epoch (\d+)\): (\d+) transactional ids, \d+ groups, "
              r"(\d+) records, \d+ to roll forward, in (\d+) ms")
GROUP_LOADED = r"loaded __consumer_offsets-0 \(coordinator epoch (\d+)\): (\d+) groups, up to offset (\d+) in ([\d.]+) s"


def next_load(cluster, service: str, pattern: str, seen: int) -> re.Match:
    """The first load line of `service` after the `seen` ones already in its log (the
    log file is appended to across restarts)."""
    return wait_for(lambda: (lambda found: found[seen] if len(found) > seen else None)(
        load_lines(cluster, service, pattern)), 60, f"{service} loaded again")


def test_internal_topics_stay_bounded_and_load_fast(make_cluster):
    cluster = make_cluster(partition_leaders=1, props=PROPS)
    boot = cluster.bootstrap_servers
    topic = f"cmp-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": boot}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    tp = TopicPartition(topic, 0)
    group = f"group-{uuid.uuid4().hex[:6]}"
    tid = f"tid-{uuid.uuid4().hex[:6]}"

    producer = Producer({"bootstrap.servers": boot, "transactional.id": tid, "linger.ms": 0})
    producer.init_transactions()
    started = time.monotonic()
    for i in range(N):
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: OffsetAndMetadata(i + 1, "")}, group)
        producer.commit_transaction()
        if i % 500 == 499:
            print(f"{i + 1} transactions, {time.monotonic() - started:.0f} s", flush=True)
    producer.close()
    other = f"{group}-plain"
    c = Consumer({"bootstrap.servers": boot, "group.id": other, "enable.auto.commit": False})
    c.assign([tp])
    for i in range(N):
        c.commit({tp: OffsetAndMetadata(i + 1, "")})
    c.close()

    txn_records = records_on_disk(cluster, "__transaction_state")
    offsets_records = records_on_disk(cluster, "__consumer_offsets")
    print(f"before compaction settles: {txn_records} + {offsets_records} records")
    wait_for(lambda: records_on_disk(cluster, "__transaction_state") <= MAX_RECORDS and
             records_on_disk(cluster, "__consumer_offsets") <= MAX_RECORDS, 60,
             lambda: "compaction: __transaction_state "
                     f"{records_on_disk(cluster, '__transaction_state')} records, __consumer_offsets "
                     f"{records_on_disk(cluster, '__consumer_offsets')} records")

    # Far more was written than is kept: two records per back-to-back transaction in
    # __transaction_state (PrepareCommit, then the next transaction's Ongoing record,
    # which also completes it: the handover), an offset commit and a marker per
    # transaction plus the plain commits in __consumer_offsets.
    assert end_offset_on_disk(cluster, "__transaction_state") >= 2 * N
    assert end_offset_on_disk(cluster, "__consumer_offsets") >= 3 * N
    print(f"compacted: {records_on_disk(cluster, '__transaction_state')} of "
          f"{end_offset_on_disk(cluster, '__transaction_state')} and {records_on_disk(cluster, '__consumer_offsets')} "
          f"of {end_offset_on_disk(cluster, '__consumer_offsets')} records left")

    # Restarted coordinators load the compacted partitions fast, with the right state.
    txn_seen = len(load_lines(cluster, "txn-0", TXN_LOADED))
    group_seen = len(load_lines(cluster, "group-0", GROUP_LOADED))
    first_txn_epoch = int(load_lines(cluster, "txn-0", TXN_LOADED)[-1].group(1))
    cluster.kill("txn-0")
    cluster.kill("group-0")
    cluster.restart("txn-0")
    cluster.restart("group-0")
    m = next_load(cluster, "txn-0", TXN_LOADED, txn_seen)
    print(m.group(0))
    assert int(m.group(1)) > first_txn_epoch  # a new owner's load
    assert int(m.group(2)) == 1 and int(m.group(3)) <= MAX_RECORDS
    assert int(m.group(4)) < 1000, m.group(0)
    g = next_load(cluster, "group-0", GROUP_LOADED, group_seen)
    print(g.group(0))
    assert float(g.group(4)) < 1.0, g.group(0)

    with Consumer({"bootstrap.servers": boot, "group.id": group, "isolation.level": "read_committed"}) as c:
        assert c.committed([tp], timeout=30)[tp].offset == N
    with Consumer({"bootstrap.servers": boot, "group.id": other}) as c:
        assert c.committed([tp], timeout=30)[tp].offset == N
    # The transactional.id carries on with a bumped epoch after the restart.
    again = Producer({"bootstrap.servers": boot, "transactional.id": tid})
    again.init_transactions()
    again.begin_transaction()
    again.send_offsets_to_transaction({tp: OffsetAndMetadata(N + 1, "")}, group)
    again.commit_transaction()
    again.close()
    with Consumer({"bootstrap.servers": boot, "group.id": group, "isolation.level": "read_committed"}) as c:
        assert c.committed([tp], timeout=30)[tp].offset == N + 1
