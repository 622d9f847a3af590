"""Two replicas of one partition driven by hand: the follower copies the leader's
batches byte for byte and ends with the same producer state, aborted index and leader
epochs; acks=all needs min.insync.replicas; on a leader change the old leader
truncates its divergent tail (KIP-101), never below its high watermark, and the new
leader keeps deduplicating and fencing."""
from __future__ import annotations

import pytest

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from services.partition_leader.leader_epoch import EpochEntry
from services.partition_leader.log import LogConfig
from services.partition_leader.partition import Partition, PartitionConfig
from services.partition_leader.producer_state import entries_equal
from services.partition_leader.replication import truncation_offset
from services.partition_leader.snapshot_store import SnapshotStore

from .conftest import make_batch, valid

PID = 7007
REPLICAS = ("a", "b")


@pytest.fixture
def pair(tmp_path, clock):
    """(leader "a", follower "b") of partition t-0, each with its own directory and store."""
    stores, parts = [], []
    config = PartitionConfig(LogConfig(segment_bytes=2048, index_interval_bytes=256), min_insync_replicas=2)
    for node in REPLICAS:
        store = SnapshotStore(tmp_path / node / "producer-state")
        stores.append(store)
        parts.append(Partition.open("t", 0, tmp_path / node, config, store, clock_ms=clock, monotonic_ms=clock, local_id=node,
                                    single_replica=False))
    a, b = parts
    a.become_leader(0, REPLICAS, REPLICAS, zk_version=0)
    b.become_follower("a", 0, REPLICAS)
    yield a, b
    for p in parts:
        p.log.close()
    for s in stores:
        s.close()


def replicate(leader: Partition, follower: Partition) -> None:
    """Fetch rounds until the follower has everything, the leader knows it, and both
    know the high watermark."""
    for _ in range(20):
        res = leader.fetch_for_follower(follower.local_id, follower.log_end_offset, 1 << 20, leader.leader_epoch)
        assert res.error == ErrorCode.NONE, res
        follower.append_as_follower(res.records)
        follower.update_follower_high_watermark(res.high_watermark)
        seen = leader.replication.followers[follower.local_id].log_end_offset
        if seen == follower.log_end_offset == leader.log_end_offset == leader.high_watermark == \
                follower.high_watermark:
            return
    raise AssertionError("replication did not converge")


def log_bytes(p: Partition) -> bytes:
    return b"".join(s.read_at(0, s.size) for s in p.log.segments)


def aborted(p: Partition):
    return [e for s in p.log.segments for e in s.aborted]


def test_the_follower_builds_the_same_log_producer_state_and_aborted_index(pair):
    a, b = pair
    assert a.append(valid(make_batch(3, pid=PID, seq=0)), -1).error == ErrorCode.NONE
    assert a.append(valid(make_batch(2, pid=PID + 1, seq=0, txn=True)), -1).error == ErrorCode.NONE
    assert a.append(valid(make_batch(2, pid=PID + 2, seq=0, txn=True)), -1).error == ErrorCode.NONE
    assert a.write_marker(PID + 1, 0, False, 3).error == ErrorCode.NONE
    assert a.append(valid(make_batch(4)), -1).error == ErrorCode.NONE
    assert a.high_watermark == 0  # nothing is committed before the follower has it
    replicate(a, b)
    assert a.high_watermark == b.high_watermark == a.log_end_offset == 12
    assert log_bytes(a) == log_bytes(b)
    assert entries_equal(a.producers.producers.values(), b.producers.producers.values())
    assert a.producers.ongoing == b.producers.ongoing == {5: PID + 2}
    assert aborted(a) == aborted(b) and len(aborted(b)) == 1
    assert b.epochs.entries == a.epochs.entries == [EpochEntry(0, 0)]
    # The LSO is bounded by the high watermark (here the open transaction of PID + 2).
    assert a.last_stable_offset == 5


