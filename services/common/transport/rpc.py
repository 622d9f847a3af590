"""Async gRPC client used inside the cluster: coordinators reach partition leaders
(Produce/Fetch/ListOffsets on internal topics, WriteTxnMarkers) through it, every call
on the tunnel to the leader (services.common.transport.tunnel).

Transport failures (grpc.aio.AioRpcError) become error codes here, at one seam, so
callers handle only ErrorCode values (docs/design.md, "Code conventions").
"""
from __future__ import annotations

import logging
import time

import grpc

from exactly_wire import keepalive
from exactly_wire.error_codes import ErrorCode
from exactly_wire.security import TransportSecurity, client_ssl_context, secure_aio_channel
from exactly_wire.v1 import exactly_pb2 as pb

from ..cluster.state import ClusterState, NodeInfo
from ..protocol import INTERNAL_APPEND_TIMEOUT_MS, WRITE_TXN_MARKERS_TIMEOUT_MS
from .link import LinkStream
from .tunnel import TunnelChannel, method_path

log = logging.getLogger(__name__)

_TRANSPORT_CODES = {
    grpc.StatusCode.UNAVAILABLE: ErrorCode.NETWORK_EXCEPTION,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCode.REQUEST_TIMED_OUT,
    grpc.StatusCode.CANCELLED: ErrorCode.NETWORK_EXCEPTION,
    # The peer runs a version without the method (a direct call, or a tunneled one:
    # services.common.transport.tunnel): not supported there, never retried as a network
    # error (docs/operating/upgrades.md, "Mixed versions").
    grpc.StatusCode.UNIMPLEMENTED: ErrorCode.UNSUPPORTED_VERSION,
}

_COORDINATOR_PRODUCE = method_path("PartitionLeader", "CoordinatorProduce")
_WRITE_TXN_MARKERS = method_path("PartitionLeader", "WriteTxnMarkers")
_TXN_PARTITIONS_ADDED = method_path("PartitionLeader", "TxnPartitionsAdded")
_FETCH = method_path("PartitionLeader", "Fetch")
_LIST_OFFSETS = method_path("PartitionLeader", "ListOffsets")

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    *keepalive.channel_options(),
]


def channel_options(keepalive_time_ms: int = keepalive.KEEPALIVE_TIME_MS) -> list[tuple[str, int]]:
    """CHANNEL_OPTIONS with the keepalive of exactly.keepalive.time.ms (ms)."""
    return list({**dict(CHANNEL_OPTIONS), **dict(keepalive.channel_options(keepalive_time_ms))}.items())


def transport_error_code(exc: grpc.RpcError) -> ErrorCode:
    """The error code standing for a failed call: NETWORK_EXCEPTION or
    REQUEST_TIMED_OUT (retriable), or UNSUPPORTED_VERSION (not retriable) when the peer
    does not implement the method, which is logged with the peer's answer."""
    code = exc.code() if hasattr(exc, "code") else None
    out = _TRANSPORT_CODES.get(code, ErrorCode.NETWORK_EXCEPTION)
    if out == ErrorCode.UNSUPPORTED_VERSION:
        details = str(exc.details() if hasattr(exc, "details") else "")
        now = time.monotonic()
        if now - _unsupported_logged.get(details, -_UNSUPPORTED_LOG_INTERVAL_S) >= _UNSUPPORTED_LOG_INTERVAL_S:
            if len(_unsupported_logged) > 1000:
                _unsupported_logged.clear()
            _unsupported_logged[details] = now
            log.warning("a peer runs a version without this call (UNIMPLEMENTED: %s); not supported there",
                        details)
    return out


_UNSUPPORTED_LOG_INTERVAL_S = 60.0  # one warning per peer answer and minute
_unsupported_logged: dict[str, float] = {}


