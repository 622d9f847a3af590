"""The coordinator's ports over the cluster: the transaction log on the partition
leaders of `__transaction_state`, WriteTxnMarkers to partition leaders, and the
topology from the ZooKeeper cache (services.common)."""
from __future__ import annotations

import asyncio
from collections import defaultdict

from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.cluster import (CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, ClusterState, NodeInfo,
                                     partition_for_key)
from services.common.rpc import ClusterClient

from .coordinator import TxnLogFetch, TxnMarker


# Markers end each transaction under the next producer epoch (KIP-890 part 2).


class ClusterTxnLog:
    """`__transaction_state` through its partition leaders. Appends use acks=all
    (design doc: "wait for this message to be replicated")."""

    def __init__(self, client: ClusterClient, timeout_ms: int = 30_000):
        self._client = client
        self._timeout_ms = timeout_ms

    async def append(self, partition: int, batch: bytes) -> int:
        code, _ = await self._client.produce(TRANSACTION_STATE_TOPIC, partition, batch, acks=-1,
                                             timeout_ms=self._timeout_ms)
        return code

    async def fetch(self, partition: int, offset: int, max_bytes: int) -> TxnLogFetch:
        resp = await self._client.fetch(TRANSACTION_STATE_TOPIC, partition, offset, max_wait_ms=0,
                                        isolation_level=0, max_bytes=max_bytes)
        if resp.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            code, start = await self._client.list_offset(TRANSACTION_STATE_TOPIC, partition, -2)
            return TxnLogFetch(resp.error_code, log_start_offset=start if code == ErrorCode.NONE else 0)
        return TxnLogFetch(resp.error_code, resp.records, resp.high_watermark, resp.log_start_offset)


class ClusterMarkerWriter:
    """WriteTxnMarkers, one request per partition leader, sent concurrently (design
    doc "Transaction Coordinator Startup": markers to all the leaders of the
    transaction's partitions). `__consumer_offsets` partitions are written like any
    other: to the partition leader of that partition."""

    def __init__(self, cluster: ClusterState, client: ClusterClient, timeout_s: float = 30.0):
        self._cluster = cluster
        self._client = client
        self._timeout_s = timeout_s

    async def write(self, marker: TxnMarker) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        by_leader: dict[str, tuple[NodeInfo, list[TopicPartition]]] = {}
        for tp in sorted(marker.partitions):
            node = self._cluster.leader_of(*tp)
            if node is None:
                out[tp] = ErrorCode.LEADER_NOT_AVAILABLE
            else:
                by_leader.setdefault(node.node_id, (node, []))[1].append(tp)
        results = await asyncio.gather(*(self._send(node, marker, tps) for node, tps in by_leader.values()))
        for part in results:
            out.update(part)
        return out

    async def _send(self, node: NodeInfo, marker: TxnMarker, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        by_topic: dict[str, list[int]] = defaultdict(list)
        for topic, partition in tps:
            by_topic[topic].append(partition)
        request = pb.WriteTxnMarkersRequest(markers=[pb.WritableTxnMarker(
            producer_id=marker.producer_id, producer_epoch=marker.producer_epoch, committed=marker.committed,
            coordinator_epoch=marker.coordinator_epoch, transaction_version=marker.transaction_version,
            topics=[pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()])])
        resp = await self._client.write_txn_markers(node, request, timeout_s=self._timeout_s)
        if not isinstance(resp, pb.WriteTxnMarkersResponse):
            return {tp: int(resp) for tp in tps}  # transport failure
        out = {}
        for m in resp.markers:
            for t in m.topics:
                for p in t.partitions:
                    out[(t.topic, p.partition)] = p.error_code
        return out


class ClusterTopology:
    """Partition lookups from the ZooKeeper cache: crc32(key) % partition count."""

    def __init__(self, cluster: ClusterState):
        self._cluster = cluster

    def _partition(self, topic: str, key: str) -> int:
        info = self._cluster.topics().get(topic)
        if info is None or not info.partitions:
            return -1
        return partition_for_key(key, len(info.partitions))

    def txn_partition_for(self, transactional_id: str) -> int:
        return self._partition(TRANSACTION_STATE_TOPIC, transactional_id)

    def offsets_partition_for(self, group_id: str) -> int:
        return self._partition(CONSUMER_OFFSETS_TOPIC, group_id)

    def partition_exists(self, topic: str, partition: int) -> bool:
        info = self._cluster.topics().get(topic)
        return info is not None and partition in info.partitions
