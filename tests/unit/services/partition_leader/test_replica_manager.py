"""ReplicaManager: which partitions are open here, and the errors for the others."""
from __future__ import annotations

from exactly_wire.error_codes import ErrorCode
from services.common.cluster.state import PartitionState, TopicInfo
from services.partition_leader.replica_manager import ReplicaManager

from .conftest import make_batch, valid
from services.partition_leader.replicas import HostedReplicas


class FakeCluster:
    """The two ClusterState views the manager uses, over hand-made TopicInfo."""

    def __init__(self, topics: dict[str, TopicInfo]):
        self._topics = topics

    def topics(self):
        return dict(self._topics)

    def topic(self, name):
        return self._topics.get(name)


def topic(name, leaders, configs=None, internal=False, epochs=None):
    states = {p: PartitionState(leader, (epochs or {}).get(p, 0), (leader,)) for p, leader in enumerate(leaders)}
    return TopicInfo(name, {p: [leader] for p, leader in enumerate(leaders)}, dict(configs or {}), internal, states)


def test_refresh_opens_assigned_replicas_and_deletes_those_no_longer_assigned(tmp_path, store, clock):
    cluster = FakeCluster({"a": topic("a", ["me", "other", "me"])})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_ms=clock))
    assert m.hosted.refresh() == ([("a", 0), ("a", 2)], [])
    assert (tmp_path / "logs" / "a-0").is_dir() and not (tmp_path / "logs" / "a-1").exists()
    p, _ = m.hosted.get("a", 0)
    p.append(valid(make_batch(2)))
    p.maybe_snapshot(clock() + 10**9)
    assert store.offsets("a", 0) == [2]
    # Removed from the replicas (a replica leaving a coordinator-led partition): its copy goes.
    cluster._topics["a"] = topic("a", ["other", "other", "me"])
    assert m.hosted.refresh() == ([], [("a", 0)])
    assert not (tmp_path / "logs" / "a-0").exists() and store.offsets("a", 0) == []
    assert m.hosted.get("a", 0) == (None, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    # Assigned again: a new replica, caught up from the leader as any.
    cluster._topics["a"] = topic("a", ["me", "other", "me"])
    m.hosted.refresh()
    assert m.hosted.get("a", 0)[0].log_end_offset == 0
    m.hosted.close()
    assert m.hosted.partitions == {}


def test_get_errors_and_on_demand_open(tmp_path, store, clock):
    cluster = FakeCluster({"a": topic("a", ["me", "other"])})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_ms=clock))
    assert m.hosted.get("nope", 0) == (None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert m.hosted.get("a", 5) == (None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert m.hosted.get("a", 1) == (None, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    p, err = m.hosted.get("a", 0)  # assigned but not refreshed yet
    assert err == ErrorCode.NONE and p.topic == "a" and ("a", 0) in m.hosted.partitions


def test_hosts_topic_limits_the_replicas_opened_here(tmp_path, store, clock):
    """A process hosting one internal topic (ReplicaHost's predicate) opens only its
    replicas, answers NOT_LEADER_OR_FOLLOWER for the others even where it is named
    leader, and leaves the other topics' directories alone as not its own."""
    cluster = FakeCluster({"a": topic("a", ["me", "me"]),
                           "__transaction_state": topic("__transaction_state", ["me", "other"], internal=True)})
    (tmp_path / "logs" / "gone-0").mkdir(parents=True)  # a deleted topic's replica: not for this host
    (tmp_path / "logs" / "__transaction_state-7").mkdir()  # one of its own deleted partitions' topic: kept
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_ms=clock,
                                      hosts_topic=lambda name: name == "__transaction_state"))
    assert m.hosted.refresh() == ([("__transaction_state", 0)], [])
    assert not (tmp_path / "logs" / "a-0").exists()
    assert m.hosted.get("a", 0) == (None, ErrorCode.NOT_LEADER_OR_FOLLOWER)  # named leader, not hosted
    assert m.hosted.get("__transaction_state", 0)[1] == ErrorCode.NONE
    assert m.hosted.orphaned_logs() == []
    cluster._topics.pop("__transaction_state")
    assert [tp for tp, _ in m.hosted.orphaned_logs()] == [("__transaction_state", 7)]
    every = ReplicaManager(HostedReplicas("me", tmp_path / "all", {}, cluster, store, clock, monotonic_ms=clock))
    assert every.hosted.refresh() == ([("a", 0), ("a", 1)], [])


def test_topic_configs_override_process_settings(tmp_path, store, clock):
    cluster = FakeCluster({"a": topic("a", ["me"], {"segment.bytes": "300"}), "b": topic("b", ["me"]),
                           "__consumer_offsets": topic("__consumer_offsets", ["me"], internal=True,
                                                       epochs={0: 4})})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {"log.segment.bytes": "5000", "producer.id.expiration.ms": "7"},
                       cluster, store, clock, monotonic_ms=clock))
    m.hosted.refresh()
    a, b = m.hosted.partitions[("a", 0)], m.hosted.partitions[("b", 0)]
    assert a.config.log.segment_bytes == 300 and b.config.log.segment_bytes == 5000
    assert a.producers.expiration_ms == 7
    internal = m.hosted.partitions[("__consumer_offsets", 0)]
    assert internal.producers.internal and not a.producers.internal
    assert internal.leader_epoch == 4


