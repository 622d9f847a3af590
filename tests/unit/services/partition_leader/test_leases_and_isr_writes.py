"""Leadership leases and ISR writes against a fake ZooKeeper view: a lease needs the
state to name this node in the same epoch, written after this process registered;
ISR changes are compare-and-set, adopting the controller's newer ISR on a conflict
and giving up (no acknowledgements) when leadership moved."""
from __future__ import annotations

import asyncio

from exactly.testing import MockTime
from services.common.cluster.state import PartitionState, TopicInfo
from services.partition_leader.lease import IsrUpdater, LeaseKeeper
from services.partition_leader.replica_manager import ReplicaManager

from .conftest import make_batch, append_records, valid
from services.partition_leader.replicas import HostedReplicas

TP = ("r", 0)


class FakeZk:
    """The ClusterState calls the lease keeper and ISR updater make, over a dict."""

    def __init__(self, state: PartitionState, registered: int | None = 50):
        self.state = state
        self.registered = registered
        self.writes: list[tuple[PartitionState, int]] = []
        self.replicas = ["me", "x", "y"]

    def topics(self):
        return {"r": TopicInfo("r", {0: list(self.replicas)}, {}, False, {0: self.state})}

    def topic(self, name):
        return self.topics().get(name)

    def registration_zxid(self, timeout_s=10.0):
        return self.registered

    def read_partition_states(self, tps, timeout_s=10.0):
        return {tp: self.state for tp in tps}

    def partition_state(self, topic, partition):
        return self.state, self.state.version

    def update_partition_state(self, topic, partition, state, expected_version):
        self.writes.append((state, expected_version))
        if expected_version != self.state.version:
            return False, -1
        self.state = PartitionState(state.leader, state.leader_epoch, state.isr, self.state.version + 1,
                                    self.state.mzxid + 1)
        return True, self.state.version


def _tell_appends(p) -> asyncio.Event:
    """An event set once `p` appended (its `append` wrapped)."""
    appended = asyncio.Event()
    append = p.append

    def append_and_tell(*args):
        result = append(*args)
        appended.set()
        return result
    p.append = append_and_tell
    return appended


def _leader_of_two(tmp_path, store, clock):
    """(clock, manager, leader()): this node leads TP with ISR me, x and
    min.insync.replicas 2; leader(), called on the event loop, starts the lease keeper
    and returns the partition."""
    now = MockTime(10_000)  # 10 s
    zk = FakeZk(PartitionState("me", 2, ("me", "x"), version=4, mzxid=100))
    m = manager_for(zk, tmp_path, store, clock, now)
    m.hosted.props["min.insync.replicas"] = "2"

    def leader():
        m.hosted.leases = LeaseKeeper(m, zk, 3000)
        m.hosted.refresh()
        return m.hosted.replicas[TP]
    return now, m, leader


def manager_for(zk, tmp_path, store, clock, now):
    m = ReplicaManager(HostedReplicas("me", tmp_path, {"replica.lag.time.max.ms": "1000"}, zk, store, clock,
                       monotonic_s=now.now_s, monotonic_ms=clock))
    return m


def test_leases_follow_what_zookeeper_says(tmp_path, store, clock):
    now = MockTime(10_000)  # 10 s
    zk = FakeZk(PartitionState("me", 2, ("me", "x"), version=4, mzxid=100))
    m = manager_for(zk, tmp_path, store, clock, now)

    async def main():
        keeper = LeaseKeeper(m, zk, 3000)
        m.hosted.refresh()
        p = m.hosted.replicas[TP]
        assert not m.hosted.lease_valid(p)
        await keeper.renew()
        assert m.hosted.lease_valid(p) and p.lease_until == 13.0
        now.set_ms(13_000)
        assert not m.hosted.lease_valid(p)
        # A newer ISR of our epoch is adopted while renewing.
        zk.state = PartitionState("me", 2, ("me",), version=5, mzxid=101)
        await keeper.renew()
        assert m.hosted.lease_valid(p) and p.isr == ("me",)
        # Written before this process registered (it restarted): no lease until the
        # controller elects again.
        zk.registered = 200
        p.lease_until = 0.0
        await keeper.renew()
        assert not m.hosted.lease_valid(p)
        zk.registered = None  # not registered with the current session
        await keeper.renew()
        assert not m.hosted.lease_valid(p)
        # Another leader: the lease is voided at once.
        zk.registered = 50
        await keeper.renew()
        assert m.hosted.lease_valid(p)
        zk.state = PartitionState("x", 3, ("x",), version=6, mzxid=102)
        await keeper.renew()
        assert not m.hosted.lease_valid(p)
        # ensure() gives up once the watch made it a follower.
        m.hosted.refresh()
        assert not await keeper.ensure(p, asyncio.get_running_loop().time() + 5)
        keeper.on_session_state("LOST")
    asyncio.run(main())
    m.hosted.close()


