"""The partition leader process: wiring of the replica manager, the servicer, the
cluster listener, replication (replica fetchers, ISR updates, leadership leases), the
controller, and the periodic producer-state tasks.

`setup(server, cluster, client, cfg)` is what `services.common.transport.server.serve` calls
(see `__main__.py`). Settings (`--set key=value`, Kafka names; topic configs override
the log ones per topic):

    segment.bytes / log.segment.bytes                 1073741824
    index.interval.bytes / log.index.interval.bytes   4096
    flush.messages / log.flush.interval.messages      never (fsync on roll and shutdown)
    producer.snapshot.interval.ms                     30000
    producer.snapshot.retained                        3
    producer.id.expiration.ms                         86400000
    producer.id.expiration.check.interval.ms          600000
    min.insync.replicas                               1 (topic config or process setting)
    replica.lag.time.max.ms                           10000
    replica.fetch.wait.max.ms / .max.bytes / .backoff.ms   500 / 1048576 / 200
    controller.sweep.interval.ms                      1000
    retention.ms / log.retention.ms                   604800000 (-1: no limit)
    retention.bytes / log.retention.bytes             -1 (no limit)
    segment.ms / log.roll.ms                          604800000
    cleanup.policy / log.cleanup.policy               delete (topic config; internal topics: compact)
    delete.retention.ms / log.cleaner.delete.retention.ms   86400000
    log.retention.check.interval.ms                   300000 (retention and compaction passes)
    log.cleaner.enable                                true (false: no compaction; retention stays)
    zookeeper.session.timeout.ms                      10000 (leadership leases last 2/3 of it)
    transaction.partition.verification.enable         true (KIP-890: the first transactional
                                                      batch of a producer on a partition is
                                                      verified with its transaction coordinator)
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.cluster.state import ClusterState
from services.common.config import ServiceConfig
from services.common.cluster.controller import Controller
from services.common.transport.rpc import ClusterClient
from services.common.settings import PartitionLeaderSchema
from services.common.cluster.verification import TxnVerifier

from services.common.security.authz import AuthorizedServicer

from .cleaner import LogCleaner
from .kafka_api import PartitionLeaderApis
from .lease import IsrUpdater, LeaseKeeper
from .metrics import CLUSTER, PARTITIONS, count_produced
from .replica_fetcher import ReplicaFetchers
from .replica_manager import ReplicaManager
from .replicas import HostedReplicas
from .servicer import PartitionLeaderServicer
from .snapshot_store import SnapshotStore

log = logging.getLogger(__name__)


class PartitionLeaderService:
    """Lifecycle of one partition leader process (`start` / `stop`, as server.serve expects)."""

    def __init__(self, cfg: ServiceConfig, cluster: ClusterState, client: ClusterClient, store: SnapshotStore,
                 manager: ReplicaManager, servicer: PartitionLeaderServicer, leases: LeaseKeeper):
        self.cfg = cfg
        self.cluster = cluster
        self.client = client
        self.store = store
        self.manager = manager
        self.servicer = servicer
        self.leases = leases
        self.notify = manager.hosted.purgatory.notify
        settings: PartitionLeaderSchema = cfg.settings
        self.fetchers = ReplicaFetchers(manager, self._address, client.tunnel, settings, self.notify)
        self.isr = IsrUpdater(manager, cluster, self.notify)
        self.controller = Controller(cluster, settings.controller_sweep_interval_ms)
        self.cleaner = LogCleaner(lambda: list(manager.hosted.serving.values()), manager.hosted.serves,
                                  compaction=settings.log_cleaner_enable, clock_ms=manager.hosted.clock_ms,
                                  monotonic_ms=manager.hosted.monotonic_ms, on_io_error=manager.hosted.fail_log_dir)
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refresh_pending = False
        self._stopped = False

    def kafka_handlers(self) -> dict:
        """The Kafka protocol handlers of this role (services.common.kafka.surface)."""
        return PartitionLeaderApis(AuthorizedServicer(self.servicer, "PartitionLeader"), self.manager).handlers()

    def _address(self, node_id: str) -> str | None:
        node = self.cluster.nodes().get(node_id)
        return node.address if node is not None else None

    async def start(self) -> None:
        """Open the replicas assigned here and take their roles, follow assignment and
        state changes, start replication, the controller candidacy, and the
        snapshot, PID-expiration and ISR-check tasks."""
        self._loop = asyncio.get_running_loop()
        self.manager.hosted.on_isr_update = self.isr.request
        self.manager.hosted.on_log_dir_failure = self._on_log_dir_failure
        self.manager.hosted.is_live = lambda node_id: node_id in self.cluster.nodes()
        self.leases.start()
        self._refresh()
        await self._delete_orphaned_logs()
        self.cluster.add_listener(self._on_cluster_change)
        self.cluster.add_session_listener(self._on_session)
        self.controller.start()
        settings: PartitionLeaderSchema = self.cfg.settings
        snapshot_tick = max(min(settings.producer_snapshot_interval_ms, 1000), 10) / 1000
        expiry_tick = max(settings.producer_id_expiration_check_interval_ms, 10) / 1000
        isr_tick = max(self.manager.hosted.max_lag_ms / 2, 10) / 1000
        cleaner_tick = max(settings.log_retention_check_interval_ms, 10) / 1000
        self._tasks = [
            asyncio.create_task(self._cleaner_loop(cleaner_tick), name="log-cleaner"),
            asyncio.create_task(self._every(snapshot_tick, self._snapshots_and_checkpoints), name="snapshots"),
            asyncio.create_task(self._every(expiry_tick, self.manager.hosted.expire_producers), name="pid-expiration"),
            asyncio.create_task(self._every(isr_tick, self._check_isr), name="isr-check"),
        ]

    async def _delete_orphaned_logs(self) -> None:
        """Delete the replicas of topics deleted while this process was down (their
        topic znode is gone from ZooKeeper)."""
        for tp, path in self.manager.hosted.orphaned_logs():
            try:
                exists = await asyncio.to_thread(self.cluster.topic_exists, tp[0])
            except Exception as exc:  # noqa: BLE001 - ZooKeeper hiccup: keep the files, try at the next start
                log.warning("cannot check topic %s: %r", tp[0], exc)
                continue
            if not exists and tp not in self.manager.hosted.replicas:
                try:
                    self.manager.hosted.delete_orphaned(tp, path)
                except OSError as exc:
                    log.exception("deleting %s failed", path)
                    self.manager.hosted.fail_log_dir(exc)

    async def wait_ready(self) -> None:
        """Called once registered: wait (at most twice the ZooKeeper session timeout)
        until no partition state names this process leader from before it registered,
        i.e. until the controller has elected again after a restart, so that serving
        starts with leaderships this process can confirm."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self.cfg.settings.zookeeper_session_timeout_ms / 1000
        registered = None
        while loop.time() < deadline:
            try:
                registered = registered or await asyncio.to_thread(self.cluster.registration_zxid)
            except Exception as exc:  # noqa: BLE001 - ZooKeeper hiccup: try again
                log.debug("registration check failed: %r", exc)
            if registered is not None:
                stale = [(t.name, p) for t in self.cluster.topics().values() for p, st in list(t.states.items())
                         if st.leader == self.cfg.node_id and 0 <= st.mzxid < registered]
                if not stale:
                    return
            await asyncio.sleep(0.1)
        log.warning("still named leader by states older than this process's registration; serving anyway")

    async def stop(self) -> None:
        """Clean shutdown: resign as controller, stop replication and the tasks, flush
        every log, write final snapshots."""
        self._stopped = True
        await asyncio.to_thread(self.controller.stop)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.fetchers.stop()
        await self.isr.stop()
        await self.leases.stop()
        self.manager.hosted.close()
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
            self.manager.hosted.invalidate_leases()
        self.manager.hosted.zookeeper_suspended = state == "SUSPENDED"
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
        opened, closed = self.manager.hosted.refresh()
        self.fetchers.sync()
        changed = set(opened) | set(closed) | self.manager.hosted.changed
        if any(p.is_leader for tp, p in self.manager.hosted.replicas.items() if tp in changed):
            self.leases.wake()
        for tp in changed:
            self.notify(tp)

    def _check_isr(self) -> None:
        for tp in self.manager.hosted.isr_updates():
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
        try:
            self.manager.hosted.maybe_snapshot_all()
        except OSError as exc:  # the producer-state store on the data directory failed
            log.exception("producer-state snapshot failed")
            self.manager.hosted.fail_log_dir(exc)
            return
        due = self.manager.hosted.high_watermarks_to_checkpoint()
        if due:
            failed = await asyncio.to_thread(_checkpoint_all, due)
            if failed is not None:
                self.manager.hosted.fail_log_dir(failed)

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


