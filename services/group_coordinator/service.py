"""Wiring of the group coordinator process: `setup()` for
services.common.transport.server (CONTRACT: `python -m services.group_coordinator`).

Settings (Kafka keys, `--set key=value`): group.min.session.timeout.ms (1000),
group.max.session.timeout.ms (1800000), group.initial.rebalance.delay.ms (0),
group.max.size, offset.metadata.max.bytes (4096), offsets.commit.timeout.ms
(5000), offsets.load.buffer.size, offsets.topic.num.partitions (8; read by the
cluster code that creates `CONSUMER_OFFSETS_TOPIC`).
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.cluster.state import ClusterState, partition_for_key
from services.common.protocol import CONSUMER_OFFSETS_TOPIC
from services.common.config import ServiceConfig
from services.common.cluster.ownership import CoordinatorOwnership
from services.common.transport.rpc import ClusterClient
from services.common.settings import GroupCoordinatorSchema
from services.common.cluster.verification import TxnVerifier

from .coordinator import GroupCoordinator
from services.common.security.authz import AuthorizedServicer

from .kafka_api import GroupCoordinatorApis
from .servicer import GroupCoordinatorServicer

log = logging.getLogger(__name__)


class GroupCoordinatorService:
    """Owns the coordinator and its partition ownership (ZooKeeper election)."""

    def __init__(self, coordinator: GroupCoordinator, ownership: CoordinatorOwnership,
                 servicer: GroupCoordinatorServicer | None = None):
        self.coordinator = coordinator
        self.ownership = ownership
        self.servicer = servicer

    def kafka_handlers(self) -> dict:
        """The Kafka protocol handlers of this role (services.common.kafka.surface)."""
        return GroupCoordinatorApis(AuthorizedServicer(self.servicer, "GroupCoordinator")).handlers()

    async def start(self) -> None:
        await self.coordinator.start()
        await self.ownership.start()

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Return once this process sees itself registered and every
        `CONSUMER_OFFSETS_TOPIC` partition it should own or holds is loaded (with none to
        own, e.g. more coordinators than partitions, at once), or after `timeout_s` (s)
        with a warning: serving then starts anyway and health stays NOT_SERVING until
        the loads finish."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.ownership.in_view() or self.loading:
            if loop.time() >= deadline:
                log.warning("partitions of %s still loading after %.0f s", CONSUMER_OFFSETS_TOPIC, timeout_s)
                return
            await asyncio.sleep(0.05)

    @property
    def loading(self) -> bool:
        """True while a `CONSUMER_OFFSETS_TOPIC` partition this process should own or holds
        is not loaded (CoordinatorOwnership.unloaded): services.common.transport.server
        reports NOT_SERVING meanwhile."""
        return bool(self.ownership.unloaded(self.coordinator.owned_partitions()))

    async def stop(self) -> None:
        await self.ownership.stop()
        await self.coordinator.stop()


def _partition_for(cluster: ClusterState):
    def partition_for(group_id: str) -> int:
        topic = cluster.topic(CONSUMER_OFFSETS_TOPIC)
        if topic is None or not topic.partitions:
            return -1
        return partition_for_key(group_id, len(topic.partitions))
    return partition_for


def _partition_counts(cluster: ClusterState):
    def partition_counts() -> dict[str, int]:
        return {name: len(t.partitions) for name, t in cluster.topics().items()}
    return partition_counts


async def setup(server: grpc.aio.Server, cluster: ClusterState, client: ClusterClient,
                cfg: ServiceConfig) -> GroupCoordinatorService:
    """Build the coordinator, register the GroupCoordinator servicer, and elect
    partitions of `CONSUMER_OFFSETS_TOPIC` (kind "group")."""
    settings: GroupCoordinatorSchema = cfg.settings
    load_delay_ms = settings.test_load_delay_ms
    log_client = SlowLoadClient(client, load_delay_ms) if load_delay_ms > 0 else client
    # on_fenced resigns through the ownership, which is built from the coordinator below.
    coordinator = GroupCoordinator(log_client, _partition_for(cluster), _partition_counts(cluster),
                                   settings,
                                   on_fenced=lambda partition, epoch: ownership.fenced(partition, epoch))
    if settings.transaction_partition_verification_enable:
        coordinator.verifier = TxnVerifier(cluster, client)
    if load_delay_ms > 0:
        log_client.is_loading = lambda p: coordinator.owned_partitions().get(p) is False
    servicer = GroupCoordinatorServicer(coordinator, cluster.pid_bindings)
    pbg.add_GroupCoordinatorServicer_to_server(servicer, server)
    ownership = CoordinatorOwnership(cluster, "group", coordinator.on_elected, coordinator.on_resigned)
    return GroupCoordinatorService(coordinator, ownership, servicer)


class SlowLoadClient:
    """Test hook, setting `exactly.test.load.delay.ms` (default 0: off): a fetch of an
    owned partition that is still loading waits that long first, which stretches each
    load, e.g. to watch health report NOT_SERVING meanwhile."""

    def __init__(self, inner: ClusterClient, delay_ms: int):
        self._inner = inner
        self._delay_s = delay_ms / 1000
        self.is_loading = lambda partition: False

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    async def fetch(self, topic: str, partition: int, offset: int, *args, **kwargs):
        if self.is_loading(partition):
            await asyncio.sleep(self._delay_s)
        return await self._inner.fetch(topic, partition, offset, *args, **kwargs)
