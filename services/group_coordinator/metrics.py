"""Prometheus series of the group coordinator (docs/design.md, "Metrics"), as the Grafana
dashboard deploy/grafana/services.json reads them:

- exactly_group_groups{state}: groups of the owned `CONSUMER_OFFSETS_TOPIC` partitions, by
  group state (every state is exported, 0 when none);
- exactly_group_members: members of those groups;
- exactly_group_pending_txn_offsets: transactional offsets waiting for their marker;
- exactly_group_rebalances_total: completed rebalances (new generations);
- exactly_group_committed_offset{group, topic, partition}: the committed offset (the
  next offset the group consumes) of every partition with one;
- exactly_group_lag_offsets{group, topic, partition}: last stable offset (LSO) minus
  the committed offset (0 at least): what a read_committed member still has to read.
  Without `metrics.topic.labels=true` both are summed per group over the user topics
  under topic="(hidden)" and no partition, and without `metrics.group.labels=true` over
  the groups under group="(hidden)" (services/common/metrics.py, "Topic and group
  labels"): /metrics, which answers before authentication, names no group ListGroups
  would hide from its reader.
  The LSO is the last one known: each scrape starts a refresh (ListOffsets -3 to the
  partitions' leaders, at most one at a time and at most once per
  `LAG_REFRESH_MIN_INTERVAL_S`) and reports what the previous refresh found, so the
  lag is one scrape interval old and a partition appears from the second scrape on.
  A partition whose leader could not be asked keeps its previous LSO (none: no lag
  series). Nothing is done on the request path;
- exactly_coordinator_partitions{kind="group", state}: owned `CONSUMER_OFFSETS_TOPIC`
  partitions, loading or serving (services/common/metrics.py).

Gauges are read from the coordinators at scrape time, on their event loop. RPC
latency and error codes are recorded for every service by services/common/metrics.py.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Sequence

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.common.metrics import LoopCollector, TopicRows, coordinator_partitions, group_label
from services.common.protocol import CONSUMER_OFFSETS_TOPIC

from .group import GroupState

log = logging.getLogger(__name__)

LAST_STABLE_OFFSET = -3  # ListOffsets timestamp of the LSO
LAG_REFRESH_MIN_INTERVAL_S = 1.0


def committed_offsets(coordinator) -> dict[tuple[str, TopicPartition], int]:
    """{(group, partition): committed offset} over the coordinator's serving partitions."""
    out: dict[tuple[str, TopicPartition], int] = {}
    for partition, serving in coordinator.owned_partitions().items():
        state = coordinator.partition_state(partition) if serving else None
        if state is None:
            continue
        offsets = state.offsets
        for group in offsets.groups():
            for tp in offsets.committed_partitions(group):
                committed = offsets.committed(group, tp)
                if committed is not None and committed.offset >= 0:
                    out[(group, tp)] = committed.offset
    return out


class GroupCollector(LoopCollector):
    """Reads every tracked GroupCoordinator (`stats()`, its committed offsets) at scrape
    time; keeps the last known LSO per partition for the lag (module docstring)."""

    def __init__(self, monotonic_s: Callable[[], float] = time.monotonic, **kwargs) -> None:
        super().__init__(**kwargs)
        self._monotonic_s = monotonic_s
        self.last_stable: dict[TopicPartition, int] = {}
        self._refreshing: asyncio.Task | None = None
        self._refreshed_at = float("-inf")

    def families(self, coordinators: Sequence) -> list[GaugeMetricFamily]:
        groups = GaugeMetricFamily("exactly_group_groups", "Consumer groups of the owned "
                                   f"{CONSUMER_OFFSETS_TOPIC} partitions, by state", labels=["state"])
        members = GaugeMetricFamily("exactly_group_members", "Members of the consumer groups")
        pending = GaugeMetricFamily("exactly_group_pending_txn_offsets",
                                    "Transactional offsets waiting for their transaction marker")
        committed = TopicRows(GaugeMetricFamily("exactly_group_committed_offset",
                                                "Committed offset of the group on the partition",
                                                labels=["group", "topic", "partition"]))
        lag = TopicRows(GaugeMetricFamily("exactly_group_lag_offsets",
                                          "Last stable offset minus the committed offset, in offsets (last known "
                                          "LSO)", labels=["group", "topic", "partition"]))
        by_state: dict[str, int] = {state.value: 0 for state in GroupState}
        n_members = n_pending = 0
        wanted: dict[TopicPartition, Any] = {}
        for coordinator in coordinators:
            stats = coordinator.stats()
            for state, count in stats.groups_by_state.items():
                by_state[state] = by_state.get(state, 0) + count
            n_members += stats.members
            n_pending += stats.pending_txn_offsets
            for (group, tp), offset in sorted(committed_offsets(coordinator).items()):
                committed.add((group_label(group),), tp[0], tp[1], offset)
                wanted[TopicPartition(*tp)] = coordinator.client
                lso = self.last_stable.get(TopicPartition(*tp))
                if lso is not None:
                    lag.add((group_label(group),), tp[0], tp[1], max(lso - offset, 0))
        for state, count in sorted(by_state.items()):
            groups.add_metric([state], count)
        members.add_metric([], n_members)
        pending.add_metric([], n_pending)
        for tp in set(self.last_stable) - set(wanted):
            del self.last_stable[tp]
        self._maybe_refresh(wanted)
        return [groups, members, pending, committed.done(), lag.done(), coordinator_partitions("group", coordinators)]

    def _maybe_refresh(self, wanted: dict[TopicPartition, Any]) -> None:
        """Start a refresh of the LSOs of `wanted` ({partition: client with
        `list_offset`}) on the running loop, unless one runs or ran just now."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop here (unit tests reading the registry): refresh() by hand
        now = self._monotonic_s()
        if not wanted or (self._refreshing is not None and not self._refreshing.done()) or \
                now - self._refreshed_at < LAG_REFRESH_MIN_INTERVAL_S:
            return
        self._refreshed_at = now
        self._refreshing = loop.create_task(self.refresh(wanted), name="group-lag-refresh")

    async def refresh(self, wanted: dict[TopicPartition, Any]) -> None:
        """Ask each partition's leader for its LSO (ListOffsets -3) and keep the answers."""
        tps = list(wanted)
        answers = await asyncio.gather(*(wanted[tp].list_offset(tp[0], tp[1], LAST_STABLE_OFFSET) for tp in tps),
                                       return_exceptions=True)
        for tp, answer in zip(tps, answers):
            if isinstance(answer, BaseException):
                log.debug("LSO of %s-%d for the lag: %r", tp[0], tp[1], answer)
                continue
            code, offset = answer
            if code == ErrorCode.NONE and offset >= 0:
                self.last_stable[tp] = offset


GROUPS = GroupCollector()

REBALANCES = Counter("exactly_group_rebalances", "Completed consumer group rebalances (new generations)")
