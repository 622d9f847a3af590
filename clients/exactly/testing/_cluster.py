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

Its nodes: `partition_leaders` partition leaders ("leader-0", ...; partition p of a
topic is led by leader p mod their number), a transaction coordinator
("txn-coordinator") and a group coordinator ("group-coordinator"), each at its own
address ("leader-0:9092"); `bootstrap_servers` reaches the cluster whichever node is
down. A test takes nodes down and up and moves a partition's leader, makes the next
requests of an RPC answer an error, or holds a request until it releases it (the fault
injection of librdkafka's mock cluster). An ongoing transaction older than its
transaction.timeout.ms is aborted with an epoch bump, as the coordinator's scan does,
on the cluster's clock, when the next request arrives or the test looks.

What it leaves out: replication (one replica, the high watermark is the log end),
coordinator failover and loading, retention, quotas, authentication. A transaction's
markers are written before EndTxn answers.
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import threading
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import grpc
from google.protobuf import message_factory

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
from services.txn_coordinator.state import (COMPLETED_STATES, TransactionMetadata, TxnState, TxnStateSummary,
                                            listed_state_names)

from .._fetched import AbortedTransactions, parse_fetched
from ..types import ConsumerRecord
from ._channel import AioInProcessChannel, CallError, Context, HandlerTable, InProcessChannel
from ._faults import Fault, Faults, Held, answer_later
from ._log import PartitionLog

PORT = 9092
BOOTSTRAP = f"mock-cluster:{PORT}"
TXN_COORDINATOR, GROUP_COORDINATOR = "txn-coordinator", "group-coordinator"
OFFSETS_TOPIC = "__consumer_offsets"
READ_COMMITTED = 1
_EARLIEST = -2

# The answer of each RPC, for an injected error of an RPC answered as a whole.
_RESPONSES = {m.name: message_factory.GetMessageClass(m.output_type)
              for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods}
# RPCs whose servicer below reads the injected errors itself: answered per partition,
# per topic, per transactional id or group, or (JoinGroup) with more than an error code.
_OWN_FAULTS = frozenset({"Produce", "Fetch", "ListOffsets", "AddPartitionsToTxn", "OffsetCommit", "TxnOffsetCommit",
                         "CreateTopics", "DescribeTransactions", "DescribeGroups", "DeleteGroups", "JoinGroup"})


class Request(NamedTuple):
    """A request the cluster received: its RPC ("EndTxn"), the address it was sent to,
    and the message."""

    rpc: str
    address: str
    message: Any


class CompletedTransaction(NamedTuple):
    """A transaction the coordinator completed: its transactional.id, the producer id
    and epoch of its markers, committed or aborted, and its partitions (the consumer
    group offsets' as `__consumer_offsets` partition 0)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    partitions: frozenset[TopicPartition]


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
    an unknown key or a wrong value. `clock`: the cluster's time (ms from `clock()`):
    transaction timeouts and timestamps, group sessions, and the waits of requests (a
    Fetch waits up to fetch.max.wait.ms for records, a JoinGroup for the group's other
    members): the real monotonic clock, or a test's `exactly.testing.MockTime`.
    `partition_leaders`: how many partition leader nodes (>= 1). `transaction_version`:
    2 (KIP-890 part 2: partition leaders add a producer's partitions to its transaction,
    and EndTxn ends it under the next epoch), or 1 (producers send AddPartitionsToTxn).
    Thread-safe; `close()` stops its timer thread."""

    def __init__(self, topics: Mapping[str, int] | None = None, config: Mapping[str, Any] | None = None,
                 clock: MonotonicClock = SYSTEM_CLOCK, *, partition_leaders: int = 1, transaction_version: int = 2):
        if partition_leaders < 1:
            raise ValueError(f"partition_leaders must be >= 1, not {partition_leaders}")
        if transaction_version not in (1, 2):
            raise ValueError(f"transaction_version must be 1 or 2, not {transaction_version}")
        roles = settings_by_role(dict(config or {}))
        self.leader_config = parse(PartitionLeaderSchema, roles["partition_leader"])
        self.txn_config = parse(TxnCoordinatorSchema, roles["txn_coordinator"])
        self.group_config = parse(GroupCoordinatorSchema, roles["group_coordinator"])
        self.clock = clock
        self.transaction_version = transaction_version
        self.bootstrap_servers = BOOTSTRAP
        self._leaders = [f"leader-{i}" for i in range(partition_leaders)]
        self._roles = {**{n: "partition_leader" for n in self._leaders}, TXN_COORDINATOR: "txn_coordinator",
                       GROUP_COORDINATOR: "group_coordinator"}
        self._down: set[str] = set()
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._topics: dict[str, list[PartitionLog]] = {}
        self._txns: dict[str, TransactionMetadata] = {}
        self._pids = itertools.count(1000)
        self._groups: dict[str, GroupMetadata] = {}
        self._offsets = OffsetStore()
        self._offset_log = itertools.count()  # the log offsets OffsetStore orders commits by
        self._waiting: list[tuple[float, Callable[[], bool]]] = []  # (deadline s, answers the request when due)
        self._timer: threading.Thread | None = None
        self._closed = False
        self._faults = Faults()
        self._table = HandlerTable()
        for add in (pbg.add_ClusterServicer_to_server, pbg.add_PartitionLeaderServicer_to_server,
                    pbg.add_TransactionCoordinatorServicer_to_server, pbg.add_GroupCoordinatorServicer_to_server):
            add(self, self._table)
        self.requests: list[Request] = []  # every request received, in order
        self.completed_transactions: list[CompletedTransaction] = []  # in the order they completed
        for name, count in (topics or {}).items():
            self.create_topic(name, count)

    # ------------------------------------------------------------ the transport

    def channel(self, address: str) -> InProcessChannel:
        """A channel to `address` for the synchronous clients (a node's address, or any
        other: the bootstrap address reaches the cluster)."""
        return InProcessChannel(address, self._table.handlers, self.clock, self._serve)

    def aio_channel(self, address: str) -> AioInProcessChannel:
        """A channel to `address` for the `exactly.aio` clients."""
        return AioInProcessChannel(address, self._table.handlers, self.clock, self._serve)

    def _serve(self, request: Any, context: Context, run: Callable[[], Any]) -> Any:
        """Every request: refused while its node is down, recorded, held or answered an
        injected error when a test asked for it, else answered by the servicer (`run`)."""
        node = self._node_at(context.address)
        with self._lock:
            if node in self._down:
                raise CallError(grpc.StatusCode.UNAVAILABLE, f"{node} is down (MockCluster.take_down)")
            self.requests.append(Request(context.rpc, context.address, request))
            self._abort_timed_out()
        held = self._faults.take_hold(context.rpc)
        if held is not None and held.handled:
            answered: concurrent.futures.Future = concurrent.futures.Future()
            try:
                answered.set_result(self._answer(context.rpc, run))
            except Exception as exc:  # noqa: BLE001 - the call's failure, answered at the release
                answered.set_exception(exc)
            return answer_later(held, answered.result)
        if held is not None:
            return answer_later(held, lambda: self._answer(context.rpc, run))
        return self._answer(context.rpc, run)

    def _answer(self, rpc: str, run: Callable[[], Any]) -> Any:
        fault = None if rpc in _OWN_FAULTS else self._faults.take(rpc)
        if fault is None:
            return run()
        if fault.applied:
            run()
        return _RESPONSES[rpc](error_code=fault.error)

    def _node_at(self, address: str) -> str | None:
        node = address.rpartition(":")[0]
        return node if node in self._roles else None

    # ------------------------------------------------------------ for tests: the cluster

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create topic `name` with `partitions` partitions (ValueError when it exists)."""
        with self._lock:
            if name in self._topics:
                raise ValueError(f"topic {name!r} exists")
            self._add_topic(name, partitions)

    def _add_topic(self, name: str, partitions: int) -> None:
        self._topics[name] = [PartitionLog(name, self._leaders[p % len(self._leaders)]) for p in range(partitions)]

    @property
    def nodes(self) -> dict[str, str]:
        """Node id -> role ("partition_leader", "txn_coordinator", "group_coordinator")."""
        return dict(self._roles)

    def address_of(self, node: str) -> str:
        """The node's address ("leader-0:9092"). Raises KeyError for an unknown node."""
        self._role(node)
        return f"{node}:{PORT}"

    def leader_of(self, topic: str, partition: int = 0) -> str:
        """The node id that leads the partition (whether it is up or not). Raises KeyError."""
        with self._lock:
            return self._log(topic, partition).leader

    def take_down(self, node: str) -> None:
        """Stop node `node` (librdkafka's rd_kafka_mock_broker_set_down): calls to its
        address fail as a dead service's do (UNAVAILABLE: the SDK's NetworkException);
        Metadata lists it no more and lists its partitions without a leader
        (LEADER_NOT_AVAILABLE); FindCoordinator answers COORDINATOR_NOT_AVAILABLE for a
        coordinator that is down. Raises KeyError for an unknown node."""
        self._role(node)
        with self._lock:
            self._down.add(node)

    def bring_up(self, node: str) -> None:
        """Start node `node` again, with everything it held. Raises KeyError for an unknown node."""
        self._role(node)
        with self._lock:
            self._down.discard(node)
            self._changed_now()

    def move_leader(self, topic: str, partition: int, node: str) -> None:
        """Make partition leader `node` the partition's leader: the former one answers
        NOT_LEADER_OR_FOLLOWER for it. Raises KeyError for an unknown partition, ValueError
        for a node that is not a partition leader."""
        if self._role(node) != "partition_leader":
            raise ValueError(f"{node} is not a partition leader")
        with self._lock:
            self._log(topic, partition).leader = node

    def _role(self, node: str) -> str:
        role = self._roles.get(node)
        if role is None:
            raise KeyError(f"no node {node!r}: one of {', '.join(self._roles)}")
        return role

    def _log(self, topic: str, partition: int) -> PartitionLog:
        p = self._partition(topic, partition)
        if p is None:
            raise KeyError(f"no partition {topic}-{partition}")
        return p

    # ------------------------------------------------------------ for tests: faults

    def fail_next(self, rpc: str, *errors: ErrorCode | int, applied: bool = False, topic: str | None = None,
                  partition: int | None = None) -> None:
        """The next `len(errors)` requests of `rpc` (a method of the services' API:
        "EndTxn", "InitProducerId", "Produce", "JoinGroup", ...) answer these errors, one
        each, in order (librdkafka's rd_kafka_mock_push_request_errors), instead of being
        handled: "make the next EndTxn answer NOT_COORDINATOR" is
        `cluster.fail_next("EndTxn", ErrorCode.NOT_COORDINATOR)`. With `applied=True` the
        request takes effect all the same and only its answer is the error (an answer
        lost after the work was done: the client's retry finds it done). An RPC answered
        per partition (Produce, Fetch, ListOffsets, AddPartitionsToTxn, OffsetCommit,
        TxnOffsetCommit) answers the error for each partition of the request, or, with
        `topic` (and `partition`), only for those, and then only requests naming them
        match; CreateTopics per topic; DescribeTransactions, DescribeGroups and
        DeleteGroups per transactional id or group. JoinGroup's MEMBER_ID_REQUIRED
        carries the member id to join with, as Kafka's (KIP-394). Raises ValueError for
        an unknown RPC, one that carries no error (Metadata: take nodes down instead),
        or an error code Kafka does not have."""
        Faults.check_rpc(rpc)
        if rpc not in _OWN_FAULTS and "error_code" not in _RESPONSES[rpc].DESCRIPTOR.fields_by_name:
            raise ValueError(f"{rpc} answers no error of its own")
        faults = [Fault(ErrorCode(code), applied, topic, partition) for code in errors]
        self._faults.push(rpc, faults)

    def hold_next(self, rpc: str, handled: bool = False) -> Held:
        """Hold the next request of `rpc` (as `fail_next` names it) until the test calls
        `release()` on the returned `Held`, whose `arrived` event is set when the request
        came in; the cluster handles it at the release (a slow service, or requests
        overtaking each other) -- with `handled=True` when it arrives, and only its
        answer waits for the release (answers overtaking each other: a leader that
        appended a batch and answers it after the batches that followed). Raises
        ValueError for an unknown RPC."""
        Faults.check_rpc(rpc)
        return self._faults.hold(rpc, handled)

    def clear_faults(self) -> None:
        """Forget the injected errors and holds not used yet (a held request that
        arrived stays held until released)."""
        self._faults.clear()

    def requests_of(self, rpc: str, address: str | None = None) -> list[Any]:
        """The messages of the requests of `rpc` received (those sent to `address`, when
        given), in order."""
        with self._lock:
            return [r.message for r in self.requests if r.rpc == rpc and (address is None or r.address == address)]

    # ------------------------------------------------------------ for tests: what the cluster holds

    def records(self, topic: str, partition: int = 0, isolation_level: str = "read_committed") -> list[ConsumerRecord]:
        """The records of a partition as a consumer of `isolation_level` reads them from
        offset 0: under read_committed those of committed transactions (and outside
        transactions) below the last stable offset; under read_uncommitted all. Raises
        KeyError for an unknown topic or partition."""
        tp = TopicPartition(topic, partition)
        read_committed = isolation_level == "read_committed"
        with self._lock:
            self._abort_timed_out()
            p = self._log(topic, partition)
            data, aborted = p.read(0, len(b"".join(p.batches)) + 1, read_committed)
            lso = p.last_stable_offset()
        state = None
        if read_committed:
            state = AbortedTransactions()
            state.add((a.producer_id, a.first_offset) for a in aborted)
        return parse_fetched(tp, data, 0, state, lso if read_committed else -1).records

    def batches(self, topic: str, partition: int = 0) -> list[records.BatchHeader]:
        """The record batches of a partition as written (data and control, with their
        offsets, producer id, epoch, base sequence, compression, ...). Raises KeyError
        for an unknown topic or partition."""
        with self._lock:
            return self._log(topic, partition).headers()

    def transaction_state(self, transactional_id: str) -> str | None:
        """Kafka's name of the transactional.id's state at its coordinator ("Ongoing",
        "CompleteCommit", ...), None for an id it does not know."""
        with self._lock:
            self._abort_timed_out()
            md = self._txns.get(transactional_id)
            return None if md is None else md.state.kafka_name

    def committed_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        """The group's committed offsets (transactional ones once their transaction
        committed), {TopicPartition: offset}."""
        with self._lock:
            return {tp: self._offsets.committed(group_id, tp).offset
                    for tp in self._offsets.committed_partitions(group_id)}

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

    def _partition(self, topic: str, partition: int) -> PartitionLog | None:
        parts = self._topics.get(topic)
        return parts[partition] if parts is not None and 0 <= partition < len(parts) else None

    def _live(self, node: str) -> bool:
        return node not in self._down

    def Metadata(self, request: pb.MetadataRequest, context: Any) -> pb.MetadataResponse:
        with self._lock:
            names = list(request.topics) or sorted(self._topics)
            topics = []
            for name in names:
                if name not in self._topics and request.allow_auto_topic_creation \
                        and self.leader_config.auto_create_topics_enable and not name.startswith("__"):
                    self._add_topic(name, self.leader_config.num_partitions)
                parts = self._topics.get(name)
                if parts is None:
                    topics.append(pb.TopicMetadata(name=name, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                    continue
                topics.append(pb.TopicMetadata(name=name, is_internal=name.startswith("__"), partitions=[
                    pb.PartitionMetadata(partition=i, leader_id=p.leader if self._live(p.leader) else "",
                                         error_code=ErrorCode.NONE if self._live(p.leader)
                                         else ErrorCode.LEADER_NOT_AVAILABLE,
                                         leader_epoch=0, replicas=[p.leader], isr=[p.leader] if self._live(p.leader)
                                         else []) for i, p in enumerate(parts)]))
            nodes = [pb.Node(node_id=n, role=r, host=n, port=PORT) for n, r in self._roles.items() if self._live(n)]
        return pb.MetadataResponse(nodes=nodes, topics=topics, transaction_version=self.transaction_version)

    def FindCoordinator(self, request: pb.FindCoordinatorRequest, context: Any) -> pb.FindCoordinatorResponse:
        node = GROUP_COORDINATOR if request.key_type == 0 else TXN_COORDINATOR
        with self._lock:
            if not self._live(node):
                return pb.FindCoordinatorResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                                  error_message=f"{node} is down")
        return pb.FindCoordinatorResponse(node_id=node, host=node, port=PORT)

    def CreateTopics(self, request: pb.CreateTopicsRequest, context: Context) -> pb.CreateTopicsResponse:
        out = []
        with self._lock:
            fault = self._faults.take(context.rpc, [TopicPartition(t.name, -1) for t in request.topics])
            for t in request.topics:
                if fault is not None and fault.covers(TopicPartition(t.name, -1)):
                    if fault.applied and t.name not in self._topics:
                        self._add_topic(t.name, t.num_partitions if t.num_partitions > 0
                                        else self.leader_config.num_partitions)
                    out.append(pb.CreatableTopicResult(name=t.name, error_code=fault.error))
                    continue
                if t.name in self._topics:
                    code = ErrorCode.TOPIC_ALREADY_EXISTS
                elif not t.name or t.name.startswith("__"):
                    code = ErrorCode.INVALID_TOPIC_EXCEPTION
                elif t.num_partitions < 1 and t.num_partitions != -1:
                    code = ErrorCode.INVALID_PARTITIONS
                else:
                    self._add_topic(t.name, t.num_partitions if t.num_partitions > 0
                                    else self.leader_config.num_partitions)
                    code = ErrorCode.NONE
                out.append(pb.CreatableTopicResult(name=t.name, error_code=code))
        return pb.CreateTopicsResponse(topics=out)

    # ------------------------------------------------------------ PartitionLeader

    def _leader_check(self, context: Context, topic: str, partition: int) -> tuple[ErrorCode, PartitionLog | None]:
        """The partition's log when this request may use it: UNKNOWN_TOPIC_OR_PARTITION,
        or NOT_LEADER_OR_FOLLOWER when sent to a node that does not lead it."""
        p = self._partition(topic, partition)
        if p is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None
        node = self._node_at(context.address)
        if node is not None and node != p.leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, None
        return ErrorCode.NONE, p

    def Produce(self, request: pb.ProduceRequest, context: Context) -> pb.ProduceResponse:
        out = []
        with self._lock:
            fault = self._faults.take(context.rpc, [TopicPartition(t.name, d.partition) for t in request.topics
                                                    for d in t.partitions])
            for t in request.topics:
                parts = []
                for data in t.partitions:
                    code, base, message = self._produce_one(request, context, t.name, data.partition,
                                                            bytes(data.records), fault)
                    parts.append(pb.PartitionProduceResponse(partition=data.partition, error_code=code,
                                                             error_message=message, base_offset=base,
                                                             log_append_time_ms=-1))
                out.append(pb.TopicProduceResponse(name=t.name, partitions=parts))
            self._changed_now()
        return pb.ProduceResponse(topics=out)

    def _produce_one(self, request: pb.ProduceRequest, context: Context, topic: str, partition: int,
                     batch: bytes, fault: Fault | None) -> tuple[ErrorCode, int, str]:
        code, p = self._leader_check(context, topic, partition)
        if p is None:
            return code, -1, f"{topic}-{partition}: {code.name}"
        if fault is not None and fault.covers(TopicPartition(topic, partition)):
            if fault.applied:
                self._append(request, topic, partition, p, batch)
            return fault.error, -1, "injected by MockCluster.fail_next"
        return self._append(request, topic, partition, p, batch)

    def _append(self, request: pb.ProduceRequest, topic: str, partition: int, p: PartitionLog,
                batch: bytes) -> tuple[ErrorCode, int, str]:
        try:
            header = records.parse_header(batch)
        except (records.CorruptRecordError, ValueError) as exc:
            return ErrorCode.CORRUPT_MESSAGE, -1, str(exc)
        if header.is_transactional and p.producers.needs_verification(header):
            # KIP-890: the transaction coordinator must hold the partition in the
            # producer's transaction (part 2: the leader adds it for the producer).
            tid, tp = request.transactional_id, TopicPartition(topic, partition)
            code = self._add_partitions(tid, header.producer_id, header.producer_epoch, {tp}) \
                if request.add_partitions_to_txn and self.transaction_version >= 2 \
                else self._verify(tid, header.producer_id, header.producer_epoch, tp)
            if code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH):
                return ErrorCode.INVALID_PRODUCER_EPOCH, -1, "fenced by a newer epoch of the transactional.id"
            if code != ErrorCode.NONE:
                return ErrorCode.INVALID_TXN_STATE if code == ErrorCode.INVALID_PRODUCER_ID_MAPPING else code, -1, \
                    f"the coordinator of {tid!r} does not hold {topic}-{partition} in the transaction"
        return p.append(batch)

    def Fetch(self, request: pb.FetchRequest, context: Context) -> Any:
        read_committed = request.isolation_level == READ_COMMITTED
        with self._lock:
            fault = self._faults.take(context.rpc, [TopicPartition(t.topic, fp.partition) for t in request.topics
                                                    for fp in t.partitions])

        def answer(expired: bool) -> pb.FetchResponse | None:
            with self._lock:
                topics, size = [], 0
                for t in request.topics:
                    parts = []
                    for fp in t.partitions:
                        if fault is not None and fault.covers(TopicPartition(t.topic, fp.partition)):
                            parts.append(pb.FetchPartitionResponse(partition=fp.partition, error_code=fault.error))
                            continue
                        parts.append(self._fetch_one(context, t.topic, fp, read_committed))
                        size += len(parts[-1].records)
                    topics.append(pb.FetchTopicResponse(topic=t.topic, partitions=parts))
                if size == 0 and size < max(request.min_bytes, 1) and not expired and request.max_wait_ms > 0 \
                        and all(p.error_code == ErrorCode.NONE for t in topics for p in t.partitions):
                    return None  # long poll: nothing yet
                return pb.FetchResponse(responses=topics)

        with self._lock:
            return self._wait(answer, request.max_wait_ms)

    def _fetch_one(self, context: Context, topic: str, fp: pb.FetchPartition,
                   read_committed: bool) -> pb.FetchPartitionResponse:
        code, p = self._leader_check(context, topic, fp.partition)
        if p is None:
            return pb.FetchPartitionResponse(partition=fp.partition, error_code=code)
        if not 0 <= fp.fetch_offset <= p.log_end:
            return pb.FetchPartitionResponse(partition=fp.partition, error_code=ErrorCode.OFFSET_OUT_OF_RANGE,
                                             high_watermark=p.log_end)
        data, aborted = p.read(fp.fetch_offset, fp.partition_max_bytes or (1 << 20), read_committed)
        return pb.FetchPartitionResponse(
            partition=fp.partition, high_watermark=p.log_end, last_stable_offset=p.last_stable_offset(),
            log_start_offset=0, records=data,
            aborted_transactions=[pb.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                                  for a in aborted])

    def ListOffsets(self, request: pb.ListOffsetsRequest, context: Context) -> pb.ListOffsetsResponse:
        out = []
        with self._lock:
            fault = self._faults.take(context.rpc, [TopicPartition(t.name, lp.partition) for t in request.topics
                                                    for lp in t.partitions])
            for t in request.topics:
                parts = []
                for lp in t.partitions:
                    code, p = self._leader_check(context, t.name, lp.partition)
                    if fault is not None and fault.covers(TopicPartition(t.name, lp.partition)):
                        code, p = fault.error, None
                    if p is None:
                        parts.append(pb.ListOffsetsPartitionResponse(partition=lp.partition, error_code=code))
                        continue
                    latest = p.last_stable_offset() if request.isolation_level == READ_COMMITTED else p.log_end
                    offset, timestamp = ({_EARLIEST: 0}.get(lp.timestamp, latest), -1) if lp.timestamp < 0 \
                        else p.offset_for_time(lp.timestamp)
                    parts.append(pb.ListOffsetsPartitionResponse(partition=lp.partition, offset=offset,
                                                                 timestamp=timestamp))
                out.append(pb.ListOffsetsTopicResponse(name=t.name, partitions=parts))
        return pb.ListOffsetsResponse(topics=out)

    # ------------------------------------------------------------ TransactionCoordinator

    def _now(self) -> int:
        """The coordinator's time (ms of the cluster's clock): transaction timestamps and timeouts."""
        return self.clock()

    def _apply(self, md: TransactionMetadata, transit: Any) -> None:
        """Append `transit` to the (in-memory) transaction log: complete it at once."""
        md.complete_transition(transit)

    def _abort_timed_out(self) -> None:
        """Abort, with an epoch bump, every ongoing transaction older than its
        transaction.timeout.ms, as the coordinator's scan does (design document
        "Coordinator-side Transaction Expiration"); never a prepared one (KIP-939)."""
        now = self._now()
        for md in self._txns.values():
            if md.state is TxnState.ONGOING and not md.is_prepared and \
                    0 <= md.txn_start_timestamp and md.txn_start_timestamp + md.txn_timeout_ms < now:
                md.prepare_fence_producer_epoch(now)
                self._end(md, md.prepare_abort_or_commit(TxnState.PREPARE_ABORT, now), committed=False)

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
                           context: Context) -> pb.AddPartitionsToTxnResponse:
        wanted = [TopicPartition(t.topic, p) for t in request.topics for p in t.partitions]
        with self._lock:
            fault = self._faults.take(context.rpc, wanted)
            if fault is not None and not fault.applied:
                return _topic_results({tp: fault.error if fault.covers(tp) else ErrorCode.OPERATION_NOT_ATTEMPTED
                                       for tp in wanted}, pb.AddPartitionsToTxnResponse, "results")
            if any(self._partition(*tp) is None for tp in wanted):
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif request.verify_only:
                codes = {tp: self._verify(request.transactional_id, request.producer_id, request.producer_epoch, tp)
                         for tp in wanted}
                return _topic_results(codes, pb.AddPartitionsToTxnResponse, "results")
            else:
                code = self._add_partitions(request.transactional_id, request.producer_id, request.producer_epoch,
                                            wanted)
            if fault is not None:
                return _topic_results({tp: fault.error if fault.covers(tp) else code for tp in wanted},
                                      pb.AddPartitionsToTxnResponse, "results")
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
                return self._end_txn_answer(md, request.committed)
            code, md = self._producer(request.transactional_id, request.producer_id, request.producer_epoch)
            if code != ErrorCode.NONE:
                return pb.EndTxnResponse(error_code=code)
            if md.state is not TxnState.ONGOING:
                return self._end_txn_answer(md, request.committed)
            target = TxnState.PREPARE_COMMIT if request.committed else TxnState.PREPARE_ABORT
            version2 = self.transaction_version >= 2
            self._end(md, md.prepare_abort_or_commit(target, self._now(), bump_epoch=version2,
                                                     transaction_version=self.transaction_version),
                      request.committed)
            return self._ended(md)

    def _end_txn_answer(self, md: TransactionMetadata, committed: bool) -> pb.EndTxnResponse:
        code = md.end_txn_outcome(committed)
        if code != ErrorCode.NONE:
            return pb.EndTxnResponse(error_code=code)
        return self._ended(md)

    def _ended(self, md: TransactionMetadata) -> pb.EndTxnResponse:
        """A successful EndTxn answer: with transaction version 2, the PID and epoch the
        producer goes on with (the next epoch); without, nothing."""
        if self.transaction_version < 2:
            return pb.EndTxnResponse()
        return pb.EndTxnResponse(producer_id=md.producer_id, producer_epoch=md.producer_epoch)

    def _end(self, md: TransactionMetadata, prepared: Any, committed: bool) -> None:
        """Apply the Prepare* transit, write every marker, complete the transaction."""
        self._apply(md, prepared)
        pid, epoch = prepared.marker_producer()
        for tp in sorted(prepared.partitions):
            if tp.topic == OFFSETS_TOPIC:
                self._offsets.complete_txn(pid, committed)
            else:
                self._log(*tp).write_marker(pid, epoch, committed, self.transaction_version)
        self._apply(md, md.prepare_complete(self._now()))
        self.completed_transactions.append(CompletedTransaction(md.transactional_id, pid, epoch, committed,
                                                                frozenset(prepared.partitions)))
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
        """Kafka's ListTransactions: state filters by listed state name ("PrepareTxn" for a
        prepared transaction), producer ids, and (KIP-994) a minimum age in ms."""
        names = list(request.state_filters)
        states, pids = listed_state_names(names), set(request.producer_id_filters)
        with self._lock:
            now = self._now()
            found = [TxnStateSummary.of(md) for md in self._txns.values()
                     if md.state is not TxnState.DEAD and (not pids or md.producer_id in pids)
                     and (request.duration_filter_ms <= 0 or
                          0 <= md.txn_start_timestamp <= now - request.duration_filter_ms)]
        return pb.ListTransactionsResponse(transaction_states=[
            pb.TransactionListing(transactional_id=s.transactional_id, producer_id=s.producer_id, state=s.state_name,
                                  producer_epoch=s.producer_epoch, transaction_start_time_ms=s.txn_start_timestamp,
                                  prepared=_prepared(s))
            for s in found if not names or s.state_name in states])

    def DescribeTransactions(self, request: pb.DescribeTransactionsRequest,
                             context: Context) -> pb.DescribeTransactionsResponse:
        """Kafka's DescribeTransactions: per id its state, epoch, timeout, start time and
        partitions, or TRANSACTIONAL_ID_NOT_FOUND."""
        out = []
        with self._lock:
            for tid in request.transactional_ids:
                fault = self._faults.take(context.rpc, [TopicPartition(tid, -1)])
                md = self._txns.get(tid)
                if fault is not None or md is None or md.state is TxnState.DEAD:
                    code = fault.error if fault is not None else ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
                    out.append(pb.TransactionDescription(error_code=code, transactional_id=tid))
                    continue
                s = TxnStateSummary.of(md)
                out.append(pb.TransactionDescription(
                    transactional_id=tid, state=s.state_name, transaction_timeout_ms=s.txn_timeout_ms,
                    transaction_start_time_ms=s.txn_start_timestamp, producer_id=s.producer_id,
                    producer_epoch=s.producer_epoch, topics=_topic_partitions(s.partitions),
                    prepared_time_ms=s.prepared_timestamp, prepared=_prepared(s)))
        return pb.DescribeTransactionsResponse(transaction_states=out)

    # ------------------------------------------------------------ GroupCoordinator

    def _group(self, group_id: str) -> GroupMetadata:
        group = self._groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            group = self._groups[group_id] = GroupMetadata(group_id, self.clock(), self.group_config)
        return group

    def _partition_counts(self) -> dict[str, int]:
        return {name: len(parts) for name, parts in self._topics.items()}

    def JoinGroup(self, request: pb.JoinGroupRequest, context: Context) -> Any:
        with self._lock:
            fault = self._faults.take(context.rpc)
            if fault is not None and not (fault.error == ErrorCode.MEMBER_ID_REQUIRED and not request.member_id):
                if fault.applied:
                    self._join(request)
                return pb.JoinGroupResponse(error_code=fault.error)
            group, outcome = self._join(request)
            if fault is not None:  # KIP-394: the new member is known; it joins again with its id
                return pb.JoinGroupResponse(error_code=fault.error, member_id=outcome.member_id)
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

    def _join(self, request: pb.JoinGroupRequest) -> tuple[GroupMetadata, Any]:
        group = self._group(request.group_id)
        return group, group.join(request.member_id, request.topics, request.session_timeout_ms,
                                 request.rebalance_timeout_ms, self.clock(), request.protocol_type,
                                 request.group_instance_id)

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

    def OffsetCommit(self, request: pb.OffsetCommitRequest, context: Context) -> pb.OffsetCommitResponse:
        with self._lock:
            code = validate_offset_commit(self._groups.get(request.group_id), request.member_id,
                                          request.generation_id, False, request.group_instance_id)
            return self._commit(context, request, code, lambda tp, p: self._offsets.apply_commit(
                request.group_id, tp, _offset(p), next(self._offset_log)), pb.OffsetCommitResponse)

    def TxnOffsetCommit(self, request: pb.TxnOffsetCommitRequest, context: Context) -> pb.TxnOffsetCommitResponse:
        with self._lock:
            code = validate_offset_commit(self._groups.get(request.group_id), request.member_id,
                                          request.generation_id, True, request.group_instance_id)
            if code == ErrorCode.NONE:
                # KIP-890: the producer's transaction must hold the group's offsets.
                code = self._verify(request.transactional_id, request.producer_id, request.producer_epoch,
                                    TopicPartition(OFFSETS_TOPIC, 0))
                if code == ErrorCode.INVALID_PRODUCER_EPOCH:
                    code = ErrorCode.PRODUCER_FENCED
            return self._commit(context, request, code, lambda tp, p: self._offsets.apply_txn_commit(
                request.producer_id, request.group_id, tp, _offset(p), next(self._offset_log)),
                pb.TxnOffsetCommitResponse)

    def _commit(self, context: Context, request: Any, code: ErrorCode,
                apply: Callable[[TopicPartition, pb.OffsetCommitPartition], None], response: type) -> Any:
        """Apply an (transactional) offset commit per partition when `code` allows it;
        the per-partition answer, or an injected error's."""
        commits = [(TopicPartition(t.name, p.partition), p) for t in request.topics for p in t.partitions]
        fault = self._faults.take(context.rpc, [tp for tp, _ in commits])
        codes = {}
        for tp, p in commits:
            injected = fault is not None and fault.covers(tp)
            codes[tp] = fault.error if injected else code
            if code == ErrorCode.NONE and (not injected or fault.applied):
                apply(tp, p)
        return _topic_results(codes, response, "topics")

    def OffsetFetch(self, request: pb.OffsetFetchRequest, context: Any) -> pb.OffsetFetchResponse:
        wanted = [TopicPartition(t.topic, p) for t in request.topics for p in t.partitions] or None
        with self._lock:
            fetched = self._offsets.fetch(request.group_id, wanted, request.require_stable)
        by_topic: dict[str, list[pb.OffsetFetchPartition]] = collections.defaultdict(list)
        for tp, f in fetched.items():
            by_topic[tp.topic].append(pb.OffsetFetchPartition(partition=tp.partition, committed_offset=f.offset,
                                                              metadata=f.metadata, error_code=f.error))
        unstable = any(f.error == ErrorCode.UNSTABLE_OFFSET_COMMIT for f in fetched.values())
        return pb.OffsetFetchResponse(error_code=ErrorCode.UNSTABLE_OFFSET_COMMIT if unstable else ErrorCode.NONE,
                                      topics=[pb.OffsetFetchTopic(name=t, partitions=ps) for t, ps in by_topic.items()])

    def _listed_groups(self) -> dict[str, tuple[str, str]]:
        """group id -> (state name, protocol type); a group with committed offsets but no
        membership (assign() users) is Empty."""
        out = {gid: (g.state.value, g.protocol_type) for gid, g in self._groups.items()
               if g.state is not GroupState.DEAD}
        for gid in self._offsets.groups():
            out.setdefault(gid, (GroupState.EMPTY.value, ""))
        return out

    def ListGroups(self, request: pb.ListGroupsRequest, context: Any) -> pb.ListGroupsResponse:
        """Kafka's ListGroups, optionally only the groups in `states_filter` (state names, any case)."""
        wanted = {s.lower() for s in request.states_filter}
        with self._lock:
            listed = sorted(self._listed_groups().items())
        return pb.ListGroupsResponse(groups=[pb.ListedGroup(group_id=gid, protocol_type=protocol, group_state=state)
                                             for gid, (state, protocol) in listed
                                             if not wanted or state.lower() in wanted])

    def DescribeGroups(self, request: pb.DescribeGroupsRequest, context: Context) -> pb.DescribeGroupsResponse:
        """Kafka's DescribeGroups: state, generation, protocol and members (id, instance
        id, subscription, assignment); an unknown group is "Dead"."""
        out = []
        with self._lock:
            for gid in request.groups:
                fault = self._faults.take(context.rpc, [TopicPartition(gid, -1)])
                group = self._groups.get(gid)
                if fault is not None:
                    out.append(pb.DescribedGroup(error_code=fault.error, group_id=gid))
                elif group is None or group.state is GroupState.DEAD:
                    state = GroupState.EMPTY if gid in self._offsets.groups() else GroupState.DEAD
                    out.append(pb.DescribedGroup(group_id=gid, group_state=state.value))
                else:
                    out.append(pb.DescribedGroup(
                        group_id=gid, group_state=group.state.value, protocol_type=group.protocol_type,
                        protocol_name=group.protocol_name, generation_id=group.generation, leader=group.leader,
                        members=[pb.DescribedGroupMember(
                            member_id=m.member_id, group_instance_id=m.group_instance_id, subscription=list(m.topics),
                            assignment=[pb.TopicPartitions(topic=t, partitions=list(ps))
                                        for t, ps in sorted(m.assignment.items())])
                            for m in sorted(group.members.values(), key=lambda m: m.member_id)]))
        return pb.DescribeGroupsResponse(groups=out)

    def DeleteGroups(self, request: pb.DeleteGroupsRequest, context: Context) -> pb.DeleteGroupsResponse:
        """Kafka's DeleteGroups: a group without members loses its committed offsets and
        metadata; GROUP_ID_NOT_FOUND (no membership, no offsets), NON_EMPTY_GROUP."""
        out = []
        with self._lock:
            for gid in request.groups_names:
                fault = self._faults.take(context.rpc, [TopicPartition(gid, -1)])
                code = fault.error if fault is not None and not fault.applied else self._delete_group(gid)
                out.append(pb.DeletableGroupResult(group_id=gid, error_code=fault.error if fault else code))
        return pb.DeleteGroupsResponse(results=out)

    def _delete_group(self, gid: str) -> ErrorCode:
        group = self._groups.get(gid)
        if group is not None and group.state is GroupState.DEAD:
            group = None
        partitions = self._offsets.committed_partitions(gid)
        if group is None and not partitions:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group is not None and not group.is_(GroupState.EMPTY):
            return ErrorCode.NON_EMPTY_GROUP
        for tp in partitions:
            self._offsets.apply_commit(gid, tp, None, next(self._offset_log))
        if group is not None:
            del self._groups[gid]
            group.mark_dead(self.clock())
        return ErrorCode.NONE


def _prepared(s: TxnStateSummary) -> pb.PreparedTransaction | None:
    """The PreparedTransaction of a listed or described transaction; None when not prepared."""
    if s.prepared_producer is None:
        return None
    pid, epoch = s.prepared_producer
    return pb.PreparedTransaction(prepared_time_ms=s.prepared_timestamp, producer_id=pid, producer_epoch=epoch)


def _topic_partitions(partitions: Iterable[TopicPartition]) -> list[pb.TopicPartitions]:
    by_topic: dict[str, list[int]] = collections.defaultdict(list)
    for tp in sorted(partitions):
        by_topic[tp.topic].append(tp.partition)
    return [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]


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


__all__ = ["MockCluster", "Request", "CompletedTransaction", "BOOTSTRAP", "TXN_COORDINATOR", "GROUP_COORDINATOR"]
