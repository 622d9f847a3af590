"""Wiring of the transaction coordinator process (CONTRACT: `setup(server, cluster,
client, cfg) -> service` for services.common.transport.server.main_for)."""
from __future__ import annotations

import asyncio
import logging
import time

import grpc

from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.cluster.state import ClusterState
from services.common.protocol import TRANSACTION_STATE_TOPIC
from services.common.config import ServiceConfig
from services.common.cluster.ownership import CoordinatorOwnership
from services.common.security.pid_binding import RatePerPrincipal
from services.common.transport.rpc import ClusterClient
from services.common.settings import TxnCoordinatorSchema

from . import metrics
from services.partition_leader.host import ReplicaHost

from .adapters import ClusterMarkerWriter, ClusterTopology, ClusterTxnLog, Linger, LocalAppender
from .coordinator import TransactionCoordinator
from .pid_manager import BLOCK_SIZE, ProducerIdManager
from .ports import TxnLogFetch
from services.common.security.authz import AuthorizedServicer

from .kafka_api import TxnCoordinatorApis
from .servicer import TxnCoordinatorServicer

log = logging.getLogger(__name__)

ROLE = "txn_coordinator"


class TxnCoordinatorService:
    """Owns the coordinator, its election to `TRANSACTION_STATE_TOPIC` partitions and the
    creation of that topic (transaction.state.log.num.partitions, default 8;
    transaction.state.log.replication.factor, default 1), and `host` (None unless this
    process runs at metadata.version 3, `ClusterState.hosts_replicas`): the replicas of
    that topic assigned to this process, which from level 3 are those of the partitions
    it owns (it leads them once in sync; docs/design/coordinator-local-logs.md) and
    those it is leaving."""

    def __init__(self, cluster: ClusterState, coordinator: TransactionCoordinator,
                 ownership: CoordinatorOwnership, cfg: ServiceConfig, host: ReplicaHost | None):
        self.cluster = cluster
        self.coordinator = coordinator
        self.ownership = ownership
        self.cfg = cfg
        self.host = host
        self._topic_task: asyncio.Task | None = None
        self.servicer: TxnCoordinatorServicer | None = None

    def kafka_handlers(self) -> dict:
        """The Kafka protocol handlers of this role (services.common.kafka.surface)."""
        return TxnCoordinatorApis(AuthorizedServicer(self.servicer, "TransactionCoordinator")).handlers()

    async def start(self) -> None:
        if self.host is not None:
            await self.host.start()
        await self.coordinator.start()
        loop = asyncio.get_running_loop()
        self.cluster.add_feature_listener(
            lambda level: loop.call_soon_threadsafe(self.coordinator.metadata_version_changed))
        self._topic_task = asyncio.create_task(self._ensure_topic(), name="ensure-transaction-state-topic")
        await self.ownership.start()

    async def _ensure_topic(self) -> None:
        settings: TxnCoordinatorSchema = self.cfg.settings
        partitions = settings.state_log_num_partitions
        replication = settings.state_log_replication_factor
        while True:
            try:
                await asyncio.to_thread(self.cluster.ensure_internal_topic, "txn", partitions, replication)
                return
            except Exception as exc:  # noqa: BLE001 - no partition leader yet, ZooKeeper hiccup
                log.info("cannot create %s yet (%s); retrying", TRANSACTION_STATE_TOPIC, exc)
                await asyncio.sleep(0.5)

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Return once this process sees itself registered and every
        `TRANSACTION_STATE_TOPIC` partition it should own or holds is loaded, so that a
        (re)started coordinator answers requests right after it reports SERVING;
        bounded by exactly.txn.ready.timeout.ms (then a warning, and health stays
        NOT_SERVING until the loads finish). While the topic does not exist yet but a
        partition leader is live, it waits for the topic too."""
        if timeout_s is None:
            timeout_s = self.cfg.settings.txn_ready_timeout_ms / 1000
        deadline = time.monotonic() + timeout_s
        if self.host is not None:
            await self.host.wait_ready()  # bounded by twice the ZooKeeper session timeout
        while not self.ownership.in_view() or self.loading or self._topic_pending():
            if time.monotonic() >= deadline:
                log.warning("transaction log partitions not all loaded after %.0f s; serving anyway", timeout_s)
                return
            await asyncio.sleep(0.05)

    def _topic_pending(self) -> bool:
        """The topic is still to be created and a partition leader could serve it."""
        return (self.cluster.topic(TRANSACTION_STATE_TOPIC) is None
                and any(n.role == "partition_leader" for n in self.cluster.nodes().values()))

    @property
    def loading(self) -> bool:
        """True while a `TRANSACTION_STATE_TOPIC` partition this process should own or holds
        is not loaded, or is disabled as corrupt (CoordinatorOwnership.unloaded):
        services.common.transport.server reports NOT_SERVING meanwhile."""
        return bool(self.ownership.unloaded(self.coordinator.owned_partitions()))

    async def stop(self) -> None:
        if self._topic_task is not None:
            self._topic_task.cancel()
        await self.ownership.stop()
        await self.coordinator.stop()
        if self.host is not None:
            await self.host.stop()


async def setup(server: grpc.aio.Server, cluster: ClusterState, client: ClusterClient,
                cfg: ServiceConfig) -> TxnCoordinatorService:
    """Build the coordinator over the cluster and register its gRPC servicer.
    Settings: services.common.settings.TxnCoordinatorSchema."""
    settings: TxnCoordinatorSchema = cfg.settings
    bind = cluster.pid_bindings is not None  # the authorizer is on
    topology = ClusterTopology(cluster)

    async def allocate_block() -> tuple[int, int]:
        # With bindings a producer id p serves partition p % n only: n times the
        # block keeps BLOCK_SIZE ids per partition.
        size = BLOCK_SIZE * max(1, topology.txn_partition_count()) if bind else BLOCK_SIZE
        block = await asyncio.to_thread(cluster.allocate_producer_id_block, size)
        metrics.PID_BLOCKS.inc()
        return block

    pids = ProducerIdManager(allocate_block)
    linger = Linger(settings.txn_batch_linger_ms)
    # With metadata.version 3 enabled, the replicas of the transaction log assigned here
    # (none below level 3): appends to a partition this process leads go to them directly.
    host = None
    if cluster.hosts_replicas:
        host = ReplicaHost(cfg, cluster, client, hosts_topic=lambda topic: topic == TRANSACTION_STATE_TOPIC)
        pbg.add_PartitionLeaderServicer_to_server(host.servicer, server)
    txn_log = ClusterTxnLog(client, linger=linger,
                            local=LocalAppender(cfg.node_id, host.manager) if host is not None else None)
    load_delay_ms = settings.test_load_delay_ms
    if load_delay_ms > 0:
        txn_log = SlowLoadTxnLog(txn_log, load_delay_ms)
    # on_fenced resigns through the ownership, which is built from the coordinator below.
    coordinator = TransactionCoordinator.build(txn_log, ClusterMarkerWriter(cluster, client, linger=linger),
                                               topology, pids, settings,
                                               on_fenced=lambda partition, epoch: ownership.fenced(partition, epoch),
                                               bind_producer_ids=bind)
    linger.bind(lambda: coordinator.recently_active() > 1)
    ownership = CoordinatorOwnership(cluster, "txn", coordinator.on_elected, coordinator.on_resigned)
    rate = settings.producer_ids_rate
    servicer = TxnCoordinatorServicer(coordinator, RatePerPrincipal(rate) if bind and rate > 0 else None)
    pbg.add_TransactionCoordinatorServicer_to_server(servicer, server)
    metrics.STATES.track(coordinator)
    service = TxnCoordinatorService(cluster, coordinator, ownership, cfg, host)
    service.servicer = servicer
    return service


class SlowLoadTxnLog:
    """Test hook, setting `exactly.test.load.delay.ms` (default 0: off): every read of
    the transaction log waits that long first. Only partition loads read the log, so
    this stretches each load, e.g. to watch health report NOT_SERVING meanwhile."""

    def __init__(self, inner: ClusterTxnLog, delay_ms: int):
        self._inner = inner
        self._delay_s = delay_ms / 1000

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    async def fetch(self, partition: int, offset: int, max_bytes: int) -> TxnLogFetch:
        await asyncio.sleep(self._delay_s)
        return await self._inner.fetch(partition, offset, max_bytes)
