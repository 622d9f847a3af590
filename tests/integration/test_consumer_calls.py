"""The Consumer's calls against a real cluster (real ZooKeeper, real service
processes): unsubscribe, pause / resume / paused, get_watermark_offsets under
both isolation levels, beginning / end offsets, offsets_for_times (ListOffsets by
timestamp), asynchronous commits with callbacks, pattern subscriptions picking up
a topic created later, on_lost for a fenced and for an expired member, and static
membership (KIP-345) across a SIGKILL of the member's process.

The tests share one cluster (module scope) and use their own topics and groups."""
from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from waiting import wait_for

from conftest import _chroot
from exactly import AdminClient, Consumer, NewTopic, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition, errors
from exactly_tools.devcluster import DevCluster

from .test_consumer import _name, consume, consumer, producer
from .test_consumer import create_topic as create_any_topic

pytestmark = pytest.mark.integration

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(zk, tmp_path_factory):
    c = DevCluster(tmp_path_factory.mktemp("consumer-calls"), props={})
    try:
        c.up(3, 1, 1, zookeeper=_chroot(zk))
        yield c
    finally:
        c.down()


def create_topic(cluster, partitions: int = 1, name: str | None = None) -> str:
    if name is None:
        return create_any_topic(cluster, partitions)
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(name, partitions)], timeout=60)
    return name


def produce(cluster, topic: str, values: list[bytes], partition: int = 0, timestamps=None) -> None:
    with producer(cluster) as p:
        for i, v in enumerate(values):
            p.send(topic, v, partition=partition,
                   timestamp_ms=None if timestamps is None else timestamps[i]).result(30)


def poll_until(c: Consumer, predicate, timeout_s: float, what: str) -> list:
    """Poll `c` (keeping its membership going) until `predicate()` holds."""
    out: list = []
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        out += c.poll(0.1)
    return out


# ---------------------------------------------------------------- unsubscribe

def test_unsubscribe_gives_the_partitions_up_and_leaves_the_group(cluster):
    topic = create_topic(cluster, 2)
    produce(cluster, topic, [b"a"], partition=0)
    group = _name("g")
    revoked: list = []
    c = consumer(cluster, group_id=group, session_timeout_ms=30000, enable_auto_commit=True)
    other = consumer(cluster, group_id=group, session_timeout_ms=30000)
    try:
        c.subscribe([topic], on_revoke=revoked.append)
        assert [r.value for r in consume(c, 1)] == [b"a"]
        assert c.assignment() == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        c.unsubscribe()
        assert revoked == [[TopicPartition(topic, 0), TopicPartition(topic, 1)]]
        assert c.assignment() == set()
        with pytest.raises(errors.IllegalStateError):
            c.poll(0)
        # The auto commit ran before the partitions were given up; LeaveGroup
        # lets a new member take everything without waiting for the session.
        other.subscribe([topic])
        poll_until(other, lambda: len(other.assignment()) == 2, 20, "the other member to get both partitions")
        assert other.committed([TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): OffsetAndMetadata(1, "")}
        # Manual assignment after unsubscribe.
        c.assign([TopicPartition(topic, 0)])
        assert c.position(TopicPartition(topic, 0)) == 1
    finally:
        c.close()
        other.close()


# ---------------------------------------------------------------- pause / resume

def test_paused_partitions_are_not_fetched_but_keep_their_position(cluster):
    topic = create_topic(cluster, 2)
    a, b = TopicPartition(topic, 0), TopicPartition(topic, 1)
    produce(cluster, topic, [b"a0", b"a1"], partition=0)
    produce(cluster, topic, [b"b0", b"b1"], partition=1)
    c = consumer(cluster)
    try:
        c.assign([a, b])
        c.pause([a])
        assert c.paused() == {a}
        got = consume(c, 2)
        assert [r.value for r in got] == [b"b0", b"b1"]
        assert [r.value for r in consume(c, 1, timeout_s=1.0)] == []
        assert c.position(a) == 0 and c.assignment() == {a, b}
        c.resume([a])
        assert c.paused() == set()
        assert [r.value for r in consume(c, 2)] == [b"a0", b"a1"]
        assert c.position(a) == 2
    finally:
        c.close()


# ---------------------------------------------------------------- offsets of the log

