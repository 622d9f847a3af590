"""The partitions this process leads, opened from and closed into its data directory.

`ReplicaManager.refresh()` compares the cluster's assignment
(`cluster.partitions_led_by(node_id)`) with the open partitions: newly led ones are
opened (log recovery + producer-state load), no longer led ones are closed (snapshot,
flush) and their files kept. `get()` resolves a request's (topic, partition) to an
open partition or an error code. Pure domain code: the cluster is anything with
`topics()` and `partitions_led_by(node_id)` (services.common.cluster.ClusterState).

Not thread-safe: the service calls it from its event loop only.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping, Protocol

from exactly.errors import ErrorCode

from .partition import Partition, PartitionConfig
from .snapshot_store import SnapshotStore

log = logging.getLogger(__name__)


class ClusterView(Protocol):
    def topics(self) -> Mapping[str, object]: ...

    def partitions_led_by(self, node_id: str) -> list[tuple[str, int]]: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


def _leader_epoch(topic_info, partition: int) -> int:
    st = getattr(topic_info, "states", {}).get(partition)
    return st.leader_epoch if st is not None else 0


def _leader(topic_info, partition: int) -> str | None:
    return topic_info.leader(partition)


class ReplicaManager:
    """Open partitions by (topic, partition).

    node_id: this process; data_dir: its data directory (logs under `logs/`,
    snapshots in `store`); props: process settings (Kafka keys, see
    `PartitionConfig.from_settings`), topic configs from the cluster override them.
    """

    def __init__(self, node_id: str, data_dir: Path, props: Mapping[str, str], cluster: ClusterView,
                 store: SnapshotStore, clock_ms: Callable[[], int] = _now_ms):
        self.node_id = node_id
        self.data_dir = data_dir
        self.props = dict(props)
        self.cluster = cluster
        self.store = store
        self.clock_ms = clock_ms
        self.partitions: dict[tuple[str, int], Partition] = {}

    def __iter__(self) -> Iterator[Partition]:
        return iter(list(self.partitions.values()))

    def _open(self, topic_info, partition: int) -> Partition:
        name = topic_info.name
        config = PartitionConfig.from_settings(self.props, getattr(topic_info, "configs", {}))
        p = Partition.open(name, partition, self.data_dir, config, self.store,
                           internal=bool(getattr(topic_info, "internal", False)) or name.startswith("__"),
                           leader_epoch=_leader_epoch(topic_info, partition), clock_ms=self.clock_ms)
        self.partitions[(name, partition)] = p
        log.info("leading %s-%d: log end %d, high watermark %d, %d producers (snapshot at %s)",
                 name, partition, p.log_end_offset, p.high_watermark, len(p.producers.producers),
                 p.snapshot_loaded_from)
        return p

    def refresh(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """Open newly led partitions and close the ones no longer led here.
        Returns (opened, closed). A partition that fails to open (OSError) is logged
        and retried at the next refresh."""
        topics = self.cluster.topics()
        led = set(self.cluster.partitions_led_by(self.node_id))
        opened, closed = [], []
        for tp in sorted(led - set(self.partitions)):
            try:
                self._open(topics[tp[0]], tp[1])
                opened.append(tp)
            except (OSError, KeyError):
                log.exception("cannot open %s-%d", *tp)
        for tp in sorted(set(self.partitions) - led):
            self.close_partition(tp)
            closed.append(tp)
        for (name, partition), p in self.partitions.items():
            info = topics.get(name)
            if info is not None:
                p.leader_epoch = max(p.leader_epoch, _leader_epoch(info, partition))
        return opened, closed

    def close_partition(self, tp: tuple[str, int]) -> None:
        p = self.partitions.pop(tp, None)
        if p is None:
            return
        try:
            p.close()
        except OSError:
            log.exception("closing %s-%d failed", *tp)
        log.info("no longer leading %s-%d", *tp)

    def get(self, topic: str, partition: int) -> tuple[Partition | None, ErrorCode]:
        """The open partition for a request, or (None, error): UNKNOWN_TOPIC_OR_PARTITION
        (no such topic or partition), NOT_LEADER_OR_FOLLOWER (led elsewhere),
        KAFKA_STORAGE_ERROR (led here but its files cannot be opened). A partition
        just assigned here but not yet opened by `refresh` is opened on demand."""
        p = self.partitions.get((topic, partition))
        if p is not None:
            return p, ErrorCode.NONE
        info = self.cluster.topics().get(topic)
        if info is None or partition not in info.partitions:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if _leader(info, partition) != self.node_id:
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        try:
            return self._open(info, partition), ErrorCode.NONE
        except OSError:
            log.exception("cannot open %s-%d", topic, partition)
            return None, ErrorCode.KAFKA_STORAGE_ERROR

    def maybe_snapshot_all(self, now_ms: int | None = None) -> int:
        """Periodic producer-state snapshots; returns how many were written."""
        return sum(p.maybe_snapshot(now_ms) for p in self)

    def expire_producers(self, now_ms: int | None = None) -> int:
        """PID expiration on every partition; returns how many PIDs were dropped."""
        return sum(len(p.expire_producers(now_ms)) for p in self)

    def close(self) -> None:
        """Close every partition (flush, final snapshot). Clean shutdown."""
        for tp in list(self.partitions):
            self.close_partition(tp)
