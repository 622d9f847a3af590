"""The coordinator's ports over the cluster: the transaction log on the partition
leaders of `TRANSACTION_STATE_TOPIC`, WriteTxnMarkers to partition leaders, and the
topology from the ZooKeeper cache (services.common)."""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, defaultdict
from typing import Awaitable, Callable

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.cluster.state import ClusterState, NodeInfo, partition_for_key
from services.common.protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from services.common.protocol import INTERNAL_APPEND_TIMEOUT_MS, WRITE_TXN_MARKERS_TIMEOUT_MS
from services.common.transport.rpc import ClusterClient
from services.partition_leader.produce import ProduceContext, ProduceEntry, produce_deadline
from services.partition_leader.replica_manager import ReplicaManager

from .ports import TxnLogFetch, TxnMarker


log = logging.getLogger(__name__)

# Markers end each transaction under the next producer epoch (KIP-890 part 2).

# The (PID, partition) positions a marker writer keeps for TxnPartitionsAdded: about a
# hundred bytes each, so some 10 MB at most; the least recently written go first.
MAX_VERIFIABLE_POSITIONS = 100_000


class Linger:
    """Group commit's wait for company. A request to a partition leader (transaction-log
    appends, markers) goes out at once while at most one transaction is completing, so a
    lone producer's commit pays no wait. While several are (`busy()` true: many
    producers committing through this coordinator, both cores busy), the request first
    waits `linger_ms` (exactly.txn.batch.linger.ms), and the transitions and markers of
    the transactions that reach the same step meanwhile travel with it: fewer requests
    per transaction, which is what a saturated leader and coordinator spend their CPU on.
    `busy` is bound once the coordinator exists (`bind`). `sleep`: async (seconds) ->
    None, asyncio.sleep by default (tests pass one they release)."""

    def __init__(self, linger_ms: int = 0, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self.linger_s = linger_ms / 1000
        self._sleep = sleep
        self._busy: Callable[[], bool] = lambda: False

    def bind(self, busy: Callable[[], bool]) -> None:
        self._busy = busy

    async def wait(self) -> None:
        if self.linger_s > 0 and self._busy():
            await self._sleep(self.linger_s)


def merge_per_partition(entries: list[tuple[int, bytes]], max_bytes: int) -> list[tuple[int, bytes, list[int]]]:
    """Group commit's batches of one request, merged per partition: the batches
    queued for one partition become one record batch (`records.merge_batches`: same
    writer producer id and epoch, uncompressed, in arrival order) of at most
    `max_bytes` (bytes of the batches merged; a larger batch goes alone), so that the
    partition leader appends, checks and indexes once per partition instead of once per
    transition. A merged batch is written or refused as a whole, so each of its
    transitions gets the batch's error code. entries: (partition, batch) in arrival
    order. Returns (partition, batch, indexes into `entries` it holds) in the order of
    each one's first batch (so a partition's records keep their order); batches that
    cannot be merged are kept as they are."""
    runs: dict[int, list[list[int]]] = {}
    order: list[tuple[int, int]] = []  # (partition, run number)
    sizes: dict[tuple[int, int], int] = {}
    for i, (partition, batch) in enumerate(entries):
        part_runs = runs.setdefault(partition, [])
        key = (partition, len(part_runs) - 1)
        if part_runs and sizes[key] + len(batch) <= max_bytes:
            part_runs[-1].append(i)
            sizes[key] += len(batch)
        else:
            part_runs.append([i])
            key = (partition, len(part_runs) - 1)
            sizes[key] = len(batch)
            order.append(key)
    out: list[tuple[int, bytes, list[int]]] = []
    for partition, n in order:
        members = runs[partition][n]
        merged = records.merge_batches([entries[i][1] for i in members]) if len(members) > 1 else None
        if merged is not None:
            out.append((partition, merged, members))
        else:
            out.extend((partition, entries[i][1], [i]) for i in members)
    out.sort(key=lambda entry: entry[2][0])  # arrival order of each entry's first batch
    return out


class ClusterTxnLog:
    """`TRANSACTION_STATE_TOPIC` through its partition leaders. Appends use acks=all
    (design doc: "wait for this message to be replicated"). Group commit per
    partition leader: each leader has one append request in flight; the batches of
    every transition that arrives meanwhile, for any partition that leader leads, go
    together in the next request (up to `max_batches_per_request`, appended in arrival
    order, so a partition's records keep their order), and concurrent transactions
    share round trips and replication waits. The batches of one partition in a
    request are merged into one record batch (`merge_per_partition`, at most
    `max_merged_bytes` each). While `busy()` says that several
    transactions are completing at once, a request first waits `linger_ms` for more
    transitions to join it (see `Linger`)."""

    def __init__(self, client: ClusterClient, timeout_ms: int = INTERNAL_APPEND_TIMEOUT_MS,
                 max_batches_per_request: int = 200, linger: "Linger | None" = None,
                 max_merged_bytes: int = 256 * 1024, local: "LocalAppender | None" = None):
        self._client = client
        self._local = local
        self._timeout_ms = timeout_ms
        self._max = max_batches_per_request
        self._max_merged_bytes = max_merged_bytes
        self._linger = linger or Linger()
        self._queues: dict[str, list[tuple[int, bytes, asyncio.Future]]] = defaultdict(list)
        self._nodes: dict[str, NodeInfo] = {}
        self._senders: dict[str, asyncio.Task] = {}

    async def append(self, partition: int, batch: bytes) -> int:
        node = self._client.cluster.leader_of(TRANSACTION_STATE_TOPIC, partition)
        if node is None:  # answered as a Produce would be: LEADER_NOT_AVAILABLE or UNKNOWN_TOPIC_OR_PARTITION
            return (await self._client.produce(TRANSACTION_STATE_TOPIC, partition, batch, acks=-1,
                                               timeout_ms=self._timeout_ms))[0]
        future = asyncio.get_running_loop().create_future()
        self._nodes[node.node_id] = node
        self._queues[node.node_id].append((partition, batch, future))
        sender = self._senders.get(node.node_id)
        if sender is None or sender.done():
            self._senders[node.node_id] = asyncio.get_running_loop().create_task(self._drain(node.node_id))
        return await future

    async def _drain(self, node_id: str) -> None:
        queue = self._queues[node_id]
        local = self._local if self._local is not None and node_id == self._local.node_id else None
        if local is not None:
            await asyncio.sleep(0)
        else:
            await self._linger.wait()
        while queue:
            group, queue[:] = queue[:self._max], queue[self._max:]
            entries = merge_per_partition([(p, b) for p, b, _ in group], self._max_merged_bytes)
            batches = [(p, b) for p, b, _ in entries]
            try:
                if local is not None:
                    codes = await local.append(batches, self._timeout_ms)
                else:
                    codes = await self._client.produce_to(self._nodes[node_id], TRANSACTION_STATE_TOPIC, batches,
                                                          acks=-1, timeout_ms=self._timeout_ms)
            except Exception as exc:  # noqa: BLE001 - every waiting transition learns of it
                for _, _, future in group:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, _, members), code in zip(entries, codes):
                for i in members:
                    if not group[i][2].done():
                        group[i][2].set_result(code)

    async def fetch(self, partition: int, offset: int, max_bytes: int) -> TxnLogFetch:
        resp = await self._client.fetch(TRANSACTION_STATE_TOPIC, partition, offset, max_wait_ms=0,
                                        isolation_level=0, max_bytes=max_bytes)
        if resp.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            code, start = await self._client.list_offset(TRANSACTION_STATE_TOPIC, partition, -2)
            return TxnLogFetch(resp.error_code, log_start_offset=start if code == ErrorCode.NONE else 0)
        return TxnLogFetch(resp.error_code, resp.records, resp.high_watermark, resp.log_start_offset)


