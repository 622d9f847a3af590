"""Pure parts of the operators' metrics: offline partitions from a cluster view, the
coordinator partition states, and the group lag from the last known LSO (refreshed by
hand here; the services refresh it on the event loop at scrape time)."""
from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from exactly.testing import MockTime
from services.common.cluster.state import PartitionState, TopicInfo
from services.common import metrics
from services.common.metrics import HIDDEN_TOPIC, TopicRows, coordinator_partitions, topic_label
from services.group_coordinator.metrics import GroupCollector
from services.group_coordinator.offsets import OffsetAndMetadata
from services.partition_leader.metrics import offline_partitions


@pytest.fixture
def topic_labels():
    """metrics.topic.labels=true and metrics.group.labels=true for the test (the
    services' defaults are false)."""
    metrics.set_topic_labels(True)
    metrics.set_group_labels(True)
    yield
    metrics.set_topic_labels(False)
    metrics.set_group_labels(False)


def test_user_topic_names_are_labels_only_when_metrics_topic_labels_is_true(topic_labels):
    metrics.set_topic_labels(False)
    assert topic_label("payments") == HIDDEN_TOPIC
    assert topic_label("__consumer_offsets") == "__consumer_offsets"
    assert topic_label("__transaction_state") == "__transaction_state"
    assert topic_label("__payments") == HIDDEN_TOPIC  # only the real internal topics keep their names
    rows = TopicRows(GaugeMetricFamily("g", "doc", labels=["topic", "partition"]))
    ages = TopicRows(GaugeMetricFamily("a", "doc", labels=["topic", "partition"]), max)
    for topic, partition, value in (("payments", 0, 3), ("payments", 1, 4), ("orders", 0, 5),
                                    ("__consumer_offsets", 7, 1)):
        rows.add((), topic, partition, value)
        ages.add((), topic, partition, value)
    assert {(tuple(s.labels.values()), s.value) for s in rows.done().samples} == {
        ((HIDDEN_TOPIC, ""), 12), (("__consumer_offsets", "7"), 1)}
    assert {(tuple(s.labels.values()), s.value) for s in ages.done().samples} == {
        ((HIDDEN_TOPIC, ""), 5), (("__consumer_offsets", "7"), 1)}
    metrics.set_topic_labels(True)
    assert topic_label("payments") == "payments"
    shown = TopicRows(GaugeMetricFamily("g", "doc", labels=["topic", "partition"]))
    shown.add((), "payments", 1, 4)
    assert [(tuple(s.labels.values()), s.value) for s in shown.done().samples] == [(("payments", "1"), 4)]


def test_group_offsets_are_summed_over_groups_and_topics_without_their_labels():
    """By default /metrics names no group and no user topic: the committed offsets and
    lags of every group and topic are one series each, group="(hidden)"."""
    registry = CollectorRegistry()
    collector = GroupCollector(registry=registry)
    client = _Client({("t", 0): 10, ("t", 1): 3})
    coordinator = _Coordinator({"g": {TopicPartition("t", 0): 4, TopicPartition("t", 1): 5},
                                "secret": {TopicPartition("t", 0): 10}}, client)
    collector.track(coordinator)
    asyncio.run(collector.refresh({TopicPartition("t", 0): client, TopicPartition("t", 1): client}))
    assert _samples(registry, "exactly_group_committed_offset") == [
        'exactly_group_committed_offset{group="(hidden)",partition="",topic="(hidden)"} 19.0']
    assert _samples(registry, "exactly_group_lag_offsets") == [
        'exactly_group_lag_offsets{group="(hidden)",partition="",topic="(hidden)"} 6.0']
    metrics.set_group_labels(True)
    try:
        assert _samples(registry, "exactly_group_lag_offsets") == [
            'exactly_group_lag_offsets{group="g",partition="",topic="(hidden)"} 6.0',
            'exactly_group_lag_offsets{group="secret",partition="",topic="(hidden)"} 0.0']
    finally:
        metrics.set_group_labels(False)


def test_offline_partitions_counts_no_leader_and_dead_leaders_only():
    topics = [
        TopicInfo("a", {0: ["pl-0"], 1: ["pl-1"], 2: ["pl-2"], 3: ["pl-0"]},
                  states={0: PartitionState("pl-0", 1, ("pl-0",)), 1: PartitionState(None, 2, ("pl-1",)),
                          2: PartitionState("pl-2", 1, ("pl-2",))}),  # 3: no state yet
        TopicInfo("b", {0: ["pl-0", "pl-1"]}, states={0: PartitionState("pl-0", 0, ("pl-0", "pl-1"))}),
    ]
    assert offline_partitions(topics, ["pl-0", "pl-1"]) == {"a": 2, "b": 0}
    assert offline_partitions(topics, ["pl-1", "pl-2"]) == {"a": 2, "b": 1}
    # A transaction coordinator leading the partition it owns (metadata.version 3).
    led = [TopicInfo("c", {0: ["txn-0", "pl-0"]}, states={0: PartitionState("txn-0", 3, ("txn-0", "pl-0"))})]
    assert offline_partitions(led, ["pl-0", "txn-0"]) == {"c": 0}
    assert offline_partitions(led, ["pl-0"]) == {"c": 1}


