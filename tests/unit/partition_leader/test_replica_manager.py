"""ReplicaManager: which partitions are open here, and the errors for the others."""
from __future__ import annotations

from exactly.errors import ErrorCode
from services.common.cluster import PartitionState, TopicInfo
from services.partition_leader.replica_manager import ReplicaManager

from .conftest import make_batch


class FakeCluster:
    """The two ClusterState views the manager uses, over hand-made TopicInfo."""

    def __init__(self, topics: dict[str, TopicInfo]):
        self._topics = topics

    def topics(self):
        return dict(self._topics)

    def partitions_led_by(self, node_id):
        return sorted((t.name, p) for t in self._topics.values() for p in t.partitions if t.leader(p) == node_id)


def topic(name, leaders, configs=None, internal=False, epochs=None):
    states = {p: PartitionState(leader, (epochs or {}).get(p, 0), (leader,)) for p, leader in enumerate(leaders)}
    return TopicInfo(name, {p: [leader] for p, leader in enumerate(leaders)}, dict(configs or {}), internal, states)


def test_refresh_opens_led_partitions_and_closes_the_others(tmp_path, store, clock):
    cluster = FakeCluster({"a": topic("a", ["me", "other", "me"])})
    m = ReplicaManager("me", tmp_path, {}, cluster, store, clock)
    assert m.refresh() == ([("a", 0), ("a", 2)], [])
    assert (tmp_path / "logs" / "a-0").is_dir() and not (tmp_path / "logs" / "a-1").exists()
    p, _ = m.get("a", 0)
    p.append(make_batch(2))
    cluster._topics["a"] = topic("a", ["other", "other", "me"])
    assert m.refresh() == ([], [("a", 0)])
    assert store.offsets("a", 0) == [2]  # final snapshot on close
    assert m.get("a", 0) == (None, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    cluster._topics["a"] = topic("a", ["me", "other", "me"])
    m.refresh()
    assert m.get("a", 0)[0].log_end_offset == 2
    m.close()
    assert m.partitions == {}


def test_get_errors_and_on_demand_open(tmp_path, store, clock):
    cluster = FakeCluster({"a": topic("a", ["me", "other"])})
    m = ReplicaManager("me", tmp_path, {}, cluster, store, clock)
    assert m.get("nope", 0) == (None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert m.get("a", 5) == (None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert m.get("a", 1) == (None, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    p, err = m.get("a", 0)  # assigned but not refreshed yet
    assert err == ErrorCode.NONE and p.topic == "a" and ("a", 0) in m.partitions


def test_topic_configs_override_process_settings(tmp_path, store, clock):
    cluster = FakeCluster({"a": topic("a", ["me"], {"segment.bytes": "300"}), "b": topic("b", ["me"]),
                           "__consumer_offsets": topic("__consumer_offsets", ["me"], internal=True,
                                                       epochs={0: 4})})
    m = ReplicaManager("me", tmp_path, {"log.segment.bytes": "5000", "producer.id.expiration.ms": "7"},
                       cluster, store, clock)
    m.refresh()
    a, b = m.partitions[("a", 0)], m.partitions[("b", 0)]
    assert a.config.log.segment_bytes == 300 and b.config.log.segment_bytes == 5000
    assert a.producers.expiration_ms == 7
    internal = m.partitions[("__consumer_offsets", 0)]
    assert internal.producers.internal and not a.producers.internal
    assert internal.leader_epoch == 4


def test_periodic_work_covers_every_partition(tmp_path, store, clock):
    cluster = FakeCluster({"a": topic("a", ["me", "me"])})
    m = ReplicaManager("me", tmp_path, {"producer.snapshot.interval.ms": "100",
                                        "producer.id.expiration.ms": "1000"}, cluster, store, clock)
    m.refresh()
    for p in m:
        p.append(make_batch(1, pid=p.partition + 1, seq=0, ts=clock.now))
    clock.advance(100)
    assert m.maybe_snapshot_all() == 2
    assert m.maybe_snapshot_all() == 0
    clock.advance(1000)
    assert m.expire_producers() == 2
