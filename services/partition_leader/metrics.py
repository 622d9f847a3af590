"""Prometheus series of the partition leader (DESIGN.md §8).

Per-partition gauges (high watermark, LSO, log end offset, live PIDs, ongoing
transactions) are read from the open partitions at scrape time by a collector, so
the produce path pays nothing for them. RPC latency is a histogram per RPC.
"""
from __future__ import annotations

import weakref
from typing import Iterable

from prometheus_client import REGISTRY, Histogram
from prometheus_client.core import GaugeMetricFamily

_LABELS = ["topic", "partition"]


class PartitionCollector:
    """Reads the partitions of every registered ReplicaManager at scrape time."""

    def __init__(self) -> None:
        self._managers: weakref.WeakSet = weakref.WeakSet()

    def track(self, manager) -> None:
        self._managers.add(manager)

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable[GaugeMetricFamily]:
        series = {
            "high_watermark": GaugeMetricFamily("exactly_partition_leader_high_watermark",
                                                "High watermark per partition", labels=_LABELS),
            "last_stable_offset": GaugeMetricFamily("exactly_partition_leader_last_stable_offset",
                                                    "Last stable offset (LSO) per partition", labels=_LABELS),
            "log_end_offset": GaugeMetricFamily("exactly_partition_leader_log_end_offset",
                                                "Log end offset per partition", labels=_LABELS),
            "producer_ids": GaugeMetricFamily("exactly_partition_leader_producer_ids",
                                              "Live producer ids (PIDs) per partition", labels=_LABELS),
            "ongoing_transactions": GaugeMetricFamily("exactly_partition_leader_ongoing_transactions",
                                                      "Ongoing transactions per partition", labels=_LABELS),
        }
        for manager in list(self._managers):
            for p in list(manager.partitions.values()):
                labels = [p.topic, str(p.partition)]
                series["high_watermark"].add_metric(labels, p.high_watermark)
                series["last_stable_offset"].add_metric(labels, p.last_stable_offset)
                series["log_end_offset"].add_metric(labels, p.log_end_offset)
                series["producer_ids"].add_metric(labels, len(p.producers.producers))
                series["ongoing_transactions"].add_metric(labels, len(p.producers.ongoing))
        return list(series.values())


PARTITIONS = PartitionCollector()
REGISTRY.register(PARTITIONS)

REQUEST_LATENCY = Histogram("exactly_partition_leader_request_seconds",
                            "Latency of partition leader RPCs", ["rpc"],
                            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                     0.1, 0.25, 0.5, 1, 2.5, 5))
