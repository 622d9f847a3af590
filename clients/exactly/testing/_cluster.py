"""`MockCluster`: a whole Exactly cluster in this process, for unit tests of
applications (the SDK's clients take it as their `transport`).

Its semantics are the services' own pure domain logic, not a second model of them:
the transaction state machine of `services.txn_coordinator.state` (every transition
prepared and completed through `TransactionMetadata`, fencing by epoch included),
the producer state of a partition of `services.partition_leader.producer_state`
(sequences and duplicates, epochs, ongoing transactions, the last stable offset and
what an ABORT marker's aborted-index entry holds: `services.partition_leader.log.AbortedTxn`),
the consumer groups of `services.group_coordinator.group` (join, sync, heartbeat,
leave, the range assignment, offset-commit validation) and the committed and pending
transactional offsets of `services.group_coordinator.offsets`. Those modules need
only what the SDK needs (they are part of the `exactly-log` distribution), so an
SDK-only install runs it.

What it leaves out, because one process has no such faults: replication (one
replica, the high watermark is the log end), coordinator failover and loading,
retention, quotas, authentication. A transaction's markers are written before EndTxn
answers, and a transaction is never aborted by its timeout.
"""
from __future__ import annotations

import bisect
import collections
import concurrent.futures
import itertools
import threading
from typing import Any, Callable, Iterable, Mapping

from exactly_wire import records
from exactly_wire.clock import SYSTEM_CLOCK, MonotonicClock, wall_clock_ms
from exactly_wire.config import parse
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common.settings import (GroupCoordinatorSchema, PartitionLeaderSchema, TxnCoordinatorSchema,
                                      settings_by_role)
from services.group_coordinator.group import GroupMetadata, GroupState, validate_offset_commit
from services.group_coordinator.offsets import OffsetAndMetadata, OffsetStore
from services.partition_leader.log import AbortedTxn
from services.partition_leader.producer_state import ProducerStateManager
from services.txn_coordinator.state import COMPLETED_STATES, TransactionMetadata, TxnState, TxnStateSummary

from .._fetched import AbortedTransactions, parse_fetched
from ..types import ConsumerRecord
from ._channel import AioInProcessChannel, HandlerTable, InProcessChannel

HOST, PORT = "mock-cluster", 9092
# One process plays every role; Metadata lists it once per role, as a cluster's nodes.
NODES = (("mock-leader", "partition_leader"), ("mock-txn", "txn_coordinator"), ("mock-group", "group_coordinator"))
LEADER_ID = NODES[0][0]
OFFSETS_TOPIC = "__consumer_offsets"
READ_COMMITTED = 1
_EARLIEST, _LATEST = -2, -1
_CODES = {c.value for c in ErrorCode}


