"""A transactional offset commit is verified once (KIP-890 part 1, Kafka's
verificationGuards): the group coordinator asks the transaction coordinator, and the
`__consumer_offsets` leader takes that verification instead of asking again — unless
a marker of the producer reached the partition since the group coordinator's view,
when the leader asks itself. The real GroupCoordinator writes through the real
ReplicaManager (CoordinatorProduce's domain call) and tails it with its fetches."""
from __future__ import annotations

import asyncio
import itertools
import zlib

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.cluster.state import PartitionState, TopicInfo
from services.common.settings import GroupCoordinatorSchema, role_settings
from services.group_coordinator.coordinator import GroupCoordinator
from services.group_coordinator.offsets import OffsetAndMetadata
from services.partition_leader.producer_state import ProducerStateManager
from services.partition_leader.replica_manager import FetchEntry, ProduceEntry, ReplicaManager

from .test_replica_manager import FakeCluster
from .conftest import append_records
from services.partition_leader.replicas import HostedReplicas

N = 2
OFFSETS = "__consumer_offsets"
PID, GROUP, TID = 7000, "g", "tx"
TP0 = TopicPartition("orders", 0)


def partition_for(group_id: str) -> int:
    return zlib.crc32(group_id.encode()) % N


class CountingVerifier:
    """The transaction coordinator: `answers` in turn (then NONE), every call recorded;
    `before` runs inside the first call (e.g. the transaction ending meanwhile)."""

    def __init__(self, answers=(), before=None):
        self.answers, self.before, self.calls = list(answers), before, []

    async def verify(self, transactional_id, producer_id, producer_epoch, topic, partition, deadline, group_id=""):
        self.calls.append((transactional_id, producer_id, producer_epoch, topic, partition))
        if self.before is not None:
            before, self.before = self.before, None
            before()
        return self.answers.pop(0) if self.answers else ErrorCode.NONE

    async def add(self, *args):
        raise AssertionError("no implicit add for a coordinator's batch")


class LeaderLog:
    """The group coordinator's LogClient over a ReplicaManager leading every
    `__consumer_offsets` partition (what ClusterClient reaches over gRPC)."""

    def __init__(self, manager: ReplicaManager):
        self.manager = manager

    async def produce(self, topic, partition, batch, acks=-1, timeout_ms=30000, transactional_id="",
                      consumer_group_id="", verified_from=None):
        [res] = await append_records(self.manager, 
            acks, [ProduceEntry(topic, partition, batch)], timeout_ms, origin="coordinator",
            transactional_id=transactional_id, consumer_group_id=consumer_group_id,
            verified_from=-1 if verified_from is None else verified_from)
        return int(res.error), res.base_offset

    async def fetch(self, topic, partition, offset, max_wait_ms=0, isolation_level=0, max_bytes=1 << 20):
        [res] = await self.manager.fetch_messages([FetchEntry(topic, partition, offset, max_bytes)],
                                                  max_wait_ms=max_wait_ms, isolation_level=isolation_level)
        return pb.FetchPartitionResponse(partition=partition, error_code=res.error,
                                         high_watermark=res.high_watermark,
                                         last_stable_offset=res.last_stable_offset,
                                         log_start_offset=res.log_start_offset, records=res.records)


def _offsets_leader(tmp_path, store, clock) -> ReplicaManager:
    cluster = FakeCluster({OFFSETS: TopicInfo(OFFSETS, {p: ["me"] for p in range(N)}, {}, True,
                                              {p: PartitionState("me", 1, ("me",), version=0) for p in range(N)})})
    manager = ReplicaManager(HostedReplicas("me", tmp_path, {}, cluster, store, clock))
    manager.hosted.refresh()
    return manager


async def _commit(manager: ReplicaManager, verifier: CountingVerifier) -> dict:
    """TxnOffsetCommit of PID's transaction through a group coordinator over `manager`,
    both using `verifier`."""
    manager.hosted.verifier = verifier
    ids = itertools.count(1)
    coord = GroupCoordinator(LeaderLog(manager), partition_for, lambda: {"orders": 1},
                             role_settings(GroupCoordinatorSchema, {"group.coordinator.tail.max.wait.ms": 50}), wall_clock=lambda: 1_700_000_000_000,
                             new_member_id=lambda _i: f"member-{next(ids)}")
    coord.verifier = verifier
    try:
        for p in range(N):
            await coord.on_elected(p, 0)
        assert await coord.wait_loaded(timeout_s=5)
        return await coord.txn_commit_offsets(TID, GROUP, PID, 0, -1, "", {TP0: OffsetAndMetadata(50, "")})
    finally:
        await coord.stop()


def test_a_txn_offset_commit_is_verified_once(tmp_path, store, clock):
    manager = _offsets_leader(tmp_path, store, clock)
    verifier = CountingVerifier()
    result = asyncio.run(asyncio.wait_for(_commit(manager, verifier), 20))
    assert result == {TP0: ErrorCode.NONE}
    assert verifier.calls == [(TID, PID, 0, OFFSETS, partition_for(GROUP))]  # by the group coordinator only
    p = manager.hosted.replicas[(OFFSETS, partition_for(GROUP))]
    assert PID in p.producers.ongoing.values()  # the pending transactional commit was appended
    manager.hosted.close()


def test_a_marker_after_the_group_coordinators_verification_has_the_leader_verify_again(tmp_path, store, clock):
    """The transaction the group coordinator verified ended (its marker reached the
    offsets partition) before the commit was appended: the leader asks again, the
    transaction coordinator no longer has it, and nothing is written."""
    manager = _offsets_leader(tmp_path, store, clock)
    p = manager.hosted.replicas[(OFFSETS, partition_for(GROUP))]
    markers = []
    verifier = CountingVerifier(answers=[ErrorCode.NONE, ErrorCode.INVALID_TXN_STATE],
                                before=lambda: markers.append(p.write_marker(PID, 0, False, 0)))
    result = asyncio.run(asyncio.wait_for(_commit(manager, verifier), 20))
    assert [m.error for m in markers] == [ErrorCode.NONE]
    assert result == {TP0: ErrorCode.INVALID_TXN_STATE}
    assert len(verifier.calls) == 2  # the group coordinator's, then the leader's
    assert not p.producers.ongoing  # no phantom pending offset
    manager.hosted.close()


def test_marker_since_knows_the_markers_above_where_the_state_starts():
    state = ProducerStateManager(internal=True)
    assert not state.marker_since(PID, 0)
    state.complete_marker(PID, 0, 0, 10, 0, committed=True)
    assert state.marker_since(PID, 10) and not state.marker_since(PID, 11) and not state.marker_since(PID + 1, 0)
    state.reset(20)  # rebuilt from offset 20: what lay below is unknown
    assert state.marker_since(PID + 1, 19) and not state.marker_since(PID + 1, 20)
