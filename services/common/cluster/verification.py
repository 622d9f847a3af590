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

`TxnVerifier.add` is KIP-890 part 2: for a producer that asked for it
(ProduceRequest.add_partitions_to_txn) the leader adds the partition to the
producer's transaction itself, saving the producer its AddPartitionsToTxn round trip.
The partitions of one producer's transaction that arrive together (the entries of
one Produce) go to the coordinator as one request; while one is in flight, the next
ones wait and go together after it (the coordinator takes one change of a
transaction at a time). The producer's epoch, bumped by every EndTxn, keeps a late
batch of an ended transaction out of the next one: its add is refused as fenced.

`TxnVerifier.verify` finds the coordinator as FindCoordinator does (the live owner of
partition crc32(transactional.id) % n of `TRANSACTION_STATE_TOPIC`), asks it, and retries
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

from .owned import first_wait_s
from .state import ClusterState
from ..transport.rpc import ClusterClient, transport_error_code
from ..transport.tunnel import method_path

log = logging.getLogger(__name__)

# Answers after which asking again may succeed: the coordinator moves, loads, or is
# completing the previous transaction of the id.
RETRY_CODES = frozenset({
    ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT,
})
FENCED_CODES = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH})
# An implicit add also retries while the coordinator's topic view lags a new partition.
ADD_RETRY_CODES = RETRY_CODES | {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
_ADD_PARTITIONS_TO_TXN = method_path("TransactionCoordinator", "AddPartitionsToTxn")


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

    def add(self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int,
            deadline: float) -> Awaitable[ErrorCode]: ...


class _PendingAdd:
    """Partitions of one (transactional.id, PID, epoch) waiting to be added together."""
    __slots__ = ("partitions", "deadline", "future")

    def __init__(self, deadline: float, future: asyncio.Future):
        self.partitions: set[tuple[str, int]] = set()
        self.deadline = deadline
        self.future = future


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
        # Implicit adds (KIP-890 part 2) by (transactional.id, PID, epoch): the
        # partitions gathered for the next request, and the keys with one in flight.
        self._pending_adds: dict[tuple[str, int, int], _PendingAdd] = {}
        self._adding: set[tuple[str, int, int]] = set()

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
        code = await self._asking(deadline, RETRY_CODES, self._ask, transactional_id, producer_id, producer_epoch,
                                  topic, partition, deadline, group_id)
        if code != ErrorCode.NONE:
            log.info("transaction verification of %r (PID %d epoch %d) for %s-%d: %s", transactional_id,
                     producer_id, producer_epoch, topic, partition, ErrorCode(code).name)
        return writer_error(code)

    async def _asking(self, deadline: float, codes: frozenset, ask: Callable[..., Awaitable[int]], *args) -> int:
        """`await ask(*args)` (an error code), asked again while the answer is one of
        `codes` until `deadline` (clock seconds), with exponential backoff and jitter;
        the last answer. The first ask goes out as is: the retry machinery (tenacity)
        is built only when it is answered with one of `codes`, after the first backoff."""
        code = await ask(*args)
        if code not in codes:
            return code
        wait = self._wait()
        await asyncio.sleep(first_wait_s(wait))
        remaining = deadline - self.clock()
        if remaining <= 0:
            return code
        return await AsyncRetrying(
            stop=stop_after_delay(remaining), retry=retry_if_result(lambda code: code in codes), wait=wait,
            retry_error_callback=lambda state: state.outcome.result())(ask, *args)

    def _wait(self) -> wait_exponential_jitter:
        """The backoff between asks: exponential from backoff_ms up to backoff_max_ms, with jitter."""
        return wait_exponential_jitter(multiplier=self.backoff_ms / 1000, max=self.backoff_max_ms / 1000,
                                       jitter=self.backoff_ms / 1000)

    async def add(self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str,
                  partition: int, deadline: float) -> ErrorCode:
        """Add `topic`-`partition` to the transaction of `transactional_id` with
        (producer_id, producer_epoch), starting it if none is ongoing (KIP-890 part 2;
        the coordinator appends the change to `TRANSACTION_STATE_TOPIC` before it answers,
        and first waits while the producer's previous transaction completes). Asks
        until `deadline` (clock seconds). Returns the writer's answer as `verify`:
        NONE once the partition is in the transaction, INVALID_PRODUCER_EPOCH for
        another epoch (a late batch of an ended transaction, or a fenced producer),
        INVALID_TXN_STATE (no such PID for the id, or the transaction is sealed),
        NOT_ENOUGH_REPLICAS (no coordinator answered in time)."""
        key = (transactional_id, producer_id, producer_epoch)
        pending = self._pending_adds.get(key)
        if pending is None:
            loop = asyncio.get_running_loop()
            pending = self._pending_adds[key] = _PendingAdd(deadline, loop.create_future())
            if key not in self._adding:
                # After the other entries of this Produce have joined (they run before
                # callbacks scheduled now).
                loop.call_soon(self._send_add, key)
        pending.partitions.add((topic, partition))
        pending.deadline = max(pending.deadline, deadline)
        code = await asyncio.shield(pending.future)
        if code != ErrorCode.NONE:
            log.info("implicit add of %s-%d to the transaction of %r (PID %d epoch %d): %s", topic, partition,
                     transactional_id, producer_id, producer_epoch, ErrorCode(code).name)
        return writer_error(code)

    def _send_add(self, key: tuple[str, int, int]) -> None:
        pending = self._pending_adds.pop(key, None)
        if pending is None:
            return
        self._adding.add(key)
        task = asyncio.ensure_future(self._run_add(key, pending))
        task.add_done_callback(lambda _t: self._add_done(key))

    def _add_done(self, key: tuple[str, int, int]) -> None:
        self._adding.discard(key)
        if key in self._pending_adds:
            self._send_add(key)

    async def _run_add(self, key: tuple[str, int, int], pending: _PendingAdd) -> None:
        transactional_id, producer_id, producer_epoch = key
        try:
            remaining = pending.deadline - self.clock()
            if remaining <= 0:
                code = ErrorCode.REQUEST_TIMED_OUT
            else:
                code = await self._asking(pending.deadline, ADD_RETRY_CODES, self._ask_add, transactional_id,
                                          producer_id, producer_epoch, sorted(pending.partitions), pending.deadline)
        except Exception as exc:  # noqa: BLE001 - every waiter gets an answer
            log.warning("implicit add for %r failed: %r", transactional_id, exc)
            code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not pending.future.done():
            pending.future.set_result(code)

    async def _ask_add(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: list[tuple[str, int]], deadline: float) -> int:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        request = pb.AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            implicit=True, topics=[pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()])
        return await self._call(transactional_id, "", request, deadline)

    async def _call(self, key: str, group_id: str, request: pb.AddPartitionsToTxnRequest, deadline: float) -> int:
        """One AddPartitionsToTxn to the coordinator of `key`: its single error code."""
        _, node, _ = await self.cluster.lookup_coordinator("txn", group_id or key)
        if node is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        try:
            resp = await self.client.tunnel(node.address).call(
                _ADD_PARTITIONS_TO_TXN, request, pb.AddPartitionsToTxnResponse, max(deadline - self.clock(), 0.05))
        except grpc.RpcError as exc:
            return transport_error_code(exc)
        codes = {p.error_code for t in resp.results for p in t.partitions}
        return codes.pop() if len(codes) == 1 else ErrorCode.UNKNOWN_SERVER_ERROR

    async def _ask(self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str,
                   partition: int, deadline: float, group_id: str = "") -> int:
        request = pb.AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            verify_only=True, topics=[pb.TopicPartitions(topic=topic, partitions=[partition])],
            consumer_group_id=group_id)
        return await self._call(transactional_id, group_id, request, deadline)