def test_consumers_read_only_below_the_high_watermark(pair):
    a, b = pair
    a.append(valid(make_batch(3)), 1)
    assert a.log_end_offset == 3 and a.high_watermark == 0
    empty = a.fetch(0, 1 << 20)
    assert empty.error == ErrorCode.NONE and empty.records == b"" and empty.high_watermark == 0
    assert a.list_offset(-1) == (ErrorCode.NONE, 0, -1)
    assert a.fetch(4, 1 << 20).error == ErrorCode.OFFSET_OUT_OF_RANGE  # beyond the log end
    replicate(a, b)
    assert len(list(records.iter_batches(a.fetch(0, 1 << 20).records))) == 1


def test_acks_all_needs_min_insync_replicas_before_appending(pair, clock):
    a, b = pair
    replicate(a, b)
    a.set_isr(("a",), 1)
    res = a.append(valid(make_batch(2, pid=PID, seq=0)), -1)
    assert res.error == ErrorCode.NOT_ENOUGH_REPLICAS and a.log_end_offset == 0
    assert a.write_marker(PID, 0, True, 0).error == ErrorCode.NOT_ENOUGH_REPLICAS
    assert a.log_end_offset == 0
    # acks=1 is still accepted (and committed at once with the ISR of one).
    assert a.append(valid(make_batch(2, pid=PID, seq=0)), 1).error == ErrorCode.NONE
    assert a.high_watermark == 2
    # The follower catches up and is a candidate for the ISR again.
    replicate(a, b)
    assert a.isr_expand_candidate("b", 10_000) == ("a", "b")
    a.set_isr(("a", "b"), 2)
    assert a.append(valid(make_batch(1, pid=PID, seq=2)), -1).error == ErrorCode.NONE


def test_min_insync_replicas_is_capped_at_the_replication_factor(tmp_path, clock):
    p = Partition.open("t", 0, tmp_path, PartitionConfig(min_insync_replicas=2), clock_ms=clock, monotonic_ms=clock)
    assert p.min_insync_replicas == 1
    assert p.append(valid(make_batch(1)), -1).error == ErrorCode.NONE


