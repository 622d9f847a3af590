"""The partition leader process: the replicas of every topic assigned to it (host.py's
ReplicaHost: the replica manager, the servicer, replication, leases, ISR updates, the
cleaner and the periodic producer-state tasks), the controller candidacy, and the Kafka
protocol handlers.

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
    controller.sweep.interval.ms                      10000 (a backstop: watches start sweeps)
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
from services.common.cluster.controller import Controller
from services.common.cluster.state import ClusterState
from services.common.config import ServiceConfig
from services.common.security.authz import AuthorizedServicer
from services.common.settings import PartitionLeaderSchema
from services.common.transport.rpc import ClusterClient

from .host import ReplicaHost
from .kafka_api import PartitionLeaderApis
from .metrics import CLUSTER, PARTITIONS

log = logging.getLogger(__name__)


class PartitionLeaderService:
    """Lifecycle of one partition leader process (`start` / `stop`, as server.serve expects):
    `host` (a ReplicaHost of every topic) and the controller candidacy."""

    def __init__(self, cfg: ServiceConfig, cluster: ClusterState, host: ReplicaHost):
        self.cfg = cfg
        self.cluster = cluster
        self.host = host
        settings: PartitionLeaderSchema = cfg.settings
        self.controller = Controller(cluster, settings.controller_sweep_interval_ms)

    def kafka_handlers(self) -> dict:
        """The Kafka protocol handlers of this role (services.common.kafka.surface)."""
        return PartitionLeaderApis(AuthorizedServicer(self.host.servicer, "PartitionLeader"), self.host.manager).handlers()

    async def start(self) -> None:
        """Start the replica host (open the replicas assigned here, replication, the
        periodic tasks), then stand for controller."""
        await self.host.start()
        self.controller.start()

    async def wait_ready(self) -> None:
        """Called once registered: the replica host's wait for the controller's
        elections after a restart (ReplicaHost.wait_ready)."""
        await self.host.wait_ready()

    async def stop(self) -> None:
        """Clean shutdown: resign as controller, then stop the replica host (replication,
        the tasks, every log flushed, final snapshots)."""
        await asyncio.to_thread(self.controller.stop)
        await self.host.stop()


async def setup(server: grpc.aio.Server, cluster: ClusterState, client: ClusterClient,
                cfg: ServiceConfig) -> PartitionLeaderService:
    """Create the partition leader on `server`: snapshot store under
    `<data_dir>/producer-state`, logs under `<data_dir>/logs/`."""
    host = ReplicaHost(cfg, cluster, client)
    PARTITIONS.track(host.manager)
    pbg.add_PartitionLeaderServicer_to_server(host.servicer, server)
    service = PartitionLeaderService(cfg, cluster, host)
    CLUSTER.track(service)
    return service