async def setup(server: grpc.aio.Server, cluster: ClusterState, client: ClusterClient,
                cfg: ServiceConfig) -> PartitionLeaderService:
    """Create the partition leader on `server`: snapshot store under
    `<data_dir>/producer-state`, logs under `<data_dir>/logs/`."""
    store = SnapshotStore(cfg.data_dir / "producer-state")
    settings: PartitionLeaderSchema = cfg.settings
    manager = ReplicaManager(HostedReplicas(cfg.node_id, cfg.data_dir, settings, cluster, store))
    PARTITIONS.track(manager)
    manager.hosted.on_appended = count_produced
    manager.hosted.verifier = TxnVerifier(cluster, client)
    manager.hosted.verify_transactions = settings.transaction_partition_verification_enable
    manager.hosted.pid_bindings = cluster.pid_bindings  # set with the authorizer on (pid_binding.py)
    session_ms = settings.zookeeper_session_timeout_ms
    leases = LeaseKeeper(manager, cluster, max(session_ms * 2 // 3, 100), manager.hosted.purgatory.notify)
    manager.hosted.leases = leases
    servicer = PartitionLeaderServicer(manager)
    pbg.add_PartitionLeaderServicer_to_server(servicer, server)
    service = PartitionLeaderService(cfg, cluster, client, store, manager, servicer, leases)
    CLUSTER.track(service)
    return service
