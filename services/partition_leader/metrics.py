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
    exactly_partition_replicas                assigned replicas (replication factor)
    exactly_partition_in_sync_replicas        ISR size as the leader applies it
    exactly_partition_under_replicated        1 when the ISR is smaller than the replicas
    exactly_partition_at_min_isr              1 when the ISR size equals min.insync.replicas
                                              (Kafka's AtMinIsr: one more loss blocks acks=all)
    exactly_partition_under_min_isr           1 when the ISR is below min.insync.replicas
                                              (acks=all produces and markers fail)

exactly_log_dir_offline: 1 when this process's log directory is offline after an I/O
error (KIP-112, docs/design.md "Disk faults"), 0 otherwise; alert ExactlyLogDirOffline.

exactly_purgatory_size: requests parked in the purgatory (delayed Fetch and Produce
waiting for data, the high watermark or their deadline; Kafka's PurgatorySize).

exactly_fetch_wakeups_total{fetcher_type, outcome}: parked Fetches leaving the
purgatory, by fetcher_type (consumer, follower; Kafka's DelayedFetchMetrics label)
and outcome: completed (woken by a position passing its offset, or by an ISR or
leadership change, and answered), parked_again (woken, read again, still short of
min_bytes: a wasted re-read), expired (answered at max_wait_ms; Kafka's
ExpiresPerSec). Parked fetches wake by partition and offset (purgatory.py), so
parked_again stays small next to completed.

Gauges per hosted replica, leader or follower (labels topic, partition; the
`instance` label tells the process), so that disk use shows on every replica:

    exactly_partition_log_start_offset        first offset kept (retention, DeleteRecords)
    exactly_partition_log_size_bytes          bytes of the replica's log segments

Cluster gauges, exported by the active controller only (0 or absent elsewhere, so
`sum` over a release counts each once), from its ZooKeeper view at scrape time
(`ClusterCollector`):

    exactly_controller_active                 1 on the active controller, 0 elsewhere
    exactly_cluster_offline_partitions{topic} partitions without a live leader (no live
                                              ISR member; no unclean election)
    exactly_cluster_live_nodes{role}          registered service processes by role
    exactly_coordinator_unavailable_partitions{kind}
                                              partitions of `TRANSACTION_STATE_TOPIC` (kind
                                              txn) / `CONSUMER_OFFSETS_TOPIC` (group) without a
                                              live owner of the right role

The age of a transaction counts from the timestamp of its first batch (the batch at
the transaction's first offset; the time it was first seen here when that batch is
not readable).

Counters by topic, on the request path: exactly_produce_bytes_total and
exactly_produce_records_total (batches appended), exactly_fetch_bytes_total and
exactly_fetch_records_total (batches returned by Fetch, control batches included).

User topic names are labels only with `metrics.topic.labels=true`; otherwise the
series of all user topics are one, topic="(hidden)" without a partition, summed
(max for the lag and the transaction age): services/common/metrics.py, "Topic
labels".
RPC latency and error codes are recorded for every service by
services/common/metrics.py.
"""
from __future__ import annotations

import json
import logging
import weakref
from typing import Any, Iterable, Sequence

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from exactly_wire.clock import wall_clock_ms
from exactly_wire import records
from services.common.cluster.state import COORDINATORS, PARTITION_LEADER, ROLE_FOR_KIND, TopicInfo
from services.common.metrics import LoopCollector, TopicRows, topic_label
from services.common.protocol import CONSUMER_OFFSETS_TOPIC, INTERNAL_TOPIC_FOR_KIND, TRANSACTION_STATE_TOPIC

from .replica_manager import COMPLETED, CONSUMER, EXPIRED, FOLLOWER, PARKED_AGAIN

log = logging.getLogger(__name__)

_LABELS = ["topic", "partition"]



class PartitionCollector(LoopCollector):
    """Reads the partitions of every tracked ReplicaManager at scrape time."""

    def __init__(self, clock_ms=wall_clock_ms, **kwargs) -> None:
        super().__init__(**kwargs)
        self._clock_ms = clock_ms
        # (topic, partition) -> {first offset of an ongoing transaction: its start, ms}
        self._txn_starts: dict[tuple[str, int], dict[int, int]] = {}

    def families(self, managers: Sequence[Any]) -> list[GaugeMetricFamily]:
        def gauge(name: str, doc: str, merge=None) -> TopicRows:
            family = GaugeMetricFamily(name, doc, labels=_LABELS)
            return TopicRows(family) if merge is None else TopicRows(family, merge)

        hw = gauge("exactly_partition_high_watermark", "High watermark per partition (offset)")
        lso = gauge("exactly_partition_last_stable_offset", "Last stable offset (LSO) per partition")
        lag = gauge("exactly_partition_lso_lag_offsets", "High watermark minus LSO per partition, in offsets", max)
        leo = gauge("exactly_partition_log_end_offset", "Log end offset per partition")
        pids = gauge("exactly_partition_live_producer_ids", "Producer ids (PIDs) with state on the partition")
        ongoing = gauge("exactly_partition_ongoing_transactions",
                        "Transactions with data on the partition and no COMMIT/ABORT marker yet")
        oldest = gauge("exactly_partition_oldest_open_transaction_age_seconds",
                       "Age of the oldest open transaction on the partition, in seconds (0: none)", max)
        aborted = gauge("exactly_partition_aborted_index_entries",
                        "Entries of the partition's aborted-transaction indexes")
        replicas = gauge("exactly_partition_replicas", "Assigned replicas of the partition (replication factor)")
        isr = gauge("exactly_partition_in_sync_replicas", "In-sync replicas (ISR size) of the partition")
        under = gauge("exactly_partition_under_replicated", "1 when the ISR is smaller than the assigned replicas")
        at_min = gauge("exactly_partition_at_min_isr", "1 when the ISR size equals min.insync.replicas")
        under_min = gauge("exactly_partition_under_min_isr", "1 when the ISR is smaller than min.insync.replicas")
        log_start = gauge("exactly_partition_log_start_offset", "Log start offset of the replica")
        size = gauge("exactly_partition_log_size_bytes", "Bytes of the replica's log segments")
        parked = GaugeMetricFamily("exactly_purgatory_size", "Requests parked in the purgatory (delayed "
                                   "Fetch and Produce, as Kafka's PurgatorySize)")
        parked.add_metric([], sum(len(m.hosted.purgatory) for m in managers))
        wakeups = CounterMetricFamily("exactly_fetch_wakeups", "Parked Fetches leaving the purgatory, by "
                                      "fetcher type (consumer, follower) and outcome (completed, parked_again: "
                                      "woken but still short of min_bytes, expired)",
                                      labels=["fetcher_type", "outcome"])
        for key in ((f, o) for f in (CONSUMER, FOLLOWER) for o in (COMPLETED, PARKED_AGAIN, EXPIRED)):
            wakeups.add_metric(list(key), sum(getattr(m, "fetch_wakeups", {}).get(key, 0) for m in managers))
        offline_dir = GaugeMetricFamily("exactly_log_dir_offline", "1 when this process's log directory is "
                                        "offline after an I/O error (KIP-112), else 0")
        offline_dir.add_metric([], sum(int(m.hosted.log_dir_offline) for m in managers))
        now = self._clock_ms()
        seen: set[tuple[str, int]] = set()
        for manager in managers:
            for p in list(manager.hosted.partitions.values()):
                key = (p.topic, p.partition)
                seen.add(key)
                row = ((), p.topic, p.partition)
                high, stable = p.high_watermark, p.last_stable_offset
                hw.add(*row, high)
                lso.add(*row, stable)
                lag.add(*row, max(high - stable, 0))
                leo.add(*row, p.log_end_offset)
                pids.add(*row, len(p.producers.producers))
                ongoing.add(*row, len(p.producers.ongoing))
                start = self._oldest_start_ms(key, p, now)
                oldest.add(*row, 0.0 if start is None else max(now - start, 0) / 1000)
                aborted.add(*row, sum(len(seg.aborted) for seg in p.log.segments))
                n_isr, n_replicas, min_isr = len(p.isr), len(p.replicas), p.min_insync_replicas
                replicas.add(*row, n_replicas)
                isr.add(*row, n_isr)
                under.add(*row, int(n_isr < n_replicas))
                at_min.add(*row, int(n_isr == min_isr))
                under_min.add(*row, int(n_isr < min_isr))
            for p in manager.hosted:  # every hosted replica, followers included
                row = ((), p.topic, p.partition)
                log_start.add(*row, p.log_start_offset)
                size.add(*row, sum(seg.size for seg in list(p.log.segments)))
        for key in set(self._txn_starts) - seen:
            del self._txn_starts[key]
        return [parked, wakeups, offline_dir] + [g.done() for g in (hw, lso, lag, leo, pids, ongoing, oldest, aborted, replicas, isr, under, at_min,
                                   under_min, log_start, size)]

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


def offline_partitions(topics: Iterable[TopicInfo], live: Iterable[str]) -> dict[str, int]:
    """{topic: partitions with no live leader}: the state names no leader (the
    controller found no live ISR member) or a leader that is not among `live`, the
    registered processes (its session just ended; a transaction coordinator leads the
    transaction-log partitions it owns from metadata.version 3). A partition
    without a state yet counts as online (its topic is being created). Every topic is
    a key (0 when all online)."""
    live = set(live)
    out: dict[str, int] = {}
    for t in topics:
        out[t.name] = sum(1 for p in t.partitions
                          if p in t.states and (t.states[p].leader is None or t.states[p].leader not in live))
    return out


class ClusterCollector:
    """Cluster-wide gauges (module docstring), read at scrape time on the scraping
    thread from the tracked service's ClusterState (a lock-protected cache kept by
    ZooKeeper watches) and, for coordinator owners, from ZooKeeper (asynchronous gets,
    `timeout_s` at most). Only the active controller reports counts, so one process
    per release does."""

    timeout_s = 3.0

    def __init__(self, registry=REGISTRY) -> None:
        self._service: weakref.ref | None = None
        if registry is not None:
            registry.register(self)

    def track(self, service: Any) -> None:
        """Report for `service` (anything with `.cluster`, a ClusterState, and
        `.controller` with `is_controller`)."""
        self._service = weakref.ref(service)

    def describe(self):
        return []

    @staticmethod
    def families() -> list[GaugeMetricFamily]:
        """The four families, empty: controller active, offline partitions, live nodes,
        unavailable coordinator partitions."""
        active = GaugeMetricFamily("exactly_controller_active", "1 on the active controller, 0 elsewhere")
        offline = GaugeMetricFamily("exactly_cluster_offline_partitions",
                                    "Partitions without a live leader (active controller only)", labels=["topic"])
        nodes = GaugeMetricFamily("exactly_cluster_live_nodes",
                                  "Registered service processes by role (active controller only)", labels=["role"])
        unavailable = GaugeMetricFamily("exactly_coordinator_unavailable_partitions",
                                        f"Coordinator partitions (kind txn: {TRANSACTION_STATE_TOPIC}, group: "
                                        f"{CONSUMER_OFFSETS_TOPIC}) without a live owner (active controller only)",
                                        labels=["kind"])
        return [active, offline, nodes, unavailable]

    def collect(self):
        service = self._service() if self._service is not None else None
        active, offline, nodes, unavailable = self.families()
        if service is None:
            return [active]
        is_controller = bool(service.controller.is_controller)
        active.add_metric([], int(is_controller))
        if not is_controller:
            return [active]
        try:
            cluster = service.cluster
            live = cluster.nodes()
            topics = cluster.topics()
            by_role: dict[str, int] = {role: 0 for role in (PARTITION_LEADER, *ROLE_FOR_KIND.values())}
            for node in live.values():
                by_role[node.role] = by_role.get(node.role, 0) + 1
            for role, n in sorted(by_role.items()):
                nodes.add_metric([role], n)
            offline_rows = TopicRows(offline)
            for topic, n in sorted(offline_partitions(topics.values(), live).items()):
                offline_rows.add((), topic, None, n)
            offline_rows.done()
            for kind, n in sorted(self._unavailable_coordinators(cluster, topics, live).items()):
                unavailable.add_metric([kind], n)
        except Exception:  # noqa: BLE001 - a ZooKeeper hiccup must not fail the whole scrape
            log.warning("cluster metrics: scrape failed", exc_info=True)
            return [active]
        return [active, offline, nodes, unavailable]

    def _unavailable_coordinators(self, cluster, topics: dict, live: dict) -> dict[str, int]:
        out = {}
        for kind, topic_name in INTERNAL_TOPIC_FOR_KIND.items():
            topic = topics.get(topic_name)
            if topic is None:  # created on first use: nothing to coordinate yet
                out[kind] = 0
                continue
            gets = [cluster.zk.get_async(f"{COORDINATORS}/{kind}/{p}") for p in sorted(topic.partitions)]
            missing = 0
            for res in gets:
                try:
                    data, _ = res.get(timeout=self.timeout_s)
                    owner = json.loads(data).get("owner")
                except Exception:  # noqa: BLE001 - NoNodeError (never claimed) or unreadable: no owner
                    owner = None
                node = live.get(owner) if owner else None
                if node is None or node.role != ROLE_FOR_KIND[kind]:
                    missing += 1
            out[kind] = missing
        return out


CLUSTER = ClusterCollector()

PRODUCE_BYTES = Counter("exactly_produce_bytes", "Bytes of record batches appended by Produce", ["topic"])
PRODUCE_RECORDS = Counter("exactly_produce_records", "Records appended by Produce", ["topic"])
FETCH_BYTES = Counter("exactly_fetch_bytes", "Bytes of record batches returned by Fetch", ["topic"])
FETCH_RECORDS = Counter("exactly_fetch_records", "Records in the batches returned by Fetch", ["topic"])
TXN_VERIFICATIONS = Counter(
    "exactly_txn_verifications", "KIP-890 verifications of a transaction version 1 producer's first batch on a "
    "partition, by how: asked (a call to its transaction coordinator) or noted (the coordinator's "
    "TxnPartitionsAdded, no call)", ["how"])
_VERIFIED = {how: TXN_VERIFICATIONS.labels(how) for how in ("asked", "noted")}


# (bytes, records) children of PRODUCE_* by topic label: as many as the families hold
# anyway, read here instead of through labels() on every batch.
_PRODUCED: dict[str, tuple] = {}


def count_produced(topic: str, batch: bytes) -> None:
    """Count one appended record batch (raw bytes) of `topic`."""
    label = topic_label(topic)
    children = _PRODUCED.get(label)
    if children is None:
        children = _PRODUCED[label] = (PRODUCE_BYTES.labels(label), PRODUCE_RECORDS.labels(label))
    children[0].inc(len(batch))
    children[1].inc(records.parse_header(batch).record_count)


def count_verification(how: str) -> None:
    """Count one verification of a producer's first batch on a partition: "asked" or "noted"."""
    _VERIFIED[how].inc()


def count_fetched(topic: str, data: bytes) -> None:
    """Count the whole record batches `data` returned by a Fetch of `topic`."""
    if not data:
        return
    label = topic_label(topic)
    FETCH_BYTES.labels(label).inc(len(data))
    FETCH_RECORDS.labels(label).inc(sum(h.record_count for _, h in records.iter_batches(data)))
