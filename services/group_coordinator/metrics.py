"""Prometheus series of the group coordinator (DESIGN.md §8), as the Grafana
dashboard deploy/grafana/services.json reads them:

- exactly_group_groups{state}: groups of the owned partitions, by state;
- exactly_group_members: members of those groups;
- exactly_group_pending_txn_offsets: transactional offsets waiting for a marker;
- exactly_group_rebalances_total: completed rebalances;
- exactly_rpc_request_duration_seconds{service, method} and
  exactly_rpc_errors_total{service, method, error_code}: RPC latency and
  error outcomes (service="group_coordinator").

Gauges are read from the coordinators at scrape time (nothing on the request path).
"""
from __future__ import annotations

import weakref
from typing import Iterable

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

SERVICE = "group_coordinator"


def _shared(factory, name: str, *args, **kwargs):
    """Create a metric, or reuse the one of that name another module of this
    process already registered (the RPC series are shared by every service)."""
    try:
        return factory(name, *args, **kwargs)
    except ValueError:
        names = REGISTRY._names_to_collectors  # noqa: SLF001 - no public lookup
        for suffix in ("", "_total", "_bucket"):
            if name + suffix in names:
                return names[name + suffix]
        raise


class GroupCollector:
    """Reads every tracked GroupCoordinator at scrape time."""

    def __init__(self) -> None:
        self._coordinators: weakref.WeakSet = weakref.WeakSet()

    def track(self, coordinator) -> None:
        self._coordinators.add(coordinator)

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable[GaugeMetricFamily]:
        groups = GaugeMetricFamily("exactly_group_groups", "Consumer groups of the owned "
                                   "__consumer_offsets partitions, by state", labels=["state"])
        members = GaugeMetricFamily("exactly_group_members", "Members of the consumer groups")
        pending = GaugeMetricFamily("exactly_group_pending_txn_offsets",
                                    "Transactional offsets waiting for their transaction marker")
        by_state: dict[str, int] = {}
        n_members = n_pending = 0
        for coordinator in list(self._coordinators):
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
REGISTRY.register(GROUPS)

REBALANCES = Counter("exactly_group_rebalances", "Completed consumer group rebalances")

REQUEST_DURATION = _shared(Histogram, "exactly_rpc_request_duration_seconds",
                           "Latency of RPCs served, by service and method", ["service", "method"],
                           buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                    1, 2.5, 5, 10, 30))

RPC_ERRORS = _shared(Counter, "exactly_rpc_errors", "RPC answers carrying an error code, "
                     "by service, method and error code name", ["service", "method", "error_code"])