def test_periodic_work_covers_every_partition(tmp_path, store, clock):
    cluster = FakeCluster({"a": topic("a", ["me", "me"])})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {"producer.snapshot.interval.ms": "100",
                                        "producer.id.expiration.ms": "1000"}, cluster, store, clock, monotonic_ms=clock))
    m.hosted.refresh()
    for p in m.hosted:
        p.append(valid(make_batch(1, pid=p.partition + 1, seq=0, ts=clock())))
    clock.advance(100)
    assert m.hosted.maybe_snapshot_all() == 2
    assert m.hosted.maybe_snapshot_all() == 0
    clock.advance(1000)
    assert m.hosted.expire_producers() == 2


# ---------------------------------------------------------------- replication roles

def replicated(name, leader, epoch, isr, replicas=("me", "x", "y"), version=0):
    return TopicInfo(name, {0: list(replicas)}, {}, False,
                     {0: PartitionState(leader, epoch, tuple(isr), version=version)})


def test_roles_follow_the_partition_state(tmp_path, store, clock):
    cluster = FakeCluster({"r": replicated("r", "x", 0, ("me", "x", "y"))})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {"replica.lag.time.max.ms": "1000"}, cluster, store, clock, monotonic_ms=clock))
    assert m.hosted.refresh() == ([("r", 0)], []) and m.hosted.changed == {("r", 0)}
    p = m.hosted.replicas[("r", 0)]
    assert not p.is_leader and m.hosted.partitions == {}
    assert m.hosted.follower_targets() == {("r", 0): ("x", 0)}
    assert m.hosted.get("r", 0) == (None, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    # Elected: leader of epoch 1, the epoch recorded at our log end.
    cluster._topics["r"] = replicated("r", "me", 1, ("me", "y"), version=1)
    m.hosted.refresh()
    assert m.hosted.changed == {("r", 0)} and p.is_leader and p.isr == ("me", "y") and p.leader_epoch == 1
    assert m.hosted.get("r", 0) == (p, ErrorCode.NONE) and m.hosted.follower_targets() == {}
    assert p.epochs.entries[-1] == (1, 0)
    # A newer ISR of the same epoch (the controller's) is adopted without a role change.
    cluster._topics["r"] = replicated("r", "me", 1, ("me",), version=2)
    m.hosted.refresh()
    assert m.hosted.changed == set() and p.isr == ("me",) and p.replication.zk_version == 2
    # A stale state (older epoch) is ignored.
    cluster._topics["r"] = replicated("r", "x", 0, ("x",), version=3)
    m.hosted.refresh()
    assert p.is_leader and p.leader_epoch == 1
    # Deposed: follower of the new leader; offline: no leader to follow.
    cluster._topics["r"] = replicated("r", "y", 2, ("y",), version=4)
    m.hosted.refresh()
    assert not p.is_leader and m.hosted.follower_targets() == {("r", 0): ("y", 2)}
    cluster._topics["r"] = replicated("r", None, 3, ("y",), version=5)
    m.hosted.refresh()
    assert m.hosted.follower_targets() == {} and m.hosted.get("r", 0) == (None, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    m.hosted.close()


def test_replica_fetches_drive_the_isr_and_high_watermark(tmp_path, store, clock):
    cluster = FakeCluster({"r": replicated("r", "me", 0, ("me", "x"))})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {"replica.lag.time.max.ms": "1000", "min.insync.replicas": "2"},
                       cluster, store, clock, monotonic_ms=clock))
    requested = []
    m.hosted.on_isr_update = requested.append
    m.hosted.refresh()
    p = m.hosted.replicas[("r", 0)]
    assert p.append(valid(make_batch(3)), -1).error == ErrorCode.NONE and p.high_watermark == 0
    assert m.fetch_for_follower("r", 0, "x", 0, 1 << 20, 0).high_watermark == 0
    res = m.fetch_for_follower("r", 0, "x", 3, 1 << 20, 0)
    assert res.hw_changed and res.high_watermark == 3 and res.records == b""
    # y catches up from outside the ISR: an ISR update is asked for.
    m.fetch_for_follower("r", 0, "y", 3, 1 << 20, 0)
    assert requested == [("r", 0)] and m.hosted.desired_isr(("r", 0)) == ("me", "x", "y")
    # ... unless y is not registered any more.
    m.hosted.is_live = lambda node: node != "y"
    assert m.hosted.desired_isr(("r", 0)) is None
    # x stops fetching: after replica.lag.time.max.ms it leaves the ISR.
    clock.advance(1001)
    assert m.hosted.isr_updates() == [("r", 0)] and m.hosted.desired_isr(("r", 0)) == ("me",)
    assert m.fetch_for_follower("nope", 0, "x", 0, 1, 0).error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    err, answer = m.end_offset_for_epoch("r", 0, 0, 0)
    assert err == ErrorCode.NONE and tuple(answer) == (0, 3)
    m.hosted.close()


