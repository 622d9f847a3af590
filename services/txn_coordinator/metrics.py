"""Prometheus series of the transaction coordinator (DESIGN.md §8)."""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram


class _PerPartitionGauge:
    """Active transactional ids per owned `__transaction_state` partition."""

    def __init__(self) -> None:
        self._gauge = Gauge("exactly_txn_coordinator_transactional_ids",
                            "Transactional ids cached by this coordinator, per __transaction_state partition",
                            ["partition"])

    def set(self, partition: int, count: int) -> None:
        self._gauge.labels(partition=str(partition)).set(count)

    def remove_partition(self, partition: int) -> None:
        try:
            self._gauge.remove(str(partition))
        except KeyError:
            pass


TRANSACTIONAL_IDS = _PerPartitionGauge()

TRANSACTIONS = Counter("exactly_txn_coordinator_transactions",
                       "Transactions completed by this coordinator, by outcome "
                       "(commit, abort; timeout_abort counts the aborts started by the timeout)",
                       ["outcome"])

REQUEST_LATENCY = Histogram("exactly_txn_coordinator_request_seconds",
                            "Latency of transaction coordinator RPCs", ["rpc"],
                            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