class LocalAppender:
    """Appends to the `TRANSACTION_STATE_TOPIC` partitions this process leads
    (metadata.version 3: the coordinator is the first replica of the partitions it owns;
    docs/design/coordinator-local-logs.md), through the partition leader's write path
    in-process: the same gates as a CoordinatorProduce (the writer-epoch fence, the
    leadership lease, acks=all with min.insync.replicas and the purgatory), without the
    crossing. node_id: this process's; manager: its ReplicaHost's ReplicaManager."""

    def __init__(self, node_id: str, manager: ReplicaManager):
        self.node_id = node_id
        self._manager = manager

    async def append(self, batches: list[tuple[int, bytes]], timeout_ms: int) -> list[int]:
        """Append (partition, batch) pairs with acks=all, a partition's in order;
        returns an error code per pair, as `ClusterClient.produce_to` does
        (NOT_LEADER_OR_FOLLOWER for a partition this process does not lead)."""
        deadline = produce_deadline(self._manager.hosted.monotonic_s(), timeout_ms)
        ctx = ProduceContext.coordinator(-1, deadline)
        try:
            results = await self._manager.append_records(
                ctx, [ProduceEntry(TRANSACTION_STATE_TOPIC, p, b) for p, b in batches])
        except Exception:  # noqa: BLE001 - e.g. ZooKeeper gone while reading the claim
            # Some entries may be appended, as when a remote request's answer is lost:
            # an outcome unknown (the partition reloads), never "not appended".
            log.exception("local append to %s failed", TRANSACTION_STATE_TOPIC)
            return [ErrorCode.UNKNOWN_SERVER_ERROR] * len(batches)
        return [r.error for r in results]