def test_leases(tmp_path, store, clock, now):
    cluster = FakeCluster({"r": replicated("r", "me", 0, ("me",))})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_s=now.now_s, monotonic_ms=clock))
    m.hosted.refresh()
    p = m.hosted.replicas[("r", 0)]
    assert m.hosted.lease_valid(p)  # no leases kept: leadership needs no confirmation
    m.hosted.lease_ms = 3000
    cluster._topics["r"] = replicated("r", "me", 1, ("me",))
    m.hosted.refresh()
    assert not m.hosted.lease_valid(p)  # a new epoch waits for its first confirmation
    p.lease_until = now.now_s() + 3
    assert m.hosted.lease_valid(p)
    now.advance(3000)
    assert not m.hosted.lease_valid(p)
    p.lease_until = now.now_s() + 3
    m.hosted.invalidate_leases()
    assert not m.hosted.lease_valid(p)
    m.hosted.close()


def test_deleted_topic_removes_directory_and_snapshots(tmp_path, store, clock):
    cluster = FakeCluster({"a": topic("a", ["me"]), "b": topic("b", ["me"])})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_ms=clock))
    m.hosted.refresh()
    p, _ = m.hosted.get("a", 0)
    p.append(valid(make_batch(2)))
    p.take_snapshot()
    assert store.offsets("a", 0) == [2]
    del cluster._topics["a"]
    assert m.hosted.refresh() == ([], [("a", 0)])
    assert not (tmp_path / "logs" / "a-0").exists() and store.offsets("a", 0) == []
    assert (tmp_path / "logs" / "b-0").is_dir()
    # A directory of a topic deleted while this process was down.
    (tmp_path / "logs" / "gone-3").mkdir()
    store.put("gone", 3, 10, b"snapshot")
    orphans = m.hosted.orphaned_logs()
    assert orphans == [(("gone", 3), tmp_path / "logs" / "gone-3")]
    m.hosted.delete_orphaned(*orphans[0])
    assert not (tmp_path / "logs" / "gone-3").exists() and store.offsets("gone", 3) == []
    assert m.hosted.orphaned_logs() == []
    m.hosted.close()


