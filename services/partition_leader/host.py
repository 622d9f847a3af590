"""The replica code of a process, composed once (docs/design/coordinator-local-logs.md,
"Appending through the log code as a library").

`ReplicaHost` holds what hosting partition replicas takes, whatever else the process is:
the replicas and their lifecycle (`HostedReplicas`), the request entry points
(`ReplicaManager`), the servicer of the replica RPCs (`PartitionLeaderServicer`), the
producer-state snapshot store under `<data_dir>/producer-state`, the leadership leases
(`LeaseKeeper`), ISR changes (`IsrUpdater`), the followers' fetchers (`ReplicaFetchers`),
the log cleaner, and the periodic work (snapshots and high-watermark checkpoints,
producer-id expiration, the ISR check). It follows the cluster state (ZooKeeper watches,
session changes) and opens, closes and deletes the replicas assigned to this process of
the topics `hosts_topic` accepts.

The partition-leader process hosts every topic through it; the controller, the Kafka APIs
and the registration of the gRPC servicer stay with the process (service.py).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from services.common.cluster.state import ClusterState
from services.common.cluster.verification import TxnVerifier
from services.common.config import ServiceConfig
from services.common.settings import PartitionLeaderSchema
from services.common.transport.rpc import ClusterClient

from .cleaner import LogCleaner
from .lease import IsrUpdater, LeaseKeeper
from .metrics import count_produced, count_verification
from .replica_fetcher import ReplicaFetchers
from .replica_manager import ReplicaManager
from .replicas import HostedReplicas
from .servicer import PartitionLeaderServicer
from .snapshot_store import SnapshotStore

log = logging.getLogger(__name__)


class ReplicaHost:
    """The replicas a process hosts, with their replication, leases and periodic work.

    cfg: the process's configuration (`cfg.settings` a PartitionLeaderSchema: the log,
    replication and producer-state settings listed in service.py); cluster: the cluster
    state (ZooKeeper); client: the cluster client (replica fetches and KIP-890
    verification go on its tunnel); hosts_topic(topic) -> bool: the topics hosted here
    (default: every topic). `start()` / `stop()` bracket its life; `wait_ready()` waits
    for the controller's elections after a restart. Not thread-safe: used from the event
    loop, the kazoo callbacks hop onto it.
    """

    def __init__(self, cfg: ServiceConfig, cluster: ClusterState, client: ClusterClient,
                 hosts_topic: Callable[[str], bool] = lambda topic: True):
        settings: PartitionLeaderSchema = cfg.settings
        self.cfg = cfg
        self.cluster = cluster
        self.store = SnapshotStore(cfg.data_dir / "producer-state")
        hosted = HostedReplicas(cfg.node_id, cfg.data_dir, settings, cluster, self.store, hosts_topic=hosts_topic)
        self.manager = ReplicaManager(hosted)
        hosted.on_appended = count_produced
        hosted.on_verified = count_verification
        hosted.verifier = TxnVerifier(cluster, client)
        hosted.verify_transactions = settings.transaction_partition_verification_enable
        hosted.pid_bindings = cluster.pid_bindings  # set with the authorizer on (pid_binding.py)
        session_ms = settings.zookeeper_session_timeout_ms
        self.notify = hosted.purgatory.notify
        self.leases = LeaseKeeper(self.manager, cluster, max(session_ms * 2 // 3, 100), self.notify)
        hosted.leases = self.leases
        self.servicer = PartitionLeaderServicer(self.manager)
        self.fetchers = ReplicaFetchers(self.manager, self._address, client.tunnel, settings, self.notify)
        self.isr = IsrUpdater(self.manager, cluster, self.notify)
        self.cleaner = LogCleaner(lambda: list(hosted.serving.values()), hosted.serves,
                                  compaction=settings.log_cleaner_enable, clock_ms=hosted.clock_ms,
                                  monotonic_ms=hosted.monotonic_ms, on_io_error=hosted.fail_log_dir)
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refresh_pending = False
        self._stopped = False

    @property
    def hosted(self) -> HostedReplicas:
        return self.manager.hosted

    def _address(self, node_id: str) -> str | None:
        node = self.cluster.nodes().get(node_id)
        return node.address if node is not None else None

    async def start(self) -> None:
        """Open the replicas assigned here and take their roles, follow assignment and
        state changes, start replication and the snapshot, PID-expiration, ISR-check and
        cleaner tasks."""
        self._loop = asyncio.get_running_loop()
        hosted = self.hosted
        hosted.on_isr_update = self.isr.request
        hosted.on_log_dir_failure = self._on_log_dir_failure
        hosted.is_live = lambda node_id: node_id in self.cluster.nodes()
        self.leases.start()
        self._refresh()
        await self._delete_orphaned_logs()
        self.cluster.add_listener(self._on_cluster_change)
        self.cluster.add_session_listener(self._on_session)
        settings: PartitionLeaderSchema = self.cfg.settings
        snapshot_tick = max(min(settings.producer_snapshot_interval_ms, 1000), 10) / 1000
        expiry_tick = max(settings.producer_id_expiration_check_interval_ms, 10) / 1000
        isr_tick = max(hosted.max_lag_ms / 2, 10) / 1000
        cleaner_tick = max(settings.log_retention_check_interval_ms, 10) / 1000
        self._tasks = [
            asyncio.create_task(self._cleaner_loop(cleaner_tick), name="log-cleaner"),
            asyncio.create_task(self._every(snapshot_tick, self._snapshots_and_checkpoints), name="snapshots"),
            asyncio.create_task(self._every(expiry_tick, hosted.expire_producers), name="pid-expiration"),
            asyncio.create_task(self._every(isr_tick, self._check_isr), name="isr-check"),
        ]

    async def _delete_orphaned_logs(self) -> None:
        """Delete the replicas of topics deleted while this process was down (their
        topic znode is gone from ZooKeeper), and those removed from this process's
        replicas meanwhile (a copy reopened later would start from stale records that a
        compaction may have dropped since). Each is confirmed with ZooKeeper first; a
        failed check keeps the files until the next start."""
        hosted = self.hosted
        candidates = [(tp, path, "topic deleted while this process was down") for tp, path in hosted.orphaned_logs()]
        candidates += [(tp, path, "no longer one of its replicas") for tp, path in hosted.unassigned_logs()]
        for tp, path, why in candidates:
            try:
                found = await asyncio.to_thread(self.cluster.read_topic, tp[0])
            except Exception as exc:  # noqa: BLE001 - ZooKeeper hiccup: keep the files, try at the next start
                log.warning("cannot check topic %s: %r", tp[0], exc)
                continue
            replicas = (found[0].get("partitions") or {}).get(str(tp[1])) if found is not None else None
            gone = found is None or (replicas is not None and self.cfg.node_id not in replicas)
            if gone and tp not in hosted.replicas:
                try:
                    hosted.delete_orphaned(tp, path, why)
                except OSError as exc:
                    log.exception("deleting %s failed", path)
                    hosted.fail_log_dir(exc)

    async def wait_ready(self) -> None:
        """Called once registered: wait (at most twice the ZooKeeper session timeout)
        until no partition state names this process leader from before it registered,
        i.e. until the controller has elected again after a restart, so that serving
        starts with leaderships this process can confirm."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self.cfg.settings.zookeeper_session_timeout_ms / 1000
        registered = None
        node_id = self.cfg.node_id
        while loop.time() < deadline:
            try:
                registered = registered or await asyncio.to_thread(self.cluster.registration_zxid)
            except Exception as exc:  # noqa: BLE001 - ZooKeeper hiccup: try again
                log.debug("registration check failed: %r", exc)
            if registered is not None:
                stale = [(t.name, p) for t in self.cluster.topics().values() if self.hosted.hosts_topic(t.name)
                         for p, st in list(t.states.items()) if st.leader == node_id and 0 <= st.mzxid < registered]
                if not stale:
                    return
            await asyncio.sleep(0.1)
        log.warning("still named leader by states older than this process's registration; serving anyway")

    async def stop(self) -> None:
        """Clean shutdown: stop replication and the tasks, flush every log, write final
        snapshots."""
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.fetchers.stop()
        await self.isr.stop()
        await self.leases.stop()
        self.hosted.close()
        self.store.close()

    def _on_cluster_change(self) -> None:
        # Called from a kazoo thread: hop onto the event loop, coalescing bursts.
        loop = self._loop
        if loop is None or self._stopped or self._refresh_pending:
            return
        self._refresh_pending = True
        try:
            loop.call_soon_threadsafe(self._refresh)
        except RuntimeError:  # loop closed during shutdown
            pass

    def _on_session(self, state: str) -> None:
        # From a kazoo thread; LOST/SUSPENDED void the leases right away, before the
        # event loop runs anything else queued.
        if state in ("LOST", "SUSPENDED"):
            self.hosted.invalidate_leases()
        self.hosted.zookeeper_suspended = state == "SUSPENDED"
        loop = self._loop
        if loop is None or self._stopped:
            return
        try:
            loop.call_soon_threadsafe(self.leases.on_session_state, state)
        except RuntimeError:
            pass

    def _refresh(self) -> None:
        self._refresh_pending = False
        if self._stopped:
            return
        hosted = self.hosted
        opened, closed = hosted.refresh()
        self.fetchers.sync()
        changed = set(opened) | set(closed) | hosted.changed
        if any(p.is_leader for tp, p in hosted.replicas.items() if tp in changed):
            self.leases.wake()
        if changed:
            self.leases.replicas_changed()
        for tp in changed:
            self.notify(tp)

    def _check_isr(self) -> None:
        for tp in self.hosted.isr_updates():
            self.isr.request(tp)

    async def _cleaner_loop(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.cleaner.run_once()
            except Exception:  # noqa: BLE001 - keep the cleaner alive; logged with traceback
                log.exception("log cleaner pass failed")

    async def _snapshots_and_checkpoints(self) -> None:
        """Producer-state snapshots (on the loop: they read the producer state), then
        the high-watermark checkpoints, whose fsyncs run in a worker thread so that
        produce and fetch answers do not wait for the disk every tick."""
        hosted = self.hosted
        try:
            hosted.maybe_snapshot_all()
        except OSError as exc:  # the producer-state store on the data directory failed
            log.exception("producer-state snapshot failed")
            hosted.fail_log_dir(exc)
            return
        due = hosted.high_watermarks_to_checkpoint()
        if due:
            failed = await asyncio.to_thread(_checkpoint_all, due)
            if failed is not None:
                hosted.fail_log_dir(failed)

    def _on_log_dir_failure(self, exc: OSError) -> None:
        """KIP-112: the log directory went offline (ReplicaManager.fail_log_dir): stop
        the replica fetchers and publish it in ZooKeeper, so that the controller moves
        every leadership held here to an in-sync replica. Retried until published."""
        self.fetchers.sync()
        self._tasks.append(asyncio.create_task(self._publish_log_dir_offline(), name="log-dir-offline"))

    async def _publish_log_dir_offline(self) -> None:
        while not self._stopped:
            try:
                await asyncio.to_thread(self.cluster.mark_log_dir_offline)
                log.error("log directory offline: published; the controller moves leadership away from %s",
                          self.cfg.node_id)
                return
            except Exception as exc:  # noqa: BLE001 - ZooKeeper unreachable: try again
                log.warning("cannot publish the offline log directory yet: %r", exc)
                await asyncio.sleep(0.5)

    async def _every(self, seconds: float, fn) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                result = fn()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:  # noqa: BLE001 - keep the periodic task alive; logged with traceback
                log.exception("periodic task %s failed", getattr(fn, "__name__", fn))


def _checkpoint_all(due: list) -> OSError | None:
    """Checkpoint each (replica, high watermark); returns the first I/O error of a
    replica whose directory still exists (a failing disk), None otherwise."""
    failed = None
    for p, hw in due:
        try:
            p.checkpoint_high_watermark(hw)
        except OSError as exc:  # a replica deleted meanwhile: the next tick tries again
            log.warning("high-watermark checkpoint of %s-%d failed: %s", p.topic, p.partition, exc)
            if failed is None and p.log.dir.exists():
                failed = exc
    return failed
