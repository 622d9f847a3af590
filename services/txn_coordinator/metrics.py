"""Prometheus series of the transaction coordinator (docs/design.md, "Metrics"), as the Grafana
dashboards in deploy/grafana read them:

- exactly_txn_active_transactional_ids{partition}: transactional ids cached by this
  coordinator, per owned `TRANSACTION_STATE_TOPIC` partition (gauge);
- exactly_txn_transactions{state}: transactional ids by state of the transaction
  state machine (Empty, Ongoing, PrepareCommit, ...; every state exported, 0 when
  none; a prepared transaction is Ongoing), read at scrape time on the event loop;
- exactly_txn_prepared_transactions: transactions sealed by PrepareTxn and not yet
  decided (KIP-939), and exactly_txn_oldest_prepared_transaction_age_seconds: how long
  the oldest of them has waited for its decision (0 when none): the coordinator never
  decides one itself, so the alert ExactlyPreparedTransactionWaiting watches it;
- exactly_txn_completed_total{outcome, cause}: completed transactions, outcome
  commit|abort, cause client (the producer's EndTxn; also completions resumed after a
  coordinator move, whose cause the log does not record), timeout (aborted after
  transaction.timeout.ms) or fencing (aborted for a newer producer epoch: InitProducerId
  of the same transactional.id or of the group's next generation);
- exactly_txn_end_to_complete_seconds: from an EndTxn request to its Complete record
  (markers written on every partition), histogram;
- exactly_txn_marker_write_seconds: writing one transaction's markers to all of its
  partitions, retries included, histogram;
- exactly_txn_pid_blocks_allocated_total: producer id blocks reserved in ZooKeeper;
- exactly_txn_producer_id_bindings{partition}: live producer-id bindings (with the
  authorizer on), per owned `TRANSACTION_STATE_TOPIC` partition (gauge);
- exactly_txn_init_producer_id_throttled_total: InitProducerId calls refused by
  exactly.producer.ids.rate (THROTTLING_QUOTA_EXCEEDED);
- exactly_txn_init_producer_id_over_cap_total: InitProducerId calls refused by
  exactly.producer.ids.max.per.principal / exactly.transactional.ids.max.per.principal
  (POLICY_VIOLATION);
- exactly_coordinator_partitions{kind="txn", state}: owned `TRANSACTION_STATE_TOPIC`
  partitions, loading or serving (services/common/metrics.py).

RPC latency and error codes are recorded for every service by services/common/metrics.py.
"""
from __future__ import annotations

from typing import Sequence

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from services.common.metrics import LoopCollector, coordinator_partitions
from services.common.protocol import TRANSACTION_STATE_TOPIC

from .state import TxnState

OUTCOMES = ("commit", "abort")
CAUSES = ("client", "timeout", "fencing")

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _PerPartitionGauge:
    """A count per owned `TRANSACTION_STATE_TOPIC` partition (name, help: the series')."""

    def __init__(self, name: str, doc: str) -> None:
        self._gauge = Gauge(name, doc, ["partition"])
        self._children: dict[int, Gauge] = {}  # partition -> its series (set on every new id: no label lookup)

    def set(self, partition: int, count: int) -> None:
        child = self._children.get(partition)
        if child is None:
            child = self._children[partition] = self._gauge.labels(partition=str(partition))
        child.set(count)

    def remove_partition(self, partition: int) -> None:
        self._children.pop(partition, None)
        try:
            self._gauge.remove(str(partition))
        except KeyError:
            pass


TRANSACTIONAL_IDS = _PerPartitionGauge("exactly_txn_active_transactional_ids",
                                       f"Transactional ids cached by this coordinator, per {TRANSACTION_STATE_TOPIC} partition")
PRODUCER_ID_BINDINGS = _PerPartitionGauge("exactly_txn_producer_id_bindings",
                                          "Live producer-id bindings held by this coordinator, per "
                                          f"{TRANSACTION_STATE_TOPIC} partition")


class TransactionStateCollector(LoopCollector):
    """exactly_txn_transactions{state} over every tracked TransactionCoordinator
    (its `state_counts()`)."""

    def families(self, coordinators: Sequence) -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily("exactly_txn_transactions",
                                   "Transactional ids by transaction state", labels=["state"])
        counts = {state.kafka_name: 0 for state in TxnState}
        for coordinator in coordinators:
            for state, n in coordinator.state_counts().items():
                counts[state] = counts.get(state, 0) + n
        for state, n in counts.items():
            family.add_metric([state], n)
        prepared = GaugeMetricFamily("exactly_txn_prepared_transactions",
                                     "Transactions sealed by PrepareTxn waiting for their decision (KIP-939)",
                                     value=sum(c.prepared_count() for c in coordinators))
        oldest = GaugeMetricFamily("exactly_txn_oldest_prepared_transaction_age_seconds",
                                   "How long the oldest prepared transaction has waited for its decision, "
                                   "seconds (0: none); the coordinator never decides one by itself",
                                   value=max((c.oldest_prepared_age_ms() for c in coordinators), default=0) / 1000)
        return [family, prepared, oldest, coordinator_partitions("txn", coordinators)]


STATES = TransactionStateCollector()

COMPLETED = Counter("exactly_txn_completed", "Transactions completed by this coordinator, by outcome "
                    "(commit, abort) and cause (client, timeout, fencing)", ["outcome", "cause"])
# The children by (outcome, cause), declared up front; `completed` reads them here
# instead of through labels() on every transaction.
_COMPLETED_BY = {(_outcome, _cause): COMPLETED.labels(_outcome, _cause)
                 for _outcome in OUTCOMES for _cause in CAUSES if _outcome == "abort" or _cause == "client"}

END_TO_COMPLETE_SECONDS = Histogram("exactly_txn_end_to_complete_seconds",
                                    "From an EndTxn request to the transaction's completion (its Complete "
                                    "record, or its last marker when the next transaction takes over), seconds",
                                    buckets=_LATENCY_BUCKETS)
MARKER_WRITE_SECONDS = Histogram("exactly_txn_marker_write_seconds",
                                 "Writing one transaction's markers to all its partitions, seconds",
                                 buckets=_LATENCY_BUCKETS)
INIT_PRODUCER_ID_THROTTLED = Counter("exactly_txn_init_producer_id_throttled",
                                     "InitProducerId calls refused by the per-principal rate "
                                     "(exactly.producer.ids.rate)")
INIT_PRODUCER_ID_OVER_CAP = Counter("exactly_txn_init_producer_id_over_cap",
                                    "InitProducerId calls refused (POLICY_VIOLATION) because the principal holds "
                                    "exactly.producer.ids.max.per.principal idempotent producer ids or "
                                    "exactly.transactional.ids.max.per.principal transactional ids here")
PID_BLOCKS = Counter("exactly_txn_pid_blocks_allocated", "Producer id blocks reserved in ZooKeeper")
MARKERS_REJECTED = Counter("exactly_txn_markers_rejected", "Transaction markers a partition leader refused for a "
                           "newer producer epoch of the PID, so not written (reason: the error code); "
                           "alert on any", ["reason"])


def completed(committed: bool, cause: str) -> None:
    """Count one completed transaction (cause: client | timeout | fencing)."""
    key = ("commit" if committed else "abort", cause)
    child = _COMPLETED_BY.get(key)
    if child is None:
        child = _COMPLETED_BY[key] = COMPLETED.labels(*key)
    child.inc()