def test_altered_topic_configs_apply_to_open_replicas(tmp_path, store, clock):
    cluster = FakeCluster({"a": topic("a", ["me"])})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_ms=clock))
    m.hosted.refresh()
    p, _ = m.hosted.get("a", 0)
    assert p.config.log.segment_bytes == 1073741824
    cluster._topics["a"] = topic("a", ["me"], {"segment.bytes": "200", "min.insync.replicas": "3"})
    m.hosted.refresh()
    assert (p.config.log.segment_bytes, p.log.config.segment_bytes, p.config.min_insync_replicas) == (200, 200, 3)
    for _ in range(4):
        p.append(valid(make_batch(3)))
    assert len(list((tmp_path / "logs" / "a-0").glob("*.log"))) > 1
    m.hosted.close()


def test_a_leader_adopts_replicas_added_and_removed_within_its_epoch(tmp_path, store, clock):
    """A coordinator-led internal partition (metadata.version 3): its new owner is added
    as a replica and the one leaving removed without a new leader epoch; the leader
    tracks the new follower (its fetches are accepted) and forgets the removed one."""
    def state(replicas, isr, version):
        return TopicInfo("__transaction_state", {0: list(replicas)}, {}, True,
                         {0: PartitionState("me", 3, tuple(isr), version=version)})
    cluster = FakeCluster({"__transaction_state": state(("me", "old"), ("me", "old"), 1)})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_ms=clock))
    m.hosted.refresh()
    p, _ = m.hosted.get("__transaction_state", 0)
    assert p.is_leader and set(p.replication.followers) == {"old"}
    assert m.fetch_for_follower("__transaction_state", 0, "txn-1", 0, 1024, 3).error == \
        ErrorCode.REPLICA_NOT_AVAILABLE
    cluster._topics["__transaction_state"] = state(("txn-1", "me", "old"), ("me", "old"), 1)
    m.hosted.refresh()
    assert ("__transaction_state", 0) in m.hosted.changed and p.leader_epoch == 3
    assert p.replicas == ("txn-1", "me", "old") and set(p.replication.followers) == {"old", "txn-1"}
    assert m.fetch_for_follower("__transaction_state", 0, "txn-1", 0, 1024, 3).error == ErrorCode.NONE
    # The controller drops "old" from the replicas and the ISR together.
    cluster._topics["__transaction_state"] = state(("txn-1", "me"), ("me",), 2)
    m.hosted.refresh()
    assert p.replication.isr == ("me",) and set(p.replication.followers) == {"txn-1"}
    m.hosted.close()


def test_min_insync_replicas_counts_only_the_replicas_that_stay(tmp_path, store, clock):
    """The first claim at level 3 of an RF 1 partition lists two replicas, one leaving:
    min.insync.replicas 2 set cluster-wide must not start refusing its appends."""
    info = TopicInfo("__transaction_state", {0: ["txn-0", "me"]}, {"min.insync.replicas": "2"}, True,
                     {0: PartitionState("me", 0, ("me",))}, removing={0: ("me",)})
    m = ReplicaManager(HostedReplicas("me", tmp_path, {}, FakeCluster({"__transaction_state": info}), store, clock,
                                      monotonic_ms=clock))
    m.hosted.refresh()
    p, _ = m.hosted.get("__transaction_state", 0)
    assert p.removing == ("me",) and p.min_insync_replicas == 1 and p.enough_replicas()
    m.hosted.close()


def test_logs_of_partitions_no_longer_assigned_here_are_listed_for_deletion(tmp_path, store, clock):
    cluster = FakeCluster({"__transaction_state": topic("__transaction_state", ["me", "other"], internal=True)})
    for name in ("__transaction_state-0", "__transaction_state-1", "__transaction_state-9", "x-0"):
        (tmp_path / "logs" / name).mkdir(parents=True)
    hosted = HostedReplicas("me", tmp_path, {}, cluster, store, clock, monotonic_ms=clock,
                            hosts_topic=lambda name: name == "__transaction_state")
    hosted.refresh()
    # -1 is assigned to "other" only; -9 is no partition of the topic; x is not hosted here.
    assert hosted.unassigned_logs() == [(("__transaction_state", 1), tmp_path / "logs" / "__transaction_state-1")]
    hosted.close()