class _Partition:
    """One partition's log: whole record batches (offsets assigned), its producer state
    and aborted-transaction index; one replica, so the high watermark is the log end."""

    def __init__(self, topic: str):
        self.batches: list[bytes] = []
        self.starts: list[int] = []  # base offset of each batch, for bisect
        self.log_end = 0
        self.producers = ProducerStateManager(internal=topic.startswith("__"))
        self.aborted: list[AbortedTxn] = []

    def last_stable_offset(self) -> int:
        first = self.producers.first_unstable_offset_at(self.log_end)
        return self.log_end if first is None else min(first, self.log_end)

    def _add(self, batch: bytearray, base: int) -> records.BatchHeader:
        records.set_base_offset(batch, base)
        header = records.parse_header(batch)
        self.batches.append(bytes(batch))
        self.starts.append(base)
        self.log_end = header.last_offset + 1
        return header

    def append(self, batch: bytes) -> tuple[ErrorCode, int, str]:
        """A client's batch: (error, base offset, message), checked by the producer state."""
        try:
            header = records.verify_crc(batch)
            problem = records.validate_records(batch, header)
        except records.CorruptRecordError as exc:
            return ErrorCode.CORRUPT_MESSAGE, -1, str(exc)
        if problem is not None or header.is_control:
            return ErrorCode.CORRUPT_MESSAGE if problem else ErrorCode.INVALID_REQUEST, -1, problem or "a control batch"
        if header.producer_id >= 0:
            check = self.producers.check_append(header)
            if check.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                return check.error, check.duplicate.first_offset, check.message
            if check.error != ErrorCode.NONE:
                return check.error, -1, check.message
        written = self._add(bytearray(batch), self.log_end)
        if written.producer_id >= 0:
            self.producers.on_append(written)
        return ErrorCode.NONE, written.base_offset, ""

    def write_marker(self, producer_id: int, producer_epoch: int, committed: bool) -> ErrorCode:
        """A COMMIT or ABORT marker of the producer's transaction (transaction version 2)."""
        check = self.producers.check_marker(producer_id, producer_epoch, 0, 2)
        if check.error != ErrorCode.NONE:
            return check.error
        offset, now = self.log_end, wall_clock_ms()
        if not committed:
            self.aborted.append(AbortedTxn(producer_id, self.producers.txn_first_offset(producer_id, offset), offset,
                                           self.producers.lso_excluding(producer_id, offset + 1)))
        self._add(bytearray(records.encode_control_batch(committed, producer_id, producer_epoch, 0, now)), offset)
        self.producers.complete_marker(producer_id, producer_epoch, 0, offset, now, committed)
        return ErrorCode.NONE

    def read(self, offset: int, max_bytes: int, read_committed: bool) -> tuple[bytes, list[AbortedTxn]]:
        """Whole batches from the one holding `offset` up to the high watermark (the
        last stable offset under read_committed), at least one, about `max_bytes`; with
        the aborted transactions they overlap under read_committed."""
        bound = self.last_stable_offset() if read_committed else self.log_end
        out, size = [], 0
        for i in range(max(bisect.bisect_right(self.starts, offset) - 1, 0), len(self.batches)):
            if self.starts[i] >= bound or (out and size + len(self.batches[i]) > max_bytes):
                break
            out.append(self.batches[i])
            size += len(self.batches[i])
        aborted = [a for a in self.aborted if a.last_offset >= offset and a.first_offset < bound] \
            if read_committed else []
        return b"".join(out), aborted