class ClusterClient:
    """Channels to other services (one per address), found through ClusterState.
    links: whether tunnels go on the peers' links (services.common.transport.link) where
    they offer one."""

    def __init__(self, cluster: ClusterState, security: TransportSecurity | None = None,
                 keepalive_time_ms: int = keepalive.KEEPALIVE_TIME_MS, links: bool = True):
        self.cluster = cluster
        self.security = security or TransportSecurity()
        self._options = channel_options(keepalive_time_ms)
        self._keepalive_s = keepalive_time_ms / 1000
        self._links = links
        self._link_ssl = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._tunnels: dict[str, TunnelChannel] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = secure_aio_channel(address, self.security, self._options)
            self._channels[address] = ch
        return ch

    def tunnel(self, address: str) -> TunnelChannel:
        """Tunneled unary calls to `address` (services.common.transport.tunnel): the cheaper
        path for the calls of the transaction path."""
        t = self._tunnels.get(address)
        if t is None:
            link = (lambda stub: LinkStream(stub, address, self.security, self._link_ssl_context,
                                            keepalive_s=self._keepalive_s)) if self._links else None
            t = self._tunnels[address] = TunnelChannel(self.channel(address), link=link)
        return t

    def _link_ssl_context(self):
        """The links' TLS context, made once (exactly_wire.security.client_ssl_context)."""
        if self._link_ssl is None:
            self._link_ssl = client_ssl_context(self.security)
        return self._link_ssl

    def leader_tunnel(self, topic: str, partition: int) -> TunnelChannel | None:
        """The tunnel to the leader of `topic`-`partition` (None: no leader known)."""
        node = self.cluster.leader_of(topic, partition)
        return self.tunnel(node.address) if node else None

    def _no_leader(self, topic: str) -> ErrorCode:
        return (ErrorCode.LEADER_NOT_AVAILABLE if topic in self.cluster.topics()
                else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)

    async def produce(self, topic: str, partition: int, batch: bytes, acks: int = -1,
                      timeout_ms: int = INTERNAL_APPEND_TIMEOUT_MS, transactional_id: str = "",
                      consumer_group_id: str = "", verified_from: int | None = None) -> tuple[int, int]:
        """Append one record batch to a coordinator's internal topic (the leader's
        CoordinatorProduce; clients' Produce cannot write internal topics). A
        transactional batch (a transactional offset commit) names its producer's
        `transactional_id` (and the `consumer_group_id` of a group-aware producer),
        with which the leader verifies the transaction — unless `verified_from` says
        the caller verified it when it had applied the partition up to that offset
        (ProduceRequest.transaction_verified_from). Returns (error code, base offset
        or -1)."""
        tunnel = self.leader_tunnel(topic, partition)
        if tunnel is None:
            return self._no_leader(topic), -1
        req = pb.ProduceRequest(acks=acks, timeout_ms=timeout_ms, transactional_id=transactional_id,
                                consumer_group_id=consumer_group_id, topics=[pb.TopicProduceData(
                                    name=topic, partitions=[pb.PartitionProduceData(partition=partition,
                                                                                    records=batch)])])
        if verified_from is not None:
            req.transaction_verified_from = verified_from
        try:
            resp = await tunnel.call(_COORDINATOR_PRODUCE, req, pb.ProduceResponse, timeout_ms / 1000 + 5)
        except grpc.RpcError as exc:
            return transport_error_code(exc), -1
        part = resp.topics[0].partitions[0]
        return part.error_code, part.base_offset

    async def produce_to(self, node: NodeInfo, topic: str, entries: list[tuple[int, bytes]], acks: int = -1,
                         timeout_ms: int = INTERNAL_APPEND_TIMEOUT_MS) -> list[int]:
        """Append a coordinator's record batches, (partition, batch) pairs, to
        partitions `node` leads, in one CoordinatorProduce (one entry per batch; a
        partition's entries are appended in order): a group commit across partitions.
        Returns an error code per entry (NOT_LEADER_OR_FOLLOWER for a partition the
        node no longer leads)."""
        req = pb.ProduceRequest(acks=acks, timeout_ms=timeout_ms, topics=[pb.TopicProduceData(
            name=topic, partitions=[pb.PartitionProduceData(partition=p, records=b) for p, b in entries])])
        try:
            resp = await self.tunnel(node.address).call(_COORDINATOR_PRODUCE, req, pb.ProduceResponse,
                                                        timeout_ms / 1000 + 5)
        except grpc.RpcError as exc:
            return [transport_error_code(exc)] * len(entries)
        parts = resp.topics[0].partitions if resp.topics else []
        return [parts[i].error_code if i < len(parts) else ErrorCode.UNKNOWN_SERVER_ERROR
                for i in range(len(entries))]

    async def fetch(self, topic: str, partition: int, offset: int, max_wait_ms: int = 0,
                    isolation_level: int = 0, max_bytes: int = 1 << 20) -> pb.FetchPartitionResponse:
        """Fetch whole batches from `offset` (bytes up to max_bytes). Errors, including
        transport failures, come back in the response's error_code."""
        tunnel = self.leader_tunnel(topic, partition)
        if tunnel is None:
            return pb.FetchPartitionResponse(partition=partition, error_code=self._no_leader(topic))
        req = pb.FetchRequest(max_wait_ms=max_wait_ms, max_bytes=max_bytes, isolation_level=isolation_level,
                              topics=[pb.FetchTopic(topic=topic, partitions=[pb.FetchPartition(
                                  partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes,
                                  current_leader_epoch=-1)])])
        try:
            resp = await tunnel.call(_FETCH, req, pb.FetchResponse, max_wait_ms / 1000 + 30)
        except grpc.RpcError as exc:
            return pb.FetchPartitionResponse(partition=partition, error_code=transport_error_code(exc))
        if resp.error_code:
            return pb.FetchPartitionResponse(partition=partition, error_code=resp.error_code)
        return resp.responses[0].partitions[0]

    async def list_offset(self, topic: str, partition: int, timestamp: int = -1,
                          isolation_level: int = 0) -> tuple[int, int]:
        """(error code, offset) for timestamp -2 earliest, -1 latest, -3 LSO."""
        tunnel = self.leader_tunnel(topic, partition)
        if tunnel is None:
            return self._no_leader(topic), -1
        req = pb.ListOffsetsRequest(isolation_level=isolation_level, topics=[pb.ListOffsetsTopic(
            name=topic, partitions=[pb.ListOffsetsPartition(partition=partition, timestamp=timestamp)])])
        try:
            resp = await tunnel.call(_LIST_OFFSETS, req, pb.ListOffsetsResponse, 30)
        except grpc.RpcError as exc:
            return transport_error_code(exc), -1
        part = resp.topics[0].partitions[0]
        return part.error_code, part.offset

    async def write_txn_markers(self, node: NodeInfo, request: pb.WriteTxnMarkersRequest,
                                timeout_s: float = WRITE_TXN_MARKERS_TIMEOUT_MS / 1000
                                ) -> pb.WriteTxnMarkersResponse | ErrorCode:
        """Send markers to one partition leader. Returns the response, or the ErrorCode
        of a transport failure."""
        try:
            return await self.tunnel(node.address).call(_WRITE_TXN_MARKERS, request, pb.WriteTxnMarkersResponse,
                                                        timeout_s)
        except grpc.RpcError as exc:
            return transport_error_code(exc)

    def txn_partitions_added(self, node: NodeInfo, request: pb.TxnPartitionsAddedRequest) -> None:
        """Tell one partition leader, one way (TunnelChannel.notify), that partitions it
        leads are in a producer's ongoing transaction."""
        self.tunnel(node.address).notify(_TXN_PARTITIONS_ADDED, request)

    async def close(self) -> None:
        for t in self._tunnels.values():
            await t.close()
        self._tunnels.clear()
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
