"""Leadership leases and ISR writes: the partition leader's two uses of ZooKeeper on
the request path.

`LeaseKeeper` confirms, every `lease_ms / 3`, that each partition led here is still
led by this node in the same leader epoch, by reading the state znodes from
ZooKeeper over this process's session; the state must also have been written after
this process registered with its current session (a restarted process, or one whose
session was lost, waits for the controller to elect again rather than resume an
epoch it may no longer hold). A confirmation read sent at time t holds until
t + `lease_ms` (`lease_ms` is two thirds of the ZooKeeper session timeout: the
session cannot expire, and so the controller cannot replace us, before t + session
timeout). A leader acknowledges writes only under a valid lease, so one that wakes
from a pause (SIGSTOP) longer than its session, or whose session was lost, answers
NOT_LEADER_OR_FOLLOWER instead of acknowledging: its next confirmation fails, or
shows the new leader. SUSPENDED and LOST connection states void all leases at once
(docs/design.md, "Coordinator ownership").

`IsrUpdater` writes a leader's ISR changes (shrink after `replica.lag.time.max.ms`,
expand when a follower caught up) with compare-and-set on the state znode's version
(Kafka's `Partition.shrinkIsr` / `expandIsr` through ZooKeeper). When the CAS fails
the znode is read again: the same leader and epoch means the controller changed the
ISR (it is adopted and the change retried); anything else means this leader was
replaced, and its lease is voided until the watch makes it a follower.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from services.common.cluster.state import ZOOKEEPER_ERRORS, ClusterState, PartitionState

from .partition import Partition
from .replica_manager import ReplicaManager, TopicPartition

log = logging.getLogger(__name__)

RETRY_S = 0.05


class LeaseKeeper:
    """Renews the leadership leases of `manager`'s leaders (see the module docstring).

    notify(tp) is called when a replica's view of its ISR changed (waiters re-check).
    """

    def __init__(self, manager: ReplicaManager, cluster: ClusterState, lease_ms: int,
                 notify: Callable[[TopicPartition], None] = lambda tp: None):
        self.manager = manager
        self.cluster = cluster
        self.lease_ms = lease_ms
        self.notify = notify
        manager.hosted.lease_ms = lease_ms
        self._renewed = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="leadership-leases")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def on_session_state(self, state: str) -> None:
        """ZooKeeper connection state change (on the event loop)."""
        if state in ("SUSPENDED", "LOST"):
            log.warning("ZooKeeper connection %s: leadership leases voided", state)
            self.manager.hosted.invalidate_leases()
            self._renewed.set()  # the waits of `ensure` look again (a write the ISR now vouches for goes on)
        else:
            self._wake.set()

    def wake(self) -> None:
        """Renew now (e.g. after becoming leader)."""
        self._wake.set()

    async def ensure(self, p: Partition, deadline: float, vouched: Callable[[], bool] | None = None) -> bool:
        """Wait until `p`'s lease is valid, or `vouched()` is true, until `deadline`
        (loop time, s) at most, asking for renewals. False when `p` stopped leading, is
        no longer the replica serving its partition here (closed, or deleted when this
        process left its replicas: `replicas_changed` wakes the wait), or the deadline
        passed (ZooKeeper unreachable, the session lost, leadership moved).

        vouched: for an acks=all write, whether it may go on without a lease
        (`HostedReplicas.isr_vouches`: the connection is SUSPENDED and the ISR is at
        min.insync.replicas). A write that started to wait for its lease before the
        client noticed the suspension goes on once it does, as one arriving after it
        would, instead of waiting for its deadline."""
        loop = asyncio.get_running_loop()
        hosted = self.manager.hosted

        def settled() -> bool:
            return hosted.lease_valid(p) or (vouched is not None and vouched())
        while not settled():
            remaining = deadline - loop.time()
            if not p.is_leader or not hosted.serves(p) or remaining <= 0:
                return False
            self._renewed.clear()
            self._wake.set()
            try:
                await asyncio.wait_for(self._renewed.wait(), remaining)
            except asyncio.TimeoutError:
                return False
            if not settled() and p.is_leader and hosted.serves(p):
                # Not confirmed (yet): a new election or the watch demoting us comes soon.
                await asyncio.sleep(min(RETRY_S, max(deadline - loop.time(), 0)))
        return True

    def replicas_changed(self) -> None:
        """The replicas here were opened, closed or changed role (on the event loop):
        the waits of `ensure` look again at once, rather than at the next renewal, so
        that one whose replica is gone answers now. Without this, a coordinator's append
        to its own log that waited for a lease while its session was lost held the
        appends queued behind it until its request deadline (30 s), although the
        replica it waited for had been deleted."""
        self._renewed.set()

    async def _run(self) -> None:
        interval = max(self.lease_ms / 3, 50) / 1000
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.renew()
            except Exception:  # noqa: BLE001 - keep renewing; logged with its traceback
                log.exception("leadership lease renewal failed")
            finally:
                self._renewed.set()

    async def renew(self) -> None:
        """One confirmation round over the partitions led here."""
        led = self.manager.hosted.partitions  # the serving leaders
        if not led:
            return
        sent = self.manager.hosted.monotonic_s()

        def read():
            return (self.cluster.registration_zxid(self.lease_ms / 1000),
                    self.cluster.read_partition_states(list(led), self.lease_ms / 1000))
        try:
            registered, states = await asyncio.to_thread(read)
        except ZOOKEEPER_ERRORS as exc:
            log.warning("cannot confirm leadership in ZooKeeper: %r", exc)
            return
        if registered is None:
            return
        until = sent + self.lease_ms / 1000
        for tp, st in states.items():
            p = led[tp]
            if self.manager.hosted.serving.get(tp) is not p or not p.is_leader:
                continue
            if st is not None and st.leader == self.manager.hosted.node_id and st.leader_epoch == p.leader_epoch \
                    and st.mzxid > registered:
                p.lease_until = until
                if st.version > p.replication.zk_version and p.set_isr(st.isr, st.version):
                    self.notify(tp)
            else:
                if p.lease_until > 0:
                    log.warning("%s-%d: no longer the leader of epoch %d in ZooKeeper (%s); not acknowledging",
                                tp[0], tp[1], p.leader_epoch, st)
                p.lease_until = 0.0


class IsrUpdater:
    """Writes ISR changes of the leaders here (see the module docstring). `request(tp)`
    schedules one update loop per partition; `notify(tp)` is called when the ISR a
    leader applies changed (the high watermark may have moved)."""

    def __init__(self, manager: ReplicaManager, cluster: ClusterState,
                 notify: Callable[[TopicPartition], None] = lambda tp: None):
        self.manager = manager
        self.cluster = cluster
        self.notify = notify
        self._running: dict[TopicPartition, asyncio.Task] = {}

    def request(self, tp: TopicPartition) -> None:
        if tp not in self._running:
            self._running[tp] = asyncio.create_task(self._update(tp), name=f"isr-{tp[0]}-{tp[1]}")

    async def stop(self) -> None:
        tasks = list(self._running.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def drain(self) -> None:
        """Wait until every requested update has ended (written, adopted or given up)."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def _update(self, tp: TopicPartition) -> None:
        topic, partition = tp
        try:
            for _ in range(5):
                p = self.manager.hosted.serving.get(tp)
                desired = self.manager.hosted.desired_isr(tp)
                if p is None or not p.is_leader or desired is None:
                    return
                epoch, version, old = p.leader_epoch, p.replication.zk_version, p.isr
                state = PartitionState(self.manager.hosted.node_id, epoch, desired)
                ok, new_version = await asyncio.to_thread(self.cluster.update_partition_state, topic, partition,
                                                          state, version)
                p = self.manager.hosted.serving.get(tp)
                if p is None or not p.is_leader or p.leader_epoch != epoch:
                    return
                if ok:
                    log.info("%s-%d: ISR %s -> %s (epoch %d)", topic, partition, ",".join(old), ",".join(desired),
                             epoch)
                    p.set_isr(desired, new_version)
                    self.notify(tp)
                    continue
                fresh, fresh_version = await asyncio.to_thread(self.cluster.partition_state, topic, partition)
                p = self.manager.hosted.serving.get(tp)
                if p is None or not p.is_leader or p.leader_epoch != epoch:
                    return
                if fresh is None or fresh.leader != self.manager.hosted.node_id or fresh.leader_epoch != epoch:
                    log.warning("%s-%d: ISR update refused, leadership moved (%s); not acknowledging",
                                topic, partition, fresh)
                    p.lease_until = 0.0
                    return
                if fresh_version > p.replication.zk_version:
                    p.set_isr(fresh.isr, fresh_version)
                    self.notify(tp)
        except ZOOKEEPER_ERRORS as exc:
            log.warning("%s-%d: ISR update failed: %r", topic, partition, exc)
        finally:
            self._running.pop(tp, None)