class ClusterMarkerWriter:
    """WriteTxnMarkers to the partition leaders (design doc "Transaction Coordinator
    Startup": markers to all the leaders of the transaction's partitions), batched per
    leader across transactions, as Kafka's TransactionMarkerChannelManager: each
    leader has one request in flight at a time, and the markers of every transaction
    that became ready meanwhile go in the next request together (at most
    `max_markers_per_request`). `CONSUMER_OFFSETS_TOPIC` partitions are written like any
    other: to the partition leader of that partition. `linger`: as ClusterTxnLog's."""

    def __init__(self, cluster: ClusterState, client: ClusterClient,
                 timeout_s: float = WRITE_TXN_MARKERS_TIMEOUT_MS / 1000,
                 max_markers_per_request: int = 500, linger: "Linger | None" = None,
                 max_positions: int = MAX_VERIFIABLE_POSITIONS):
        self._cluster = cluster
        self._client = client
        self._timeout_s = timeout_s
        self._max = max_markers_per_request
        self._linger = linger or Linger()
        self._channels: dict[str, _MarkerChannel] = {}
        # (PID, partition) -> (leader epoch, offset): where the partition's leader takes a
        # TxnPartitionsAdded of the PID as verification (its WriteTxnMarkers answer),
        # least recently written first; at most max_positions.
        self.positions: OrderedDict[tuple[int, TopicPartition], tuple[int, int]] = OrderedDict()
        self._max_positions = max_positions

    async def write(self, marker: TxnMarker) -> dict[TopicPartition, int]:
        """Write `marker` to each of its partitions; returns an error code per
        partition (NONE when written and replicated, or the leader's / the transport's
        error, LEADER_NOT_AVAILABLE without a leader)."""
        by_leader, leaderless = self._by_leader(sorted(marker.partitions))
        out: dict[TopicPartition, int] = {tp: ErrorCode.LEADER_NOT_AVAILABLE for tp in leaderless}
        sends = [self._channel(node).submit(marker, tps) for node, tps in by_leader.values()]
        # One leader (the common case): awaited here, without gather's task.
        results = [await sends[0]] if len(sends) == 1 else await asyncio.gather(*sends)
        for part in results:
            out.update(part)
        return out

    def _by_leader(self, partitions) -> tuple[dict[str, tuple[NodeInfo, list[TopicPartition]]],
                                              list[TopicPartition]]:
        """`partitions` grouped by their live leader (node id -> (node, partitions), in
        the order given), and those without one."""
        by_leader: dict[str, tuple[NodeInfo, list[TopicPartition]]] = {}
        leaderless: list[TopicPartition] = []
        for tp in partitions:
            node = self._cluster.leader_of(*tp)
            if node is None:
                leaderless.append(tp)
            else:
                by_leader.setdefault(node.node_id, (node, []))[1].append(tp)
        return by_leader, leaderless

    def partitions_added(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         coordinator_epoch: int, partitions) -> None:
        """MarkerWriter.partitions_added: one TxnPartitionsAdded per leader, for the
        partitions whose leader gave a position for this PID (the others are asked
        about as before)."""
        positions = {tp: self.positions[(producer_id, tp)] for tp in partitions
                     if (producer_id, tp) in self.positions}
        by_leader, _ = self._by_leader(positions)
        for node, tps in by_leader.values():
            topics: dict[str, list[pb.PartitionPosition]] = defaultdict(list)
            for tp in tps:
                epoch, offset = positions[tp]
                topics[tp[0]].append(pb.PartitionPosition(partition=tp[1], leader_epoch=epoch, offset=offset))
            self._client.txn_partitions_added(node, pb.TxnPartitionsAddedRequest(
                transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
                coordinator_epoch=coordinator_epoch,
                topics=[pb.TopicPartitionPositions(topic=t, partitions=ps) for t, ps in topics.items()]))

    def _note_positions(self, producer_id: int, result: pb.WritableTxnMarkerResult) -> None:
        positions = self.positions
        for t in result.verifiable_from:
            for p in t.partitions:
                key = (producer_id, (t.topic, p.partition))
                positions[key] = (p.leader_epoch, p.offset)
                positions.move_to_end(key)
        while len(positions) > self._max_positions:
            positions.popitem(last=False)

    def _channel(self, node: NodeInfo) -> "_MarkerChannel":
        ch = self._channels.get(node.node_id)
        if ch is None or ch.node.address != node.address:
            ch = self._channels[node.node_id] = _MarkerChannel(node, self._client, self._timeout_s, self._max,
                                                               self._linger, self._note_positions)
        return ch


