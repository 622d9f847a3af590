"""Transaction verification (Kafka's KIP-890 part 1), shared by the partition leader
and the group coordinator.

A transactional write that would start a producer's transaction on a partition (the
first transactional batch of a PID there, or one with another epoch than its ongoing
transaction) or a TxnOffsetCommit is accepted only after the transaction coordinator
of the transactional.id confirms that the partition is in the producer's ongoing
transaction with this PID and epoch (AddPartitionsToTxn with `verify_only`). So a
batch no coordinator knows about — a rogue producer's, or a retry delayed past the
end of its transaction — can never open a transaction that pins the last stable
offset or that a later marker would commit.

`TxnVerifier.verify` finds the coordinator as FindCoordinator does (the live owner of
partition crc32(transactional.id) % n of `__transaction_state`), asks it, and retries
while the coordinator is moving or loading (tenacity, exponential backoff with
jitter) until the request's deadline. Outcomes, as the writer should answer them:
NONE; INVALID_TXN_STATE (not in an ongoing transaction of the coordinator, or no
such transactional.id / PID); INVALID_PRODUCER_EPOCH (the coordinator holds another
epoch: a fenced or forged producer); NOT_ENOUGH_REPLICAS (no coordinator answered in
time: retriable, nothing was written, as Kafka answers it to old clients).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Protocol

import grpc
from tenacity import AsyncRetrying, retry_if_result, stop_after_delay, wait_exponential_jitter

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

from .cluster import ClusterState
from .rpc import ClusterClient, transport_error_code

log = logging.getLogger(__name__)

# Answers after which asking again may succeed: the coordinator moves, loads, or is
# completing the previous transaction of the id.
RETRY_CODES = frozenset({
    ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT,
})
FENCED_CODES = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH})


def writer_error(code: int) -> ErrorCode:
    """The error a writer answers for the final verification outcome `code`."""
    if code == ErrorCode.NONE:
        return ErrorCode.NONE
    if code in FENCED_CODES:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    if code in RETRY_CODES:
        return ErrorCode.NOT_ENOUGH_REPLICAS
    return ErrorCode.INVALID_TXN_STATE


class Verifier(Protocol):
    """The port writers use (TxnVerifier, or a fake in unit tests): the writer's
    answer for a verification, as an ErrorCode; deadline in monotonic seconds."""

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int,
               deadline: float, group_id: str = "") -> Awaitable[ErrorCode]: ...


class TxnVerifier:
    """Asks transaction coordinators whether a partition is in a producer's ongoing
    transaction. backoff_ms / backoff_max_ms: retry backoff (ms); clock: monotonic
    seconds, the clock of the deadlines."""

    def __init__(self, cluster: ClusterState, client: ClusterClient, backoff_ms: int = 20,
                 backoff_max_ms: int = 1000, clock: Callable[[], float] = time.monotonic):
        self.cluster = cluster
        self.client = client
        self.backoff_ms = backoff_ms
        self.backoff_max_ms = backoff_max_ms
        self.clock = clock

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str,
                     partition: int, deadline: float, group_id: str = "") -> ErrorCode:
        """Whether `topic`-`partition` is in the ongoing transaction of
        `transactional_id` with (producer_id, producer_epoch); asks until `deadline`
        (clock seconds). group_id: the consumer group of a group-aware producer (KIP-447
        draft), whose transaction lives with the group's coordinator; "" otherwise.
        Returns the writer's answer (see the module docstring)."""
        remaining = deadline - self.clock()
        if remaining <= 0:
            return ErrorCode.NOT_ENOUGH_REPLICAS
        retrying = AsyncRetrying(
            stop=stop_after_delay(remaining), retry=retry_if_result(lambda code: code in RETRY_CODES),
            wait=wait_exponential_jitter(initial=self.backoff_ms / 1000, max=self.backoff_max_ms / 1000,
                                         jitter=self.backoff_ms / 1000),
            retry_error_callback=lambda state: state.outcome.result())
        code = await retrying(self._ask, transactional_id, producer_id, producer_epoch, topic, partition, deadline,
                              group_id)
        if code != ErrorCode.NONE:
            log.info("transaction verification of %r (PID %d epoch %d) for %s-%d: %s", transactional_id,
                     producer_id, producer_epoch, topic, partition, ErrorCode(code).name)
        return writer_error(code)

    async def _ask(self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str,
                   partition: int, deadline: float, group_id: str = "") -> int:
        _, node, _ = await asyncio.to_thread(self.cluster.coordinator_for, "txn", group_id or transactional_id)
        if node is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        stub = pbg.TransactionCoordinatorStub(self.client.channel(node.address))
        request = pb.AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            verify_only=True, topics=[pb.TopicPartitions(topic=topic, partitions=[partition])],
            consumer_group_id=group_id)
        try:
            resp = await stub.AddPartitionsToTxn(request, timeout=max(deadline - self.clock(), 0.05))
        except grpc.RpcError as exc:
            return transport_error_code(exc)
        codes = {p.error_code for t in resp.results for p in t.partitions}
        return codes.pop() if len(codes) == 1 else ErrorCode.UNKNOWN_SERVER_ERROR