def test_follower_role_refuses_client_writes(pair):
    _, b = pair
    assert b.append(valid(make_batch(1)), 1).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert b.write_marker(PID, 0, True, 0).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert b.fetch_for_follower("a", 0, 100).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert b.end_offset_for_epoch(0)[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_replica_fetch_checks_epoch_replica_and_offset(pair):
    a, _ = pair
    a.append(valid(make_batch(2)), 1)
    assert a.fetch_for_follower("b", 0, 100, current_leader_epoch=1).error == ErrorCode.UNKNOWN_LEADER_EPOCH
    a.become_leader(2, REPLICAS, REPLICAS, 3)
    assert a.fetch_for_follower("b", 0, 100, current_leader_epoch=1).error == ErrorCode.FENCED_LEADER_EPOCH
    assert a.fetch_for_follower("zz", 0, 100).error == ErrorCode.REPLICA_NOT_AVAILABLE
    assert a.fetch_for_follower("b", 3, 100).error == ErrorCode.OFFSET_OUT_OF_RANGE


def test_leader_change_truncates_the_divergent_tail_and_keeps_deduplicating(pair):
    a, b = pair
    first = make_batch(3, pid=PID, seq=0)
    assert a.append(valid(first), -1).error == ErrorCode.NONE
    replicate(a, b)
    # "a" appends two batches nobody replicated, then "b" is elected in epoch 1.
    a.append(valid(make_batch(2, pid=PID, seq=3)), 1)
    a.append(valid(make_batch(2, pid=PID + 5, seq=0, txn=True)), 1)
    assert a.log_end_offset == 7 and a.high_watermark == 3
    b.become_leader(1, REPLICAS, ("b",), 5)
    a.become_follower("b", 1, REPLICAS)
    assert b.epochs.entries == [EpochEntry(0, 0), EpochEntry(1, 3)]
    # The new leader deduplicates a retry of the replicated batch and accepts the
    # next sequence (the unreplicated batch is resent by the producer).
    dup = b.append(valid(first), 1)
    assert (dup.error, dup.base_offset, dup.last_offset) == (ErrorCode.DUPLICATE_SEQUENCE_NUMBER, 0, 2)
    assert b.append(valid(make_batch(2, pid=PID, seq=3, value_size=10)), 1).error == ErrorCode.NONE
    assert b.append(valid(make_batch(2, pid=PID, seq=3)), 1).error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    # The old leader asks where epoch 0 ends at the new leader and truncates there.
    err, answer = b.end_offset_for_epoch(a.epochs.latest_epoch, current_leader_epoch=1)
    assert err == ErrorCode.NONE and tuple(answer) == (0, 3)
    offset, complete = truncation_offset(answer, a.epochs, a.log_end_offset, a.high_watermark)
    assert (offset, complete) == (3, True)
    a.truncate_to(offset)
    assert a.log_end_offset == 3 and a.producers.ongoing == {}
    assert a.producers.entry(PID).last_seq == 2 and a.producers.entry(PID + 5) is None
    replicate(b, a)
    assert log_bytes(a) == log_bytes(b)
    assert a.epochs.entries == b.epochs.entries
    assert entries_equal(a.producers.producers.values(), b.producers.producers.values())


def test_truncation_never_goes_below_the_high_watermark(pair):
    a, b = pair
    a.append(valid(make_batch(2)), -1)
    replicate(a, b)
    assert b.high_watermark == 2
    a.append(valid(make_batch(2)), 1)
    replicate(a, b)
    b.high_watermark = 2  # as if the last high watermark had not arrived yet
    assert b.truncate_to(0) == 2 and b.log_end_offset == 2
    assert b.truncate_to(3) == 2  # rounded down to the start of the batch holding offset 3


def test_truncation_rebuilds_from_an_older_snapshot(pair):
    a, b = pair
    a.append(valid(make_batch(2, pid=PID, seq=0)), -1)
    replicate(a, b)
    b.take_snapshot()
    a.append(valid(make_batch(2, pid=PID, seq=2)), 1)
    replicate(a, b)
    b.take_snapshot()
    assert b.store.offsets("t", 0) == [2, 4]
    b.high_watermark = 2
    b.truncate_to(2)
    assert b.store.offsets("t", 0) == [2] and b.snapshot_loaded_from == 2
    assert b.producers.entry(PID).last_seq == 1


def test_high_watermark_checkpoint_survives_a_restart(tmp_path, clock, store):
    config = PartitionConfig(min_insync_replicas=1)
    p = Partition.open("t", 0, tmp_path, config, store, clock_ms=clock, monotonic_ms=clock, local_id="b", single_replica=False)
    p.become_follower("a", 0, ("a", "b"))
    leader = Partition.open("t", 0, tmp_path / "a", config, clock_ms=clock, monotonic_ms=clock, local_id="a", single_replica=False)
    leader.become_leader(0, ("a", "b"), ("a", "b"))
    leader.append(valid(make_batch(3)), -1)
    replicate(leader, p)
    leader.append(valid(make_batch(3)), 1)
    res = leader.fetch_for_follower("b", p.log_end_offset, 1 << 20)
    p.append_as_follower(res.records)  # the tail beyond the high watermark
    assert (p.log_end_offset, p.high_watermark) == (6, 3)
    p.close()
    again = Partition.open("t", 0, tmp_path, config, store, clock_ms=clock, monotonic_ms=clock, local_id="b", single_replica=False)
    assert (again.log_end_offset, again.high_watermark) == (6, 3)
    assert again.epochs.entries == [EpochEntry(0, 0)]
    again.log.close()
    leader.log.close()


def test_a_log_without_an_epoch_checkpoint_rebuilds_it_from_the_batches(tmp_path, clock, store):
    p = Partition.open("t", 0, tmp_path, PartitionConfig(), store, clock_ms=clock, monotonic_ms=clock, leader_epoch=2)
    p.append(valid(make_batch(2)))
    p.leader_epoch = 4
    p.append(valid(make_batch(1)))
    p.close()
    (tmp_path / "logs" / "t-0" / "leader-epoch-checkpoint").unlink()
    again = Partition.open("t", 0, tmp_path, PartitionConfig(), store, clock_ms=clock, monotonic_ms=clock)
    assert again.epochs.entries == [EpochEntry(2, 0), EpochEntry(4, 2)]
    again.close()


def test_read_committed_waits_until_the_marker_is_replicated(pair):
    """A transaction's marker that only the leader has could be lost in a leader
    change: until the high watermark passes it, the LSO stays at the transaction's
    first offset (Kafka's unreplicated transactions), so read_committed readers see
    nothing of it and the LSO does not go back when the follower takes over."""
    a, b = pair
    assert a.append(valid(make_batch(2, pid=PID, seq=0, txn=True)), -1).error == ErrorCode.NONE  # 0-1
    replicate(a, b)
    assert (a.high_watermark, a.last_stable_offset) == (2, 0)
    assert a.write_marker(PID, 0, True, 0).offset == 2
    assert a.append(valid(make_batch(1)), -1).error == ErrorCode.NONE  # 3
    assert a.high_watermark == 2 and not a.producers.ongoing
    assert a.last_stable_offset == 0
    res = a.fetch(0, 1 << 20, isolation_level=1)
    assert (res.error, res.last_stable_offset, res.records) == (ErrorCode.NONE, 0, b"")
    # The follower takes over without the marker: its LSO is where readers were.
    b.become_leader(1, REPLICAS, ("b",), zk_version=1)
    assert b.last_stable_offset == 0


def test_the_lso_passes_a_transaction_once_its_marker_is_replicated(pair):
    a, b = pair
    assert a.append(valid(make_batch(2, pid=PID, seq=0, txn=True)), -1).error == ErrorCode.NONE
    assert a.write_marker(PID, 0, True, 0).error == ErrorCode.NONE
    assert a.last_stable_offset == 0
    replicate(a, b)
    assert a.high_watermark == a.last_stable_offset == 3 and not a.producers.unreplicated
    res = a.fetch(0, 1 << 20, isolation_level=1)
    assert [h.base_offset for _, h in records.iter_batches(res.records)] == [0, 2]
    assert b.producers.unreplicated == {}  # the follower forgets them with the high watermark


def test_the_lso_never_moves_back_across_a_restart_and_a_failover(tmp_path, clock):
    """The leader writes a COMMIT marker the follower has not fetched, restarts from
    its close-time snapshot (taken past the marker), leads again, then fails over to
    the follower, which never got the marker: the LSO readers see never goes back."""
    config = PartitionConfig(LogConfig(segment_bytes=2048, index_interval_bytes=256), min_insync_replicas=2)
    stores = {n: SnapshotStore(tmp_path / n / "producer-state") for n in REPLICAS}

    def open_replica(node: str) -> Partition:
        return Partition.open("t", 0, tmp_path / node, config, stores[node], clock_ms=clock, local_id=node,
                              single_replica=False)

    a, b = open_replica("a"), open_replica("b")
    try:
        a.become_leader(0, REPLICAS, REPLICAS, zk_version=0)
        b.become_follower("a", 0, REPLICAS)
        assert a.append(valid(make_batch(2, pid=PID, seq=0, txn=True)), -1).error == ErrorCode.NONE  # 0-1
        replicate(a, b)
        assert a.write_marker(PID, 0, True, 0).offset == 2  # only the leader has it
        seen = [a.last_stable_offset]
        a.close()
        a = open_replica("a")
        assert a.snapshot_loaded_from == 3
        a.become_leader(1, REPLICAS, REPLICAS, zk_version=1)
        seen.append(a.last_stable_offset)
        a.log.close()
        b.become_leader(2, REPLICAS, ("b",), zk_version=2)
        seen.append(b.last_stable_offset)
        assert seen == [0, 0, 0]
    finally:
        for p in (a, b):
            p.log.close()
        for s in stores.values():
            s.close()