class _MarkerChannel:
    """The markers queued for one partition leader and the one request in flight."""

    def __init__(self, node: NodeInfo, client: ClusterClient, timeout_s: float, max_markers: int,
                 linger: "Linger", on_positions: Callable[[int, pb.WritableTxnMarkerResult], None]):
        self.node = node
        self._client = client
        self._timeout_s = timeout_s
        self._max = max_markers
        self._linger = linger
        self._on_positions = on_positions
        self._queue: list[tuple[TxnMarker, list[TopicPartition], asyncio.Future]] = []
        self._sender: asyncio.Task | None = None

    async def submit(self, marker: TxnMarker, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((marker, tps, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        await self._linger.wait()
        while self._queue:
            batch, self._queue = self._queue[:self._max], self._queue[self._max:]
            try:
                results = await self._send(batch)
            except Exception as exc:  # noqa: BLE001 - every waiting transaction learns of it
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, _, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)

    async def _send(self, batch) -> list[dict[TopicPartition, int]]:
        request = pb.WriteTxnMarkersRequest()
        for marker, tps, _ in batch:
            by_topic: dict[str, list[int]] = defaultdict(list)
            for topic, partition in tps:
                by_topic[topic].append(partition)
            request.markers.add(
                producer_id=marker.producer_id, producer_epoch=marker.producer_epoch, committed=marker.committed,
                coordinator_epoch=marker.coordinator_epoch, transaction_version=marker.transaction_version,
                topics=[pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()])
        resp = await self._client.write_txn_markers(self.node, request, timeout_s=self._timeout_s)
        if not isinstance(resp, pb.WriteTxnMarkersResponse):
            return [{tp: int(resp) for tp in tps} for _, tps, _ in batch]  # transport failure
        out = []
        for i, (_, tps, _) in enumerate(batch):  # the answer keeps the request's order
            m = resp.markers[i] if i < len(resp.markers) else None
            if m is not None and m.verifiable_from:
                self._on_positions(batch[i][0].producer_id, m)
            codes = {(t.topic, p.partition): p.error_code for t in m.topics for p in t.partitions} if m else {}
            out.append({tp: codes.get(tp, ErrorCode.UNKNOWN_SERVER_ERROR) for tp in tps})
        return out


class ClusterTopology:
    """Partition lookups from the ZooKeeper cache: crc32(key) % partition count."""

    def __init__(self, cluster: ClusterState):
        self._cluster = cluster

    def _partition(self, topic: str, key: str) -> int:
        info = self._cluster.topic(topic)
        if info is None or not info.partitions:
            return -1
        return partition_for_key(key, len(info.partitions))

    def txn_partition_for(self, transactional_id: str) -> int:
        return self._partition(TRANSACTION_STATE_TOPIC, transactional_id)

    def offsets_partition_for(self, group_id: str) -> int:
        return self._partition(CONSUMER_OFFSETS_TOPIC, group_id)

    def partition_exists(self, topic: str, partition: int) -> bool:
        info = self._cluster.topic(topic)
        return info is not None and partition in info.partitions

    def txn_partition_count(self) -> int:
        info = self._cluster.topic(TRANSACTION_STATE_TOPIC)
        return len(info.partitions) if info is not None else 0

    def metadata_version(self) -> int:
        return self._cluster.metadata_version