@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_watermarks_and_beginning_and_end_offsets(cluster, isolation):
    topic = create_topic(cluster)
    tp = TopicPartition(topic, 0)
    produce(cluster, topic, [b"p0", b"p1", b"p2"])
    txn = producer(cluster, transactional_id=_name("tx"))
    c = consumer(cluster, isolation_level=isolation)
    try:
        txn.init_transactions()
        txn.begin_transaction()
        txn.send(topic, b"t0", partition=0)
        txn.send(topic, b"t1", partition=0)
        txn.flush()  # 3-4 written, transaction open
        assert c.get_watermark_offsets(tp, timeout=30) == (0, 5)  # the high watermark either way
        assert c.beginning_offsets([tp], timeout=30) == {tp: 0}
        open_end = 3 if isolation == "read_committed" else 5
        assert c.end_offsets([tp], timeout=30) == {tp: open_end}
        txn.commit_transaction()  # the marker at offset 5
        wait_for(lambda: c.end_offsets([tp], timeout=30) == {tp: 6}, 20, "the end offset to pass the marker")
        assert c.get_watermark_offsets(tp) == (0, 6)
        c.assign([tp])
        assert len(consume(c, 5)) == 5
        assert c.get_watermark_offsets(tp, cached=True) == (0, 6)
        c.seek_to_end([tp])
        assert c.position(tp) == 6
    finally:
        txn.close()
        c.close()


def test_offsets_for_times_finds_the_first_record_at_or_after_a_timestamp(cluster):
    topic = create_topic(cluster)
    tp = TopicPartition(topic, 0)
    base = 1_700_000_000_000
    # Timestamps are not monotonic (producers' clocks disagree).
    produce(cluster, topic, [b"r%d" % i for i in range(6)],
            timestamps=[base, base + 1000, base + 3000, base + 2000, base + 4000, base + 5000])
    c = consumer(cluster)
    other = TopicPartition(create_topic(cluster), 0)
    try:
        got = c.offsets_for_times({tp: base + 1500, other: base}, timeout=30)
        assert got == {tp: OffsetAndTimestamp(2, base + 3000), other: None}
        assert c.offsets_for_times({tp: base})[tp] == OffsetAndTimestamp(0, base)
        assert c.offsets_for_times({tp: base + 2000})[tp] == OffsetAndTimestamp(2, base + 3000)
        assert c.offsets_for_times({tp: base + 5000})[tp] == OffsetAndTimestamp(5, base + 5000)
        assert c.offsets_for_times({tp: base + 5001})[tp] is None
        # Seeking to the answer reads from there.
        c.assign([tp])
        c.seek(tp, c.offsets_for_times({tp: base + 3500})[tp].offset)
        assert [r.value for r in consume(c, 2)] == [b"r4", b"r5"]
    finally:
        c.close()


# ---------------------------------------------------------------- asynchronous commit

def test_async_commit_runs_its_callback_on_a_later_poll(cluster):
    topic = create_topic(cluster)
    tp = TopicPartition(topic, 0)
    produce(cluster, topic, [b"a", b"b", b"c"])
    c = consumer(cluster, group_id=_name("g"))
    results: list = []
    caller = []
    try:
        c.subscribe([topic])
        assert len(consume(c, 3)) == 3

        def on_commit(err, offsets):
            caller.append(threading.current_thread())
            results.append((err, offsets))

        c.commit(asynchronous=True, callback=on_commit)
        poll_until(c, lambda: results, 20, "the commit callback")
        assert results == [(None, {tp: OffsetAndMetadata(3)})]
        assert caller == [threading.current_thread()]
        assert c.committed([tp]) == {tp: OffsetAndMetadata(3, "")}
        # One in flight at close: close waits for it and runs the callback.
        c.commit({tp: OffsetAndMetadata(2, "m")}, asynchronous=True, callback=on_commit)
        c.close()
        assert results[-1] == (None, {tp: OffsetAndMetadata(2, "m")})
    finally:
        c.close()


# ---------------------------------------------------------------- pattern subscription

def test_pattern_subscription_picks_up_a_topic_created_later(cluster):
    prefix = _name("orders")
    first = create_topic(cluster, name=f"{prefix}-eu")
    create_topic(cluster, name=_name("unrelated"))
    produce(cluster, first, [b"eu-0"])
    assigned: list = []
    c = consumer(cluster, group_id=_name("g"), metadata_max_age_ms=300)
    try:
        c.subscribe(re.compile(f"^{re.escape(prefix)}-.*"), on_assign=assigned.append)
        assert [r.value for r in consume(c, 1)] == [b"eu-0"]
        assert c.assignment() == {TopicPartition(first, 0)}
        c.commit()  # the rejoin below starts the first topic from here
        second = create_topic(cluster, name=f"{prefix}-us")
        produce(cluster, second, [b"us-0"])
        got = poll_until(c, lambda: TopicPartition(second, 0) in c.assignment(), 30,
                         "the new matching topic to be assigned")
        if not got:
            got = consume(c, 1)
        assert [r.value for r in got] == [b"us-0"]
        assert assigned[-1] == [TopicPartition(first, 0), TopicPartition(second, 0)]
    finally:
        c.close()


# ---------------------------------------------------------------- on_lost