def test_a_wait_for_a_lease_ends_when_its_replica_is_deleted(tmp_path, store, clock):
    """A leader whose session was lost waits in `ensure` for a lease it cannot get; when
    this process leaves the partition's replicas (a coordinator whose internal partition
    moved to another owner meanwhile) the replica is deleted and the wait ends at once
    with False, not at its deadline: the appends queued behind it go on."""
    now = MockTime(10_000)
    zk = FakeZk(PartitionState("me", 2, ("me", "x"), version=4, mzxid=100), registered=None)
    m = manager_for(zk, tmp_path, store, clock, now)

    async def main():
        keeper = LeaseKeeper(m, zk, 3000)
        m.hosted.leases = keeper
        m.hosted.refresh()
        p = m.hosted.replicas[TP]
        waiting = asyncio.create_task(keeper.ensure(p, asyncio.get_running_loop().time() + 30))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()  # no lease without a registration: it waits
        zk.replicas = ["x", "y", "z"]
        m.hosted.refresh()
        assert TP not in m.hosted.replicas and p.is_leader  # deleted, the object unchanged
        keeper.replicas_changed()
        assert await asyncio.wait_for(waiting, 5) is False
    asyncio.run(main())
    m.hosted.close()


def test_isr_writes_are_compare_and_set(tmp_path, store, clock):
    now = MockTime(10_000)  # 10 s
    zk = FakeZk(PartitionState("me", 1, ("me", "x", "y"), version=0, mzxid=100))
    m = manager_for(zk, tmp_path, store, clock, now)
    notified = []

    async def main():
        m.hosted.refresh()
        p = m.hosted.replicas[TP]
        p.append(valid(make_batch(2)), 1)
        m.fetch_for_follower("r", 0, "x", 2, 100, 1)
        clock.advance(1001)  # y never fetched; x fetched 1001 ms ago too
        m.fetch_for_follower("r", 0, "x", 2, 100, 1)
        updater = IsrUpdater(m, zk, notified.append)
        # The controller changed the ISR meanwhile: our first write fails, the newer
        # ISR of our epoch is adopted, and the change is decided again on top of it
        # (y lags: out; x is caught up: back in).
        zk.state = PartitionState("me", 1, ("me", "y"), version=1, mzxid=101)
        updater.request(TP)
        await updater.drain()
        assert [w[1] for w in zk.writes] == [0, 1]
        assert zk.state.isr == ("me", "x") and p.isr == ("me", "x") and p.replication.zk_version == 2
        assert m.hosted.desired_isr(TP) is None and notified
        # Leadership moved: the write fails and the lease is voided.
        clock.advance(1001)
        p.lease_until = 99.0
        zk.state = PartitionState("y", 2, ("y",), version=7, mzxid=120)
        updater.request(TP)
        await updater.drain()
        assert p.lease_until == 0.0 and zk.state.leader == "y"
        await updater.stop()
    asyncio.run(main())
    m.hosted.close()


def test_acks_all_goes_on_without_a_lease_while_zookeeper_is_unreachable(tmp_path, store, clock):
    """ZooKeeper SUSPENDED: the lease cannot be renewed, yet acks=all writes are appended
    and acknowledged once the ISR has them (the high watermark vouches for them); acks=1
    writes still need the lease. Connected again, acks=all needs the lease too."""
    from exactly_wire.error_codes import ErrorCode
    from services.partition_leader.replica_manager import ProduceEntry

    now, m, leader = _leader_of_two(tmp_path, store, clock)

    async def main():
        p = leader()
        m.hosted.invalidate_leases()
        m.hosted.zookeeper_suspended = True
        entry = ProduceEntry("r", 0, make_batch(2))
        one = await append_records(m, 1, [entry], timeout_ms=200)
        assert one[0].error == ErrorCode.NOT_LEADER_OR_FOLLOWER and p.log_end_offset == 0
        appended = _tell_appends(p)
        task = asyncio.create_task(append_records(m, -1, [entry], timeout_ms=5000))
        await asyncio.wait_for(appended.wait(), 5)
        assert p.log_end_offset == 2 and not task.done()  # appended, waiting for the ISR
        assert m.fetch_for_follower("r", 0, "x", 2, 1 << 20, 2).hw_changed
        m.hosted.purgatory.notify(("r", 0))  # as the Fetch path does when the high watermark moved
        res = (await asyncio.wait_for(task, 2))[0]
        assert (res.error, res.base_offset) == (ErrorCode.NONE, 0) and not m.hosted.lease_valid(p)
        m.hosted.zookeeper_suspended = False
        again = await append_records(m, -1, [entry], timeout_ms=200)
        assert again[0].error == ErrorCode.NOT_LEADER_OR_FOLLOWER and p.log_end_offset == 2

    asyncio.run(main())


