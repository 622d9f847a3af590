"""Ownership of internal-topic partitions by coordinators, elected through ZooKeeper.

Partition p of `__transaction_state` (kind "txn") or `__consumer_offsets` ("group")
belongs to the live coordinator sorted_ids[p % n] of that kind. The owner claims it
with a compare-and-set that bumps the coordinator epoch (DESIGN.md §1), then loads it;
a coordinator whose claim was overwritten, or whose ZooKeeper session was lost,
resigns at once (STYLE.md 10).
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Awaitable, Callable

from .cluster import COORDINATORS, INTERNAL_TOPIC_FOR_KIND, ROLE_FOR_KIND, ClusterState

log = logging.getLogger(__name__)


class CoordinatorOwnership:
    """Runs on the service's asyncio loop.

    on_elected(partition, coordinator_epoch) and on_resigned(partition) are awaited on
    that loop; on_elected should start loading in a task of its own and return quickly.
    """

    def __init__(self, cluster: ClusterState, kind: str,
                 on_elected: Callable[[int, int], Awaitable[None]],
                 on_resigned: Callable[[int], Awaitable[None]]):
        self.cluster = cluster
        self.kind = kind
        self.topic = INTERNAL_TOPIC_FOR_KIND[kind]
        self.role = ROLE_FOR_KIND[kind]
        self._on_elected = on_elected
        self._on_resigned = on_resigned
        self._owned: dict[int, int] = {}  # partition -> coordinator epoch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._lost = False
        self._task: asyncio.Task | None = None

    @property
    def owned(self) -> dict[int, int]:
        """partition -> coordinator epoch of the partitions this process owns."""
        return dict(self._owned)

    def owns(self, partition: int) -> bool:
        return partition in self._owned

    def epoch(self, partition: int) -> int:
        """Coordinator epoch of an owned partition (-1 if not owned)."""
        return self._owned.get(partition, -1)

    async def start(self) -> None:
        """Create the internal topic if needed (waiting for a live partition leader),
        then start electing."""
        self._loop = asyncio.get_running_loop()
        while True:
            try:
                await asyncio.to_thread(self.cluster.ensure_internal_topic, self.kind)
                break
            except RuntimeError as exc:
                log.info("waiting to create %s: %s", self.topic, exc)
                await asyncio.sleep(0.5)
        self.cluster.add_listener(self._kick)
        self.cluster.add_session_listener(self._on_session)
        self._task = asyncio.create_task(self._run(), name=f"{self.kind}-ownership")
        self._kick()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        for p in list(self._owned):
            await self._resign(p)

    def _kick(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    def _on_session(self, state: str) -> None:
        if state == "LOST":
            self._lost = True
        elif state == "CONNECTED":
            self._lost = False
        self._kick()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._reconcile()
            except Exception:  # noqa: BLE001 - keep electing; ZooKeeper may be flapping
                log.exception("coordinator election for %s failed; retrying", self.kind)
                await asyncio.sleep(0.5)
                self._wake.set()

    def _desired(self) -> set[int]:
        if self._lost:
            return set()
        topic = self.cluster.topics().get(self.topic)
        if topic is None:
            return set()
        live = sorted(n.node_id for n in self.cluster.nodes().values() if n.role == self.role)
        if self.cluster.node_id not in live:
            return set()
        return {p for p in topic.partitions if live[p % len(live)] == self.cluster.node_id}

    async def _reconcile(self) -> None:
        desired = self._desired()
        for p in sorted(set(self._owned) - desired):
            await self._resign(p)
        for p in sorted(desired - set(self._owned)):
            epoch = await asyncio.to_thread(self.cluster.claim_coordinator, self.kind, p)
            self._owned[p] = epoch
            log.info("%s coordinator for %s-%d, coordinator epoch %d", self.kind, self.topic, p, epoch)
            self.cluster.zk.DataWatch(f"{COORDINATORS}/{self.kind}/{p}",
                                      lambda data, stat, p=p: self._on_owner_change(p, data))
            await self._on_elected(p, epoch)

    def _on_owner_change(self, partition: int, data: bytes | None) -> bool | None:
        if partition not in self._owned:
            return False  # stop watching
        if data:
            d = json.loads(data)
            if d.get("owner") != self.cluster.node_id or int(d.get("coordinator_epoch", -1)) != self._owned.get(partition):
                # Someone else claimed it: stop at once.
                if self._loop is not None:
                    asyncio.run_coroutine_threadsafe(self._resign(partition), self._loop)
        return None

    async def _resign(self, partition: int) -> None:
        if self._owned.pop(partition, None) is None:
            return
        log.info("%s coordinator resigns %s-%d", self.kind, self.topic, partition)
        try:
            await self._on_resigned(partition)
        finally:
            self._kick()
