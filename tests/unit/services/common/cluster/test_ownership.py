"""CoordinatorOwnership's claims in ZooKeeper (services/common/cluster/ownership.py) over an
in-memory znode store: the coordinator epoch and the writer epoch rise with every
claim, the writer PID comes from the PID blocks and is rotated (and retired) before
its epoch overflows int16, a lost compare-and-set is retried, the partition rule
sorted(live)[p % n], and resignation when the znode names another owner."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from exactly_wire import records
from services.common.cluster.state import NodeInfo, TopicInfo
from services.common.cluster.ownership import (MAX_WRITER_EPOCH, RETIRED_WRITER_EPOCH, CoordinatorOwnership,
                                               fence_batches, is_fence_record)

PATH = "/exactly/coordinators/txn/0"


class FakeZk:
    """get/set/create with versions, like kazoo's; `race` changes the znode once
    between a get and the next set."""

    def __init__(self):
        self.nodes: dict[str, tuple[bytes, int]] = {}
        self.race: bytes | None = None

    def get(self, path):
        if path not in self.nodes:
            raise NoNodeError()
        data, version = self.nodes[path]
        if self.race is not None:
            self.nodes[path] = (self.race, version + 1)
            self.race = None
        return data, SimpleNamespace(version=version)

    def set(self, path, data, version=-1):
        if self.nodes[path][1] != version:
            raise BadVersionError()
        self.nodes[path] = (data, version + 1)

    def create(self, path, data, makepath=False):
        if path in self.nodes:
            raise NodeExistsError()
        self.nodes[path] = (data, 0)


class FakeCluster:
    def __init__(self, node_id: str, live: list[str], zk: FakeZk | None = None, partitions: int = 4):
        self.node_id = node_id
        self.zk = zk or FakeZk()
        self.live = live
        self.partitions = partitions
        self.next_pid = 1000
        self.registered = True
        self.metadata_version = 2  # below 3: claims write only the claim znode

    def allocate_producer_id_block(self, size: int = 1000):
        first = self.next_pid
        self.next_pid += size
        return first, first + size - 1

    def nodes(self):
        return {n: NodeInfo(n, "txn_coordinator", "127.0.0.1", 1) for n in self.live}

    def topics(self):
        return {"__transaction_state": TopicInfo("__transaction_state", {p: ["pl-0"] for p in range(self.partitions)})}

    def topic(self, name):
        return self.topics().get(name)

    def coordinator_owner(self, kind, partition):
        data, _ = self.zk.get(f"/exactly/coordinators/{kind}/{partition}")
        d = json.loads(data)
        return d["owner"], d["coordinator_epoch"]


async def _noop(*args, **kwargs):
    return None


def ownership(cluster: FakeCluster, elected=None, resigned=None) -> CoordinatorOwnership:
    return CoordinatorOwnership(cluster, "txn", elected or _noop, resigned or _noop)


def znode(zk: FakeZk) -> dict:
    return json.loads(zk.nodes[PATH][0])


def test_claims_bump_both_epochs_and_keep_the_writer_pid():
    zk = FakeZk()
    a = ownership(FakeCluster("txn-0", ["txn-0"], zk))
    b = ownership(FakeCluster("txn-1", ["txn-1"], zk))
    first = a._claim(0)
    assert (first.coordinator_epoch, first.producer_id, first.producer_epoch, first.retired_producer_id) == \
        (0, 1000, 0, -1)
    second = b._claim(0)
    assert (second.coordinator_epoch, second.producer_id, second.producer_epoch) == (1, 1000, 1)
    assert znode(zk) == {"version": 1, "owner": "txn-1", "coordinator_epoch": 1, "producer_id": 1000,
                         "producer_epoch": 1, "retired_producer_id": -1}
    again = a._claim(0)  # a restart of the same owner also bumps
    assert (again.coordinator_epoch, again.producer_epoch) == (2, 2)


def test_writer_pid_is_rotated_before_the_epoch_overflows():
    zk = FakeZk()
    zk.nodes[PATH] = (json.dumps({"owner": "txn-0", "coordinator_epoch": 40000, "producer_id": 7,
                                  "producer_epoch": MAX_WRITER_EPOCH}).encode(), 3)
    claim = ownership(FakeCluster("txn-1", ["txn-1"], zk))._claim(0)
    assert (claim.coordinator_epoch, claim.producer_id, claim.producer_epoch, claim.retired_producer_id) == \
        (40001, 1000, 0, 7)
    later = ownership(FakeCluster("txn-0", ["txn-0"], zk))._claim(0)
    assert (later.producer_id, later.producer_epoch, later.retired_producer_id) == (1000, 1, 7)
    closing, own = (records.parse_header(b) for b in fence_batches(1000, 1, 7, 0))
    assert (closing.producer_id, closing.producer_epoch) == (7, RETIRED_WRITER_EPOCH)
    assert (own.producer_id, own.producer_epoch, own.base_sequence) == (1000, 1, records.NO_SEQUENCE)


def test_claim_written_by_an_old_version_without_writer_gets_one():
    zk = FakeZk()
    zk.nodes[PATH] = (json.dumps({"owner": "txn-0", "coordinator_epoch": 5}).encode(), 0)
    claim = ownership(FakeCluster("txn-0", ["txn-0"], zk))._claim(0)
    assert (claim.coordinator_epoch, claim.producer_id, claim.producer_epoch) == (6, 1000, 0)


def test_lost_compare_and_set_is_retried_on_the_new_value():
    zk = FakeZk()
    zk.nodes[PATH] = (json.dumps({"owner": "txn-0", "coordinator_epoch": 1, "producer_id": 9,
                                  "producer_epoch": 1}).encode(), 0)
    zk.race = json.dumps({"owner": "txn-2", "coordinator_epoch": 2, "producer_id": 9, "producer_epoch": 2}).encode()
    claim = ownership(FakeCluster("txn-1", ["txn-1"], zk))._claim(0)
    assert (claim.coordinator_epoch, claim.producer_epoch) == (3, 3)


def test_partitions_are_spread_over_the_sorted_live_coordinators():
    o = ownership(FakeCluster("txn-1", ["txn-2", "txn-0", "txn-1"], partitions=7))
    assert o.desired() == {1, 4}
    o._lost = True
    assert o.desired() == set()


def test_a_partition_is_unloaded_until_the_coordinator_lists_it_as_loaded():
    # Readiness and health ask `unloaded`: a partition this process should own, or has
    # claimed before the coordinator heard of it, must not count as served.
    cluster = FakeCluster("txn-0", ["txn-0", "txn-1"], partitions=4)
    o = ownership(cluster)
    assert o.in_view()
    assert o.unloaded({}) == {0, 2}  # should own, not claimed yet
    o._owned[0] = o._claim(0)
    assert o.unloaded({}) == {0, 2}  # claimed, the coordinator not told yet
    assert o.unloaded({0: False}) == {0, 2}  # loading
    assert o.unloaded({0: True}) == {2}
    assert o.unloaded({0: True, 2: True}) == set()
    cluster.live = ["txn-0", "txn-1", "txn-2"]  # a view change: partition 3 is ours, 2 is not
    assert o.unloaded({0: True, 2: True}) == {3}
    assert o.unloaded({0: True, 2: True, 3: False}) == {3}
    cluster.registered = False  # nothing desired; what is held still counts
    assert not o.in_view()
    assert o.unloaded({0: False}) == {0}
    cluster.registered, cluster.live = True, ["txn-1"]  # registered, not yet in the view
    assert not o.in_view()


def test_nothing_is_claimed_before_this_process_is_registered():
    # A restarted process sees its node_id listed by its killed incarnation, whose
    # session has not expired: it must not claim from that view (it would resign
    # everything when registering replaces the znode, and claim again, so markers of a
    # rolled-forward transaction would be written twice).
    cluster = FakeCluster("txn-0", ["txn-0"], partitions=2)
    cluster.registered = False
    o = ownership(cluster)
    assert o.desired() == set()
    asyncio.run(o._reconcile())
    assert o.owned == {} and cluster.zk.nodes == {}
    cluster.registered = True
    assert o.desired() == {0, 1}


def test_resigns_when_the_znode_names_a_newer_owner_and_when_fenced():
    async def body():
        zk = FakeZk()
        cluster = FakeCluster("txn-0", ["txn-0"], zk, partitions=1)
        cluster.zk.DataWatch = lambda path, fn: fn(zk.nodes[path][0], None, None)
        elected, resigned = [], []

        async def on_elected(p, epoch, **writer):
            elected.append((p, epoch, writer))

        resign_calls = asyncio.Queue()

        async def on_resigned(p):
            resigned.append(p)
            resign_calls.put_nowait(p)

        o = ownership(cluster, on_elected, on_resigned)
        o._loop = asyncio.get_running_loop()
        await o._reconcile()
        assert elected == [(0, 0, {"producer_id": 1000, "producer_epoch": 0, "retired_producer_id": -1})]
        assert o.owned == {0: 0}
        # Another process claims it: the watch resigns us.
        zk.nodes[PATH] = (json.dumps({"owner": "txn-1", "coordinator_epoch": 1}).encode(), 9)
        o._on_owner_change(0, zk.nodes[PATH][0], None, None)
        assert await resign_calls.get() == 0
        assert resigned == [0] and o.owned == {}
        # Claimed again. A late notification of the claim before ours (kazoo re-reads the
        # znode when a session starts) is stale: no resignation.
        await o._reconcile()
        assert o.owned == {0: 2}
        o._on_owner_change(0, json.dumps({"owner": "txn-1", "coordinator_epoch": 1}).encode(), None, None)
        for _ in range(20):
            await asyncio.sleep(0)
        assert o.owned == {0: 2} and resign_calls.empty()
        # Then fenced by the partition leader: resign at once.
        o.fenced(0, 1)  # an older claim: ignored
        for _ in range(20):  # let anything it might have started run
            await asyncio.sleep(0)
        assert o.owned == {0: 2} and resign_calls.empty()
        o.fenced(0, 2)
        assert await resign_calls.get() == 0
        assert resigned == [0, 0] and o.owned == {}

    asyncio.run(asyncio.wait_for(body(), 5))


def test_fence_records_have_an_empty_key():
    assert is_fence_record(b"") and not is_fence_record(None) and not is_fence_record(b"t")


def test_a_claim_multi_op_that_lost_a_race_is_retried_and_other_failures_raise():
    """ZooKeeper answers a failed multi-op with the failing op's error, RolledBack before
    it and RuntimeInconsistency after it (the level-3 claim: features check, claim, topic)."""
    import pytest
    from kazoo.exceptions import ConnectionLoss, RolledBackError, RuntimeInconsistency

    own = CoordinatorOwnership(FakeCluster("txn-0", ["txn-0"]), "txn", None, None)
    tx = SimpleNamespace(commit=lambda: [RolledBackError(), NodeExistsError(), RuntimeInconsistency()])
    assert own._committed(tx, 0) is False
    tx = SimpleNamespace(commit=lambda: [BadVersionError(), RuntimeInconsistency(), RuntimeInconsistency()])
    assert own._committed(tx, 0) is False
    assert own._committed(SimpleNamespace(commit=lambda: [True, True]), 0) is True
    with pytest.raises(ConnectionLoss):
        own._committed(SimpleNamespace(commit=lambda: [RolledBackError(), ConnectionLoss()]), 0)
