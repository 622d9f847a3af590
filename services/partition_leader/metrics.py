"""Prometheus series of the partition leader (docs/design.md, "Metrics"), as the Grafana
dashboards in deploy/grafana read them.

Gauges per led partition (labels topic, partition), read from the open partitions at
scrape time on the event loop, so the produce path pays nothing for them:

    exactly_partition_high_watermark          offset
    exactly_partition_last_stable_offset      offset (LSO)
    exactly_partition_lso_lag_offsets         high watermark - LSO, offsets
    exactly_partition_log_end_offset          offset
    exactly_partition_live_producer_ids       PIDs with producer state on the partition
    exactly_partition_ongoing_transactions    transactions without a marker yet
    exactly_partition_oldest_open_transaction_age_seconds
                                              age of the oldest ongoing transaction (0: none)
    exactly_partition_aborted_index_entries   entries of the aborted-transaction indexes

The age of a transaction counts from the timestamp of its first batch (the batch at
the transaction's first offset; the time it was first seen here when that batch is
not readable).

Counters by topic, on the request path: exactly_produce_bytes_total and
exactly_produce_records_total (batches appended), exactly_fetch_bytes_total and
exactly_fetch_records_total (batches returned by Fetch, control batches included).
RPC latency and error codes are recorded for every service by
services/common/metrics.py.
"""
from __future__ import annotations

from typing import Any, Sequence

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

from exactly_wire.clock import wall_clock_ms
from exactly_wire import records
from services.common.metrics import LoopCollector

_LABELS = ["topic", "partition"]



class PartitionCollector(LoopCollector):
    """Reads the partitions of every tracked ReplicaManager at scrape time."""

    def __init__(self, clock_ms=wall_clock_ms, **kwargs) -> None:
        super().__init__(**kwargs)
        self._clock_ms = clock_ms
        # (topic, partition) -> {first offset of an ongoing transaction: its start, ms}
        self._txn_starts: dict[tuple[str, int], dict[int, int]] = {}

    def families(self, managers: Sequence[Any]) -> list[GaugeMetricFamily]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=_LABELS)

        hw = gauge("exactly_partition_high_watermark", "High watermark per partition (offset)")
        lso = gauge("exactly_partition_last_stable_offset", "Last stable offset (LSO) per partition")
        lag = gauge("exactly_partition_lso_lag_offsets", "High watermark minus LSO per partition, in offsets")
        leo = gauge("exactly_partition_log_end_offset", "Log end offset per partition")
        pids = gauge("exactly_partition_live_producer_ids", "Producer ids (PIDs) with state on the partition")
        ongoing = gauge("exactly_partition_ongoing_transactions",
                        "Transactions with data on the partition and no COMMIT/ABORT marker yet")
        oldest = gauge("exactly_partition_oldest_open_transaction_age_seconds",
                       "Age of the oldest open transaction on the partition, in seconds (0: none)")
        aborted = gauge("exactly_partition_aborted_index_entries",
                        "Entries of the partition's aborted-transaction indexes")
        now = self._clock_ms()
        seen: set[tuple[str, int]] = set()
        for manager in managers:
            for p in list(manager.partitions.values()):
                key = (p.topic, p.partition)
                seen.add(key)
                labels = [p.topic, str(p.partition)]
                high, stable = p.high_watermark, p.last_stable_offset
                hw.add_metric(labels, high)
                lso.add_metric(labels, stable)
                lag.add_metric(labels, max(high - stable, 0))
                leo.add_metric(labels, p.log_end_offset)
                pids.add_metric(labels, len(p.producers.producers))
                ongoing.add_metric(labels, len(p.producers.ongoing))
                start = self._oldest_start_ms(key, p, now)
                oldest.add_metric(labels, 0.0 if start is None else max(now - start, 0) / 1000)
                aborted.add_metric(labels, sum(len(seg.aborted) for seg in p.log.segments))
        for key in set(self._txn_starts) - seen:
            del self._txn_starts[key]
        return [hw, lso, lag, leo, pids, ongoing, oldest, aborted]

    def _oldest_start_ms(self, key: tuple[str, int], p, now: int) -> int | None:
        """Start (ms) of the partition's oldest ongoing transaction, None without one.
        Each transaction's start is looked up once and remembered while it is open."""
        ongoing = dict(p.producers.ongoing)  # first offset -> PID, ascending
        known = self._txn_starts.setdefault(key, {})
        for first in [f for f in known if f not in ongoing]:
            del known[first]
        if not ongoing:
            return None
        first, pid = next(iter(ongoing.items()))
        if first not in known:
            known[first] = _first_batch_timestamp(p, pid, first) or now
        return known[first]


def _first_batch_timestamp(p, pid: int, first_offset: int) -> int | None:
    """Max timestamp (ms) of the batch at `first_offset`: from the PID's recent batch
    metadata when it is still there, else from the batch header in the log."""
    entry = p.producers.entry(pid)
    for batch in getattr(entry, "batches", ()):
        if batch.first_offset == first_offset and batch.timestamp >= 0:
            return batch.timestamp
    try:
        for found in p.log.batches(first_offset, first_offset + 1):
            if found.header.base_offset == first_offset and found.header.max_timestamp >= 0:
                return found.header.max_timestamp
            break
    except (OSError, ValueError, IndexError):
        pass
    return None


PARTITIONS = PartitionCollector()

PRODUCE_BYTES = Counter("exactly_produce_bytes", "Bytes of record batches appended by Produce", ["topic"])
PRODUCE_RECORDS = Counter("exactly_produce_records", "Records appended by Produce", ["topic"])
FETCH_BYTES = Counter("exactly_fetch_bytes", "Bytes of record batches returned by Fetch", ["topic"])
FETCH_RECORDS = Counter("exactly_fetch_records", "Records in the batches returned by Fetch", ["topic"])


def count_produced(topic: str, batch: bytes) -> None:
    """Count one appended record batch (raw bytes) of `topic`."""
    PRODUCE_BYTES.labels(topic).inc(len(batch))
    PRODUCE_RECORDS.labels(topic).inc(records.parse_header(batch).record_count)


def count_fetched(topic: str, data: bytes) -> None:
    """Count the whole record batches `data` returned by a Fetch of `topic`."""
    if not data:
        return
    FETCH_BYTES.labels(topic).inc(len(data))
    FETCH_RECORDS.labels(topic).inc(sum(h.record_count for _, h in records.iter_batches(data)))