def test_an_acks_all_write_waiting_for_its_lease_goes_on_once_zookeeper_is_found_unreachable(tmp_path, store, clock):
    """The lease ran out before the client noticed that ZooKeeper went away: an acks=all
    write waits for a renewal that cannot come. Once the connection is SUSPENDED, the ISR
    vouches for it as for a write arriving then: it is appended and acknowledged when
    the ISR has it, not failed at its request deadline (30 s here)."""
    from exactly_wire.error_codes import ErrorCode
    from services.partition_leader.replica_manager import ProduceEntry

    now, m, leader = _leader_of_two(tmp_path, store, clock)

    async def main():
        p = leader()
        now.set_ms(int(asyncio.get_running_loop().time() * 1000))  # ensure() reads the loop's clock, as in the service
        entry = ProduceEntry("r", 0, make_batch(2))
        task = asyncio.create_task(append_records(m, -1, [entry], timeout_ms=30_000))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done() and p.log_end_offset == 0  # waiting for a lease, nothing appended
        appended = _tell_appends(p)
        m.hosted.invalidate_leases()
        m.hosted.zookeeper_suspended = True
        m.hosted.leases.on_session_state("SUSPENDED")
        await asyncio.wait_for(appended.wait(), 5)
        assert p.log_end_offset == 2 and not task.done()  # appended, waiting for the ISR
        assert m.fetch_for_follower("r", 0, "x", 2, 1 << 20, 2).hw_changed
        m.hosted.purgatory.notify(TP)
        res = (await asyncio.wait_for(task, 2))[0]
        assert (res.error, res.base_offset) == (ErrorCode.NONE, 0)

    asyncio.run(main())


def test_an_acks_all_write_appended_under_its_lease_is_acknowledged_once_zookeeper_is_found_unreachable(
        tmp_path, store, clock):
    """The lease ran out while an acks=all write appended under it waited for the ISR:
    once the ISR has it, its acknowledgement waits for a renewal that cannot come
    (ZooKeeper unreachable, not noticed yet). Once the connection is SUSPENDED the ISR
    vouches for it, as for the writes appended after it: it is acknowledged, not failed
    NOT_LEADER_OR_FOLLOWER at its request deadline after them (an idempotent producer
    would send it again as a duplicate older than the leader's last 5 batches)."""
    from exactly_wire.error_codes import ErrorCode
    from services.partition_leader.replica_manager import ProduceEntry

    now, m, leader = _leader_of_two(tmp_path, store, clock)

    async def main():
        p = leader()
        now.set_ms(int(asyncio.get_running_loop().time() * 1000))  # ensure() reads the loop's clock, as in the service
        p.lease_until = now.now_s() + 3
        entry = ProduceEntry("r", 0, make_batch(2))
        appended = _tell_appends(p)
        task = asyncio.create_task(append_records(m, -1, [entry], timeout_ms=30_000))
        await asyncio.wait_for(appended.wait(), 5)
        p.lease_until = 0.0  # ran out; no renewal comes
        assert m.fetch_for_follower("r", 0, "x", 2, 1 << 20, 2).hw_changed
        m.hosted.purgatory.notify(TP)
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done() and p.high_watermark == 2  # the ISR has it; waiting for a lease
        m.hosted.invalidate_leases()
        m.hosted.zookeeper_suspended = True
        m.hosted.leases.on_session_state("SUSPENDED")
        res = (await asyncio.wait_for(task, 2))[0]
        assert (res.error, res.base_offset) == (ErrorCode.NONE, 0)

    asyncio.run(main())


def test_acks_all_without_a_lease_gives_up_once_the_followers_stay_silent_for_the_lag_time(tmp_path, store, clock):
    """Cut off from ZooKeeper alone, a leader's followers follow a newer leader and never
    acknowledge: an acks=all write waiting without a lease fails NOT_LEADER_OR_FOLLOWER
    after replica.lag.time.max.ms (1000 here), well before its request deadline, and a
    write whose lease is voided while it waits is bounded from then on."""
    from exactly_wire.error_codes import ErrorCode
    from services.partition_leader.replica_manager import ProduceEntry

    now, m, leader = _leader_of_two(tmp_path, store, clock)

    async def main():
        p = leader()
        p.lease_until = now.now_s() + 3  # confirmed: the write waits for the ISR alone
        entry = ProduceEntry("r", 0, make_batch(2))
        appended = _tell_appends(p)
        task = asyncio.create_task(append_records(m, -1, [entry], timeout_ms=30_000))
        await asyncio.wait_for(appended.wait(), 5)
        # ZooKeeper goes away for this process: the lease is voided and the waiter wakes.
        m.hosted.zookeeper_suspended = True
        m.hosted.invalidate_leases()
        await asyncio.sleep(0)
        assert not task.done()
        now.advance(999)
        m.hosted.purgatory.notify(TP)
        await asyncio.sleep(0)
        assert not task.done()  # within the lag time: still waiting
        now.advance(2)
        m.hosted.purgatory.notify(TP)
        res = (await asyncio.wait_for(task, 2))[0]
        assert res.error == ErrorCode.NOT_LEADER_OR_FOLLOWER and p.high_watermark == 0

    asyncio.run(main())