class MockCluster(pbg.ClusterServicer, pbg.PartitionLeaderServicer, pbg.TransactionCoordinatorServicer,
                  pbg.GroupCoordinatorServicer):
    """An in-process cluster (see the module docstring) to pass as the `transport` of
    `exactly.Producer`, `Consumer`, `AdminClient` and their `exactly.aio` forms, with
    `bootstrap_servers` as their bootstrap.servers:

        cluster = MockCluster(topics={"purchases": 1})
        producer = Producer({"bootstrap.servers": cluster.bootstrap_servers,
                             "transactional.id": "billing-0"}, transport=cluster)

    `topics`: topic name -> partitions to create. `config`: settings of the services,
    by Kafka key (`services.common.settings`: auto.create.topics.enable, num.partitions,
    transaction.max.timeout.ms, group.min.session.timeout.ms, ...); ConfigurationError for
    an unknown key or a wrong value. `clock`: what bounds the waits of requests (a Fetch
    waits up to fetch.max.wait.ms for records, a JoinGroup for the group's other
    members): the real monotonic clock, or a test's `exactly.testing.MockTime`.
    Thread-safe; `close()` stops its timer thread."""

    def __init__(self, topics: Mapping[str, int] | None = None, config: Mapping[str, Any] | None = None,
                 clock: MonotonicClock = SYSTEM_CLOCK):
        roles = settings_by_role(dict(config or {}))
        self.leader_config = parse(PartitionLeaderSchema, roles["partition_leader"])
        self.txn_config = parse(TxnCoordinatorSchema, roles["txn_coordinator"])
        self.group_config = parse(GroupCoordinatorSchema, roles["group_coordinator"])
        self.clock = clock
        self.bootstrap_servers = f"{HOST}:{PORT}"
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._topics: dict[str, list[_Partition]] = {}
        self._txns: dict[str, TransactionMetadata] = {}
        self._pids = itertools.count(1000)
        self._groups: dict[str, GroupMetadata] = {}
        self._offsets = OffsetStore()
        self._offset_log = itertools.count()  # the log offsets OffsetStore orders commits by
        self._waiting: list[tuple[float, Callable[[], bool]]] = []  # (deadline s, answers the request when due)
        self._timer: threading.Thread | None = None
        self._closed = False
        self._table = HandlerTable()
        for add in (pbg.add_ClusterServicer_to_server, pbg.add_PartitionLeaderServicer_to_server,
                    pbg.add_TransactionCoordinatorServicer_to_server, pbg.add_GroupCoordinatorServicer_to_server):
            add(self, self._table)
        self.requests: list[tuple[str, Any]] = []  # (method path, request) of every call, in order
        for name, count in (topics or {}).items():
            self.create_topic(name, count)

    # ------------------------------------------------------------ the transport

    def channel(self, address: str) -> InProcessChannel:
        """A channel to `address` for the synchronous clients (any address reaches this cluster)."""
        return InProcessChannel(address, self._table.handlers, self.clock, self._observe)

    def aio_channel(self, address: str) -> AioInProcessChannel:
        """A channel to `address` for the `exactly.aio` clients."""
        return AioInProcessChannel(address, self._table.handlers, self.clock, self._observe)

    def _observe(self, address: str, path: str, request: Any) -> None:
        with self._lock:
            self.requests.append((path, request))

    # ------------------------------------------------------------ for tests

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create topic `name` with `partitions` partitions (ValueError when it exists)."""
        with self._lock:
            if name in self._topics:
                raise ValueError(f"topic {name!r} exists")
            self._topics[name] = [_Partition(name) for _ in range(partitions)]

    def records(self, topic: str, partition: int = 0, isolation_level: str = "read_committed") -> list[ConsumerRecord]:
        """The records of a partition as a consumer of `isolation_level` reads them from
        offset 0: under read_committed those of committed transactions (and outside
        transactions) below the last stable offset; under read_uncommitted all. Raises
        KeyError for an unknown topic or partition."""
        tp = TopicPartition(topic, partition)
        read_committed = isolation_level == "read_committed"
        with self._lock:
            p = self._partition(topic, partition)
            if p is None:
                raise KeyError(f"no partition {topic}-{partition}")
            data, aborted = p.read(0, len(b"".join(p.batches)) + 1, read_committed)
            lso = p.last_stable_offset()
        state = None
        if read_committed:
            state = AbortedTransactions()
            state.add((a.producer_id, a.first_offset) for a in aborted)
        return parse_fetched(tp, data, 0, state, lso if read_committed else -1).records

    def transaction_state(self, transactional_id: str) -> str | None:
        """Kafka's name of the transactional.id's state at its coordinator ("Ongoing",
        "CompleteCommit", ...), None for an id it does not know."""
        with self._lock:
            md = self._txns.get(transactional_id)
            return None if md is None else md.state.kafka_name

    def close(self) -> None:
        """Stop the timer thread; requests still waiting are answered. Idempotent."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()
        if self._timer is not None:
            self._timer.join(5)

    def __enter__(self) -> "MockCluster":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------ requests that wait

    def _wait(self, answer: Callable[[bool], Any], timeout_ms: int) -> Any:
        """`answer(False)` now if it has an answer (not None), else a Future of
        `answer(expired)`, tried again after every change and at the deadline."""
        out = answer(False)
        if out is not None:
            return out
        fut: concurrent.futures.Future = concurrent.futures.Future()
        deadline = self.clock.now_s() + timeout_ms / 1000.0

        def attempt(now_s: float) -> bool:
            if fut.done():
                return True
            result = answer(now_s >= deadline or self._closed)
            if result is None:
                return False
            fut.set_result(result)
            return True

        self._waiting.append((deadline, attempt))
        self._start_timer()
        return fut

    def _changed_now(self) -> None:
        """Something changed (records, markers, a group): answer the waiting requests that can be."""
        now = self.clock.now_s()
        while True:  # an answer may make another possible (the last member of a join)
            left = [(d, attempt) for d, attempt in self._waiting if not attempt(now)]
            done, self._waiting = len(left) < len(self._waiting), left
            if not done:
                break
        self._changed.notify_all()

    def _start_timer(self) -> None:
        if self._timer is None:
            self._timer = threading.Thread(target=self._run_timer, name="exactly-mock-cluster", daemon=True)
            self._timer.start()

    def _run_timer(self) -> None:
        """Answer waiting requests at their deadlines, on the cluster's clock."""
        with self._lock:
            while True:
                self._changed_now()
                if self._closed and not self._waiting:
                    return
                first = min((d for d, _ in self._waiting), default=None)
                self.clock.wait(self._changed, None if first is None else max(first - self.clock.now_s(), 0.0) + 0.0005)

    # ------------------------------------------------------------ Cluster

    def _partition(self, topic: str, partition: int) -> _Partition | None:
        parts = self._topics.get(topic)
        return parts[partition] if parts is not None and 0 <= partition < len(parts) else None

    def Metadata(self, request: pb.MetadataRequest, context: Any) -> pb.MetadataResponse:
        with self._lock:
            names = list(request.topics) or sorted(self._topics)
            topics = []
            for name in names:
                if name not in self._topics and request.allow_auto_topic_creation \
                        and self.leader_config.auto_create_topics_enable and not name.startswith("__"):
                    self._topics[name] = [_Partition(name) for _ in range(self.leader_config.num_partitions)]
                parts = self._topics.get(name)
                if parts is None:
                    topics.append(pb.TopicMetadata(name=name, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                    continue
                topics.append(pb.TopicMetadata(name=name, is_internal=name.startswith("__"), partitions=[
                    pb.PartitionMetadata(partition=p, leader_id=LEADER_ID, leader_epoch=0, replicas=[LEADER_ID],
                                         isr=[LEADER_ID]) for p in range(len(parts))]))
        return pb.MetadataResponse(nodes=[pb.Node(node_id=n, role=r, host=HOST, port=PORT) for n, r in NODES],
                                   topics=topics, transaction_version=2)

    def FindCoordinator(self, request: pb.FindCoordinatorRequest, context: Any) -> pb.FindCoordinatorResponse:
        node = NODES[2][0] if request.key_type == 0 else NODES[1][0]
        return pb.FindCoordinatorResponse(node_id=node, host=HOST, port=PORT)

    def CreateTopics(self, request: pb.CreateTopicsRequest, context: Any) -> pb.CreateTopicsResponse:
        out = []
        with self._lock:
            for t in request.topics:
                if t.name in self._topics:
                    code = ErrorCode.TOPIC_ALREADY_EXISTS
                elif not t.name or t.name.startswith("__"):
                    code = ErrorCode.INVALID_TOPIC_EXCEPTION
                elif t.num_partitions < 1 and t.num_partitions != -1:
                    code = ErrorCode.INVALID_PARTITIONS
                else:
                    count = t.num_partitions if t.num_partitions > 0 else self.leader_config.num_partitions
                    self._topics[t.name] = [_Partition(t.name) for _ in range(count)]
                    code = ErrorCode.NONE
                out.append(pb.CreatableTopicResult(name=t.name, error_code=code))
        return pb.CreateTopicsResponse(topics=out)

    # ------------------------------------------------------------ PartitionLeader

    def Produce(self, request: pb.ProduceRequest, context: Any) -> pb.ProduceResponse:
        out = []
        with self._lock:
            for t in request.topics:
                parts = []
                for data in t.partitions:
                    code, base, message = self._produce_one(request, t.name, data.partition, bytes(data.records))
                    parts.append(pb.PartitionProduceResponse(partition=data.partition, error_code=code,
                                                             error_message=message, base_offset=base,
                                                             log_append_time_ms=-1))
                out.append(pb.TopicProduceResponse(name=t.name, partitions=parts))
            self._changed_now()
        return pb.ProduceResponse(topics=out)

    def _produce_one(self, request: pb.ProduceRequest, topic: str, partition: int,
                     batch: bytes) -> tuple[ErrorCode, int, str]:
        p = self._partition(topic, partition)
        if p is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, f"no partition {topic}-{partition}"
        try:
            header = records.parse_header(batch)
        except (records.CorruptRecordError, ValueError) as exc:
            return ErrorCode.CORRUPT_MESSAGE, -1, str(exc)
        if header.is_transactional and p.producers.needs_verification(header):
            # KIP-890: the transaction coordinator must hold the partition in the
            # producer's transaction (part 2: the leader adds it for the producer).
            tid, tp = request.transactional_id, TopicPartition(topic, partition)
            code = self._add_partitions(tid, header.producer_id, header.producer_epoch, {tp}) \
                if request.add_partitions_to_txn else self._verify(tid, header.producer_id, header.producer_epoch, tp)
            if code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH):
                return ErrorCode.INVALID_PRODUCER_EPOCH, -1, "fenced by a newer epoch of the transactional.id"
            if code != ErrorCode.NONE:
                return ErrorCode.INVALID_TXN_STATE if code == ErrorCode.INVALID_PRODUCER_ID_MAPPING else code, -1, \
                    f"the coordinator of {tid!r} does not hold {topic}-{partition} in the transaction"
        return p.append(batch)

    def Fetch(self, request: pb.FetchRequest, context: Any) -> Any:
        read_committed = request.isolation_level == READ_COMMITTED

        def answer(expired: bool) -> pb.FetchResponse | None:
            with self._lock:
                topics, size = [], 0
                for t in request.topics:
                    parts = []
                    for fp in t.partitions:
                        parts.append(self._fetch_one(t.topic, fp, read_committed))
                        size += len(parts[-1].records)
                    topics.append(pb.FetchTopicResponse(topic=t.topic, partitions=parts))
                if size == 0 and size < max(request.min_bytes, 1) and not expired and request.max_wait_ms > 0 \
                        and all(p.error_code == ErrorCode.NONE for t in topics for p in t.partitions):
                    return None  # long poll: nothing yet
                return pb.FetchResponse(responses=topics)

        return self._wait(answer, request.max_wait_ms)

    def _fetch_one(self, topic: str, fp: pb.FetchPartition, read_committed: bool) -> pb.FetchPartitionResponse:
        p = self._partition(topic, fp.partition)
        if p is None:
            return pb.FetchPartitionResponse(partition=fp.partition, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if not 0 <= fp.fetch_offset <= p.log_end:
            return pb.FetchPartitionResponse(partition=fp.partition, error_code=ErrorCode.OFFSET_OUT_OF_RANGE,
                                             high_watermark=p.log_end)
        data, aborted = p.read(fp.fetch_offset, fp.partition_max_bytes or (1 << 20), read_committed)
        return pb.FetchPartitionResponse(
            partition=fp.partition, high_watermark=p.log_end, last_stable_offset=p.last_stable_offset(),
            log_start_offset=0, records=data,
            aborted_transactions=[pb.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                                  for a in aborted])

    def ListOffsets(self, request: pb.ListOffsetsRequest, context: Any) -> pb.ListOffsetsResponse:
        out = []
        with self._lock:
            for t in request.topics:
                parts = []
                for lp in t.partitions:
                    p = self._partition(t.name, lp.partition)
                    if p is None:
                        parts.append(pb.ListOffsetsPartitionResponse(
                            partition=lp.partition, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                        continue
                    latest = p.last_stable_offset() if request.isolation_level == READ_COMMITTED else p.log_end
                    offset = {_EARLIEST: 0}.get(lp.timestamp, latest) if lp.timestamp < 0 \
                        else self._offset_for_time(p, lp.timestamp)
                    parts.append(pb.ListOffsetsPartitionResponse(partition=lp.partition, offset=offset,
                                                                 timestamp=-1))
                out.append(pb.ListOffsetsTopicResponse(name=t.name, partitions=parts))
        return pb.ListOffsetsResponse(topics=out)

    @staticmethod
    def _offset_for_time(p: _Partition, timestamp: int) -> int:
        """The first offset of a batch whose records reach `timestamp` ms, -1 when none."""
        for base, batch in zip(p.starts, p.batches):
            header = records.parse_header(batch)
            if not header.is_control and header.max_timestamp >= timestamp:
                return base
        return -1

    # ------------------------------------------------------------ TransactionCoordinator

    def _now(self) -> int:
        return wall_clock_ms()

    def _apply(self, md: TransactionMetadata, transit: Any) -> None:
        """Append `transit` to the (in-memory) transaction log: complete it at once."""
        md.complete_transition(transit)

    def InitProducerId(self, request: pb.InitProducerIdRequest, context: Any) -> pb.InitProducerIdResponse:
        with self._lock:
            tid = request.transactional_id
            if not tid:
                return pb.InitProducerIdResponse(producer_id=next(self._pids), producer_epoch=0)
            timeout_ms = request.transaction_timeout_ms
            if not 0 < timeout_ms <= self.txn_config.max_timeout_ms:
                return pb.InitProducerIdResponse(error_code=ErrorCode.INVALID_TRANSACTION_TIMEOUT)
            md = self._txns.get(tid)
            if md is None:
                md = self._txns[tid] = TransactionMetadata(tid, next(self._pids), txn_timeout_ms=timeout_ms,
                                                           txn_last_update_timestamp=self._now())
            expected = (request.producer_id, request.producer_epoch) \
                if request.HasField("producer_epoch") and request.producer_epoch >= 0 else None
            if expected is not None and not md.is_valid_producer_id(*expected):
                return pb.InitProducerIdResponse(error_code=ErrorCode.PRODUCER_FENCED)
            if md.state is TxnState.ONGOING and request.keep_prepared_txn and md.is_prepared:
                rotate_to = next(self._pids) if md.is_producer_epoch_exhausted else None
                transit = md.prepare_keep_prepared(timeout_ms, self._now(), rotate_to)
                self._apply(md, transit)
                return pb.InitProducerIdResponse(producer_id=transit.producer_id, producer_epoch=transit.producer_epoch,
                                                 ongoing_txn_producer_id=transit.ongoing_txn_producer_id,
                                                 ongoing_txn_producer_epoch=transit.ongoing_txn_producer_epoch)
            if md.state is TxnState.ONGOING:
                # Abort the previous instance's transaction with a bumped epoch, which
                # fences it, then (as the coordinator's answer to the retry would) bump again.
                md.prepare_fence_producer_epoch(self._now())
                self._end(md, md.prepare_abort_or_commit(TxnState.PREPARE_ABORT, self._now()), committed=False)
            if md.is_producer_epoch_exhausted and (expected is None or expected[1] == md.producer_epoch):
                transit = md.prepare_producer_id_rotation(next(self._pids), timeout_ms, self._now(),
                                                          expected is not None)
            else:
                transit = md.prepare_increment_producer_epoch(timeout_ms, expected[1] if expected else None,
                                                              self._now())
                if isinstance(transit, ErrorCode):
                    return pb.InitProducerIdResponse(error_code=transit)
            self._apply(md, transit)
            return pb.InitProducerIdResponse(producer_id=transit.producer_id, producer_epoch=transit.producer_epoch)

    def _producer(self, tid: str, producer_id: int, producer_epoch: int) -> tuple[ErrorCode, TransactionMetadata | None]:
        md = self._txns.get(tid)
        if md is None:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        return md.check_producer(producer_id, producer_epoch), md

    def _verify(self, tid: str, producer_id: int, producer_epoch: int, tp: TopicPartition) -> ErrorCode:
        code, md = self._producer(tid, producer_id, producer_epoch)
        return code if code != ErrorCode.NONE else md.verify_partition(tp)

    def _add_partitions(self, tid: str, producer_id: int, producer_epoch: int,
                        wanted: Iterable[TopicPartition]) -> ErrorCode:
        wanted = frozenset(wanted)
        code, md = self._producer(tid, producer_id, producer_epoch)
        if code != ErrorCode.NONE:
            return code
        answer = md.add_partitions_check(wanted)
        if answer is not None:
            return answer
        self._apply(md, md.prepare_add_partitions(wanted, self._now()))
        return ErrorCode.NONE

    def AddPartitionsToTxn(self, request: pb.AddPartitionsToTxnRequest,
                           context: Any) -> pb.AddPartitionsToTxnResponse:
        wanted = [TopicPartition(t.topic, p) for t in request.topics for p in t.partitions]
        with self._lock:
            if any(self._partition(*tp) is None for tp in wanted):
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif request.verify_only:
                codes = {tp: self._verify(request.transactional_id, request.producer_id, request.producer_epoch, tp)
                         for tp in wanted}
                return _topic_results(codes, pb.AddPartitionsToTxnResponse, "results")
            else:
                code = self._add_partitions(request.transactional_id, request.producer_id, request.producer_epoch,
                                            wanted)
        return _topic_results({tp: code for tp in wanted}, pb.AddPartitionsToTxnResponse, "results")

    def AddOffsetsToTxn(self, request: pb.AddOffsetsToTxnRequest, context: Any) -> pb.AddOffsetsToTxnResponse:
        if not request.group_id:
            return pb.AddOffsetsToTxnResponse(error_code=ErrorCode.INVALID_REQUEST)
        with self._lock:
            code = self._add_partitions(request.transactional_id, request.producer_id, request.producer_epoch,
                                        {TopicPartition(OFFSETS_TOPIC, 0)})
        return pb.AddOffsetsToTxnResponse(error_code=code)

    def EndTxn(self, request: pb.EndTxnRequest, context: Any) -> pb.EndTxnResponse:
        with self._lock:
            md = self._txns.get(request.transactional_id)
            if md is not None and md.is_end_txn_retry(request.producer_id, request.producer_epoch):
                return _end_txn_answer(md, request.committed)
            code, md = self._producer(request.transactional_id, request.producer_id, request.producer_epoch)
            if code != ErrorCode.NONE:
                return pb.EndTxnResponse(error_code=code)
            if md.state is not TxnState.ONGOING:
                return _end_txn_answer(md, request.committed)
            target = TxnState.PREPARE_COMMIT if request.committed else TxnState.PREPARE_ABORT
            self._end(md, md.prepare_abort_or_commit(target, self._now(), bump_epoch=True, transaction_version=2),
                      request.committed)
            return pb.EndTxnResponse(producer_id=md.producer_id, producer_epoch=md.producer_epoch)

    def _end(self, md: TransactionMetadata, prepared: Any, committed: bool) -> None:
        """Apply the Prepare* transit, write every marker, complete the transaction."""
        self._apply(md, prepared)
        pid, epoch = prepared.marker_producer()
        for tp in sorted(prepared.partitions):
            if tp.topic == OFFSETS_TOPIC:
                self._offsets.complete_txn(pid, committed)
            else:
                self._partition(*tp).write_marker(pid, epoch, committed)
        self._apply(md, md.prepare_complete(self._now()))
        self._changed_now()

    def PrepareTxn(self, request: pb.PrepareTxnRequest, context: Any) -> pb.PrepareTxnResponse:
        with self._lock:
            code, md = self._producer(request.transactional_id, request.producer_id, request.producer_epoch)
            if code == ErrorCode.NONE and not md.is_prepared:
                if md.state in COMPLETED_STATES and md.is_producer_epoch_exhausted:
                    code = ErrorCode.INVALID_PRODUCER_EPOCH
                else:
                    self._apply(md, md.prepare_mark_prepared(self._now()))
        return pb.PrepareTxnResponse(error_code=code)

    def ListTransactions(self, request: pb.ListTransactionsRequest, context: Any) -> pb.ListTransactionsResponse:
        with self._lock:
            found = [TxnStateSummary.of(md) for md in self._txns.values()]
        return pb.ListTransactionsResponse(transaction_states=[
            pb.TransactionState(transactional_id=s.transactional_id, producer_id=s.producer_id,
                                state=s.state.kafka_name, producer_epoch=s.producer_epoch,
                                transaction_start_time_ms=s.txn_start_timestamp)
            for s in found if (not request.state_filters or s.state.kafka_name in request.state_filters)
            and (not request.producer_id_filters or s.producer_id in request.producer_id_filters)])

    # ------------------------------------------------------------ GroupCoordinator

    def _group(self, group_id: str) -> GroupMetadata:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = GroupMetadata(group_id, self.clock(), self.group_config)
        return group

    def _partition_counts(self) -> dict[str, int]:
        return {name: len(parts) for name, parts in self._topics.items()}

    def JoinGroup(self, request: pb.JoinGroupRequest, context: Any) -> Any:
        with self._lock:
            group = self._group(request.group_id)
            outcome = group.join(request.member_id, request.topics, request.session_timeout_ms,
                                 request.rebalance_timeout_ms, self.clock(), request.protocol_type,
                                 request.group_instance_id)
            if outcome.response is not None:
                return _join_response(outcome.response)
            if outcome.store_then_answer:
                return _join_response(group.current_join_response(outcome.member_id))
            member = outcome.member_id
            self._changed_now()  # other members waiting in a join may be complete now

        def answer(expired: bool) -> pb.JoinGroupResponse | None:
            completed = group.poll_rebalance(self.clock(), self._partition_counts())
            if completed is not None:
                group.store_completed(completed.generation, ErrorCode.NONE, self.clock())
            if member not in group.members:  # removed: it did not rejoin in time
                return pb.JoinGroupResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID, member_id=member)
            if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                return _join_response(group.current_join_response(member))
            return None

        with self._lock:
            return self._wait(answer, max(group.rebalance_deadline_ms() - self.clock(), 0) + 1)

    def SyncGroup(self, request: pb.SyncGroupRequest, context: Any) -> pb.SyncGroupResponse:
        with self._lock:
            code, assignment = self._group(request.group_id).sync(request.member_id, request.generation_id,
                                                                  self.clock(), request.group_instance_id)
        return pb.SyncGroupResponse(error_code=code, assignment=[pb.TopicPartitions(topic=t, partitions=ps)
                                                                 for t, ps in sorted(assignment.items())])

    def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        with self._lock:
            group = self._group(request.group_id)
            group.expire_members(self.clock())
            code = group.heartbeat(request.member_id, request.generation_id, self.clock(), request.group_instance_id)
        return pb.HeartbeatResponse(error_code=code)

    def LeaveGroup(self, request: pb.LeaveGroupRequest, context: Any) -> pb.LeaveGroupResponse:
        with self._lock:
            code = self._group(request.group_id).leave(request.member_id, self.clock(), request.group_instance_id)
            self._changed_now()
        return pb.LeaveGroupResponse(error_code=code)

    def OffsetCommit(self, request: pb.OffsetCommitRequest, context: Any) -> pb.OffsetCommitResponse:
        with self._lock:
            group = self._groups.get(request.group_id)
            code = validate_offset_commit(group, request.member_id, request.generation_id, False,
                                          request.group_instance_id)
            codes = {}
            for t in request.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, p.partition)
                    codes[tp] = code
                    if code == ErrorCode.NONE:
                        self._offsets.apply_commit(request.group_id, tp, _offset(p), next(self._offset_log))
        return _topic_results(codes, pb.OffsetCommitResponse, "topics")

    def TxnOffsetCommit(self, request: pb.TxnOffsetCommitRequest, context: Any) -> pb.TxnOffsetCommitResponse:
        with self._lock:
            code = validate_offset_commit(self._groups.get(request.group_id), request.member_id,
                                          request.generation_id, True, request.group_instance_id)
            if code == ErrorCode.NONE:
                # KIP-890: the producer's transaction must hold the group's offsets.
                code = self._verify(request.transactional_id, request.producer_id, request.producer_epoch,
                                    TopicPartition(OFFSETS_TOPIC, 0))
                if code == ErrorCode.INVALID_PRODUCER_EPOCH:
                    code = ErrorCode.PRODUCER_FENCED
            codes = {}
            for t in request.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, p.partition)
                    codes[tp] = code
                    if code == ErrorCode.NONE:
                        self._offsets.apply_txn_commit(request.producer_id, request.group_id, tp, _offset(p),
                                                       next(self._offset_log))
        return _topic_results(codes, pb.TxnOffsetCommitResponse, "topics")

    def OffsetFetch(self, request: pb.OffsetFetchRequest, context: Any) -> pb.OffsetFetchResponse:
        wanted = [TopicPartition(t.topic, p) for t in request.topics for p in t.partitions] or None
        with self._lock:
            fetched = self._offsets.fetch(request.group_id, wanted, request.require_stable)
        by_topic: dict[str, list[pb.OffsetFetchPartition]] = collections.defaultdict(list)
        for tp, f in fetched.items():
            by_topic[tp.topic].append(pb.OffsetFetchPartition(partition=tp.partition, committed_offset=f.offset,
                                                              metadata=f.metadata, error_code=f.error))
        return pb.OffsetFetchResponse(topics=[pb.OffsetFetchTopic(name=t, partitions=ps) for t, ps in by_topic.items()])


def _end_txn_answer(md: TransactionMetadata, committed: bool) -> pb.EndTxnResponse:
    code = md.end_txn_outcome(committed)
    if code != ErrorCode.NONE:
        return pb.EndTxnResponse(error_code=code)
    return pb.EndTxnResponse(producer_id=md.producer_id, producer_epoch=md.producer_epoch)


def _offset(p: pb.OffsetCommitPartition) -> OffsetAndMetadata:
    return OffsetAndMetadata(p.committed_offset, p.metadata, p.committed_leader_epoch, wall_clock_ms())


def _join_response(r: Any) -> pb.JoinGroupResponse:
    return pb.JoinGroupResponse(error_code=r.error, generation_id=r.generation_id, protocol_name=r.protocol_name,
                                leader=r.leader, member_id=r.member_id, members=list(r.members))


def _topic_results(codes: Mapping[TopicPartition, int], response: type, field: str) -> Any:
    """A response of per-partition TopicResults (`field`: its repeated field's name)."""
    by_topic: dict[str, list[pb.PartitionResult]] = collections.defaultdict(list)
    for tp, code in codes.items():
        by_topic[tp.topic].append(pb.PartitionResult(partition=tp.partition, error_code=code))
    return response(**{field: [pb.TopicResult(topic=t, partitions=ps) for t, ps in by_topic.items()]})


__all__ = ["MockCluster"]