class _Owner:
    def __init__(self, parts):
        self.parts = parts

    def owned_partitions(self):
        return self.parts


def test_coordinator_partitions_by_state():
    family = coordinator_partitions("txn", [_Owner({0: True, 1: False}), _Owner({2: True})])
    assert {(s.labels["state"], s.value) for s in family.samples} == {("loading", 1), ("serving", 2)}
    assert {s.labels["kind"] for s in family.samples} == {"txn"}


class _Offsets:
    def __init__(self, committed):
        self._committed = committed  # {group: {tp: offset}}

    def groups(self):
        return set(self._committed)

    def committed_partitions(self, group):
        return sorted(self._committed[group])

    def committed(self, group, tp):
        return OffsetAndMetadata(self._committed[group][tp])


class _State:
    def __init__(self, offsets):
        self.offsets = offsets


class _Stats:
    groups_by_state = {"Stable": 1}
    members = 2
    pending_txn_offsets = 0


class _Client:
    def __init__(self, lso):
        self.lso = lso
        self.asked = []

    async def list_offset(self, topic, partition, timestamp=-1, isolation_level=0):
        self.asked.append((topic, partition, timestamp))
        if (topic, partition) not in self.lso:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
        return ErrorCode.NONE, self.lso[(topic, partition)]


class _Coordinator:
    def __init__(self, committed, client, serving=True):
        self.state = _State(_Offsets(committed))
        self.client = client
        self.serving = serving

    def owned_partitions(self):
        return {0: self.serving}

    def partition_state(self, partition):
        return self.state

    def stats(self):
        return _Stats()


def _samples(registry, name):
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines() if line.startswith(name + "{"))


def test_group_lag_is_lso_minus_committed_once_the_lso_is_known(topic_labels):
    registry = CollectorRegistry()
    collector = GroupCollector(registry=registry)
    client = _Client({("t", 0): 10, ("t", 1): 3})
    coordinator = _Coordinator({"g": {TopicPartition("t", 0): 4, TopicPartition("t", 1): 5,
                                      TopicPartition("u", 0): 1}}, client)
    collector.track(coordinator)
    assert _samples(registry, "exactly_group_lag_offsets") == []  # no LSO known yet
    assert len(_samples(registry, "exactly_group_committed_offset")) == 3
    asyncio.run(collector.refresh({TopicPartition("t", 0): client, TopicPartition("t", 1): client,
                                   TopicPartition("u", 0): client}))
    assert sorted(client.asked) == [("t", 0, -3), ("t", 1, -3), ("u", 0, -3)]
    assert _samples(registry, "exactly_group_lag_offsets") == [
        'exactly_group_lag_offsets{group="g",partition="0",topic="t"} 6.0',
        'exactly_group_lag_offsets{group="g",partition="1",topic="t"} 0.0',  # never negative
    ]  # u-0: its leader did not answer, no lag series


def test_group_lag_skips_loading_partitions():
    registry = CollectorRegistry()
    collector = GroupCollector(registry=registry)
    loading = _Coordinator({"g": {TopicPartition("t", 0): 4}}, _Client({}), serving=False)
    collector.track(loading)  # tracked weakly: kept alive here
    assert _samples(registry, "exactly_group_committed_offset") == []
    assert 'exactly_coordinator_partitions{kind="group",state="loading"} 1.0' in generate_latest(registry).decode()


def test_scrapes_are_answered_at_most_per_second_in_turn():
    """However many scrapers ask, answers go out one every 1 / per_second s."""
    from services.common.metrics import PacedExposition
    clock, slept = MockTime(0), []
    exposition = PacedExposition(CollectorRegistry(), per_second=10, clock=clock.now_s,
                                 sleep=lambda s: slept.append(round(s, 3)))
    for _ in range(5):
        exposition.wait_turn()
    assert slept == [0.1, 0.2, 0.3, 0.4]  # the first at once, then one every 0.1 s
    clock.set_ms(10_000)
    exposition.wait_turn()
    assert len(slept) == 4  # a turn long past: at once
    clock.set_ms(5_000)  # the clock stepped back 5 s: the next turn is not 5 s away
    exposition.wait_turn()
    exposition.wait_turn()
    assert slept == [0.1, 0.2, 0.3, 0.4, 0.1]

    def refused(seconds: float) -> None:
        raise OSError(22, "Invalid argument")
    exposition.sleep = refused
    exposition.wait_turn()  # a sleep the kernel refuses: the scrape is answered, unpaced
