"""Prometheus series of the group coordinator (docs/design.md, "Metrics"), as the Grafana
dashboard deploy/grafana/services.json reads them:

- exactly_group_groups{state}: groups of the owned __consumer_offsets partitions, by
  group state (every state is exported, 0 when none);
- exactly_group_members: members of those groups;
- exactly_group_pending_txn_offsets: transactional offsets waiting for their marker;
- exactly_group_rebalances_total: completed rebalances (new generations).

Gauges are read from the coordinators at scrape time, on their event loop (nothing
on the request path). RPC latency and error codes are recorded for every service by
services/common/metrics.py.
"""
from __future__ import annotations

from typing import Sequence

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

from services.common.metrics import LoopCollector

from .group import GroupState


class GroupCollector(LoopCollector):
    """Reads every tracked GroupCoordinator (`stats()`) at scrape time."""

    def families(self, coordinators: Sequence) -> list[GaugeMetricFamily]:
        groups = GaugeMetricFamily("exactly_group_groups", "Consumer groups of the owned "
                                   "__consumer_offsets partitions, by state", labels=["state"])
        members = GaugeMetricFamily("exactly_group_members", "Members of the consumer groups")
        pending = GaugeMetricFamily("exactly_group_pending_txn_offsets",
                                    "Transactional offsets waiting for their transaction marker")
        by_state: dict[str, int] = {state.value: 0 for state in GroupState}
        n_members = n_pending = 0
        for coordinator in coordinators:
            stats = coordinator.stats()
            for state, count in stats.groups_by_state.items():
                by_state[state] = by_state.get(state, 0) + count
            n_members += stats.members
            n_pending += stats.pending_txn_offsets
        for state, count in sorted(by_state.items()):
            groups.add_metric([state], count)
        members.add_metric([], n_members)
        pending.add_metric([], n_pending)
        return [groups, members, pending]


GROUPS = GroupCollector()

REBALANCES = Counter("exactly_group_rebalances", "Completed consumer group rebalances (new generations)")