def test_on_lost_for_a_fenced_static_member(cluster):
    topic = create_topic(cluster)
    group = _name("g")
    events: list = []
    old = consumer(cluster, group_id=group, group_instance_id="instance-1", session_timeout_ms=30000,
                   heartbeat_interval_ms=200, enable_auto_commit=True)
    new = consumer(cluster, group_id=group, group_instance_id="instance-1", session_timeout_ms=30000)
    try:
        old.subscribe([topic], on_revoke=lambda tps: events.append(("revoke", tps)),
                      on_lost=lambda tps: events.append(("lost", tps)))
        poll_until(old, lambda: old.assignment(), 20, "the first instance's assignment")
        new.subscribe([topic])
        poll_until(new, lambda: new.assignment(), 20, "the second instance to take the place")
        with pytest.raises(errors.FencedInstanceIdError):
            poll_until(old, lambda: False, 20, "the first instance to be fenced")
        assert events == [("lost", [TopicPartition(topic, 0)])]
        assert old.assignment() == set()
        with pytest.raises(errors.FencedInstanceIdError):
            old.poll(0)
        assert new.committed([TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): None}
    finally:
        old.close()
        new.close()


def test_on_lost_for_a_member_that_stopped_polling(cluster):
    topic = create_topic(cluster)
    events: list = []
    c = consumer(cluster, group_id=_name("g"), max_poll_interval_ms=1500, session_timeout_ms=6000,
                 heartbeat_interval_ms=200, enable_auto_commit=True)
    try:
        c.subscribe([topic], on_revoke=lambda tps: events.append(("revoke", tps)),
                     on_lost=lambda tps: events.append(("lost", tps)),
                     on_assign=lambda tps: events.append(("assign", tps)))
        poll_until(c, lambda: c.assignment(), 20, "the assignment")
        gen = c.group_metadata().generation_id
        # No poll for longer than max.poll.interval.ms: the member leaves the group.
        wait_for(lambda: c._group.generation() == (-1, ""), 20, "the member to leave after max.poll.interval.ms")
        poll_until(c, lambda: len(events) >= 3, 20, "the rejoin")
        tp = TopicPartition(topic, 0)
        assert events == [("assign", [tp]), ("lost", [tp]), ("assign", [tp])]
        assert c.group_metadata().generation_id > gen
    finally:
        c.close()


# ---------------------------------------------------------------- static membership

_STATIC_MEMBER = """
import json, sys
from exactly import Consumer
bootstrap, group, topic = sys.argv[1:4]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": "static-1",
              "session.timeout.ms": 30000, "heartbeat.interval.ms": 500, "enable.auto.commit": False,
              "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100})
def on_assign(tps):
    md = c.group_metadata()
    print(json.dumps({"assigned": [[t.topic, t.partition] for t in tps],
                      "generation": md.generation_id, "member": md.member_id}), flush=True)
c.subscribe([topic], on_assign=on_assign)
while True:
    c.poll(0.2)
"""


class StaticMemberProcess:
    """A consumer process with group.instance.id "static-1"; its on_assign
    events are read from its stdout."""

    def __init__(self, cluster, group: str, topic: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "clients"), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.proc = subprocess.Popen([sys.executable, "-c", _STATIC_MEMBER, cluster.bootstrap_servers, group, topic],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def test_a_static_member_restarted_within_the_session_gets_its_partitions_back_without_a_rebalance(cluster):
    topic = create_topic(cluster, 4)
    group = _name("g")
    other_events: list = []
    other = consumer(cluster, group_id=group, session_timeout_ms=30000, heartbeat_interval_ms=500)
    stop = threading.Event()

    def keep_polling() -> None:
        while not stop.is_set():
            other.poll(0.1)

    member = StaticMemberProcess(cluster, group, topic)
    poller = threading.Thread(target=keep_polling, daemon=True)
    try:
        wait_for(lambda: member.events, 60, "the static member's first assignment")
        other.subscribe([topic], on_assign=lambda tps: other_events.append(("assign", tps)),
                        on_revoke=lambda tps: other_events.append(("revoke", tps)))
        poller.start()
        # Both members share the partitions (the static one sorts first in the range assignor).
        wait_for(lambda: len(member.events) >= 2 and other_events and other_events[-1][0] == "assign",
                 60, "the two-member generation")
        before = member.events[-1]
        assert [tuple(tp) for tp in before["assigned"]] == [(topic, 0), (topic, 1)]
        assert other_events[-1] == ("assign", [TopicPartition(topic, 2), TopicPartition(topic, 3)])
        generation = other.group_metadata().generation_id
        assert before["generation"] == generation
        seen_by_other = list(other_events)

        member.kill()
        restarted = StaticMemberProcess(cluster, group, topic)
        try:
            wait_for(lambda: restarted.events, 25, "the restarted static member's assignment")
            after = restarted.events[0]
            assert after["assigned"] == before["assigned"]
            assert after["generation"] == generation
            assert after["member"] != before["member"]
            # The other member saw no rebalance: same generation, no callbacks.
            assert other.group_metadata().generation_id == generation
            assert other_events == seen_by_other
        finally:
            restarted.kill()
    finally:
        stop.set()
        if poller.is_alive():
            poller.join(10)
        if member.proc.poll() is None:
            member.kill()
        other.close()
