"""The partition leader process: wiring of the replica manager, the servicer, the
cluster listener and the periodic producer-state tasks.

`setup(server, cluster, client, cfg)` is what `services.common.server.serve` calls
(see `__main__.py`). Settings (`--set key=value`, Kafka names; topic configs override
the log ones per topic):

    segment.bytes / log.segment.bytes                 1073741824
    index.interval.bytes / log.index.interval.bytes   4096
    flush.messages / log.flush.interval.messages      never (fsync on roll and shutdown)
    producer.snapshot.interval.ms                     30000
    producer.snapshot.retained                        3
    producer.id.expiration.ms                         86400000
    producer.id.expiration.check.interval.ms          600000
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from exactly.v1 import exactly_pb2_grpc as pbg
from services.common.cluster import ClusterState
from services.common.config import ServiceConfig
from services.common.rpc import ClusterClient

from .metrics import PARTITIONS
from .replica_manager import ReplicaManager
from .servicer import AppendNotifier, PartitionLeaderServicer
from .snapshot_store import SnapshotStore

log = logging.getLogger(__name__)


class PartitionLeaderService:
    """Lifecycle of one partition leader process (`start` / `stop`, as server.serve expects)."""

    def __init__(self, cfg: ServiceConfig, cluster: ClusterState, store: SnapshotStore,
                 manager: ReplicaManager, servicer: PartitionLeaderServicer):
        self.cfg = cfg
        self.cluster = cluster
        self.store = store
        self.manager = manager
        self.servicer = servicer
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refresh_pending = False
        self._stopped = False

    async def start(self) -> None:
        """Open the partitions led here, follow assignment changes, start the
        snapshot and PID-expiration tasks."""
        self._loop = asyncio.get_running_loop()
        self._refresh()
        self.cluster.add_listener(self._on_cluster_change)
        snapshot_tick = max(min(self.cfg.get_int("producer.snapshot.interval.ms", 30000), 1000), 10) / 1000
        expiry_tick = max(self.cfg.get_int("producer.id.expiration.check.interval.ms", 600000), 10) / 1000
        self._tasks = [
            asyncio.create_task(self._every(snapshot_tick, self.manager.maybe_snapshot_all), name="snapshots"),
            asyncio.create_task(self._every(expiry_tick, self.manager.expire_producers), name="pid-expiration"),
        ]

    async def stop(self) -> None:
        """Clean shutdown: stop the tasks, flush every log, write final snapshots."""
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.manager.close()
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

    def _refresh(self) -> None:
        self._refresh_pending = False
        if self._stopped:
            return
        opened, closed = self.manager.refresh()
        for tp in opened + closed:
            self.servicer.notifier.notify(tp)

    async def _every(self, seconds: float, fn) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                fn()
            except Exception:  # noqa: BLE001 - keep the periodic task alive; logged with traceback
                log.exception("periodic task %s failed", getattr(fn, "__name__", fn))


async def setup(server: grpc.aio.Server, cluster: ClusterState, client: ClusterClient,
                cfg: ServiceConfig) -> PartitionLeaderService:
    """Create the partition leader on `server`: snapshot store under
    `<data_dir>/producer-state`, logs under `<data_dir>/logs/`."""
    store = SnapshotStore(cfg.data_dir / "producer-state")
    manager = ReplicaManager(cfg.node_id, cfg.data_dir, cfg.props, cluster, store)
    PARTITIONS.track(manager)
    servicer = PartitionLeaderServicer(manager, AppendNotifier())
    pbg.add_PartitionLeaderServicer_to_server(servicer, server)
    return PartitionLeaderService(cfg, cluster, store, manager, servicer)
