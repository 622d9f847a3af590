"""Connection, metadata and coordinator plumbing shared by the SDK clients.

`ClientCore` owns one gRPC channel per service address, a cached cluster
metadata view, a coordinator cache, and the one place where transport errors
(`grpc.RpcError`) become SDK errors (`errors.ExactlyError`), so users never see
gRPC or protobuf types (docs/design.md, "Code conventions"). Every service answers the Cluster RPCs
(Metadata, CreateTopics, FindCoordinator), so any address bootstraps the client
(docs/design.md, "Architecture").
"""
from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import contextvars
import itertools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterable, Protocol, TypeVar

import grpc
import tenacity

from . import _fork, _link, _streams, _transport_check, errors
from .config import ClientSchema
from exactly_wire import keepalive
from exactly_wire.clock import SYSTEM_CLOCK, MonotonicClock, monotonic_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.security import TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")

# FindCoordinator key types (FindCoordinatorRequest.key_type).
COORDINATOR_GROUP = 0
COORDINATOR_TRANSACTION = 1
# KIP-447 draft: the transaction coordinator of a consumer group (group-aware producers).
COORDINATOR_TRANSACTION_GROUP = 2


class Transport(Protocol):
    """Where a client's calls go instead of gRPC over the network: a client core takes
    its channels from it (`exactly.testing.MockCluster` answers them in the process, as
    httpx's MockTransport does). `channel(address)` gives a grpc.Channel for the
    synchronous clients, `aio_channel(address)` a grpc.aio.Channel for `exactly.aio`."""

    def channel(self, address: str) -> Any: ...

    def aio_channel(self, address: str) -> Any: ...


# An RPC as a value: `rpc(core, address)` is the stub method (e.g.
# `core.group_stub(address).OffsetFetch`) that carries a request to the service at
# `address`. Calls name their RPC in code this way, never by a string.
Rpc = Callable[["CoreBase", str], Callable[..., Any]]


@dataclass(frozen=True)
class TransportCheck:
    """Effect of `CoreBase._metadata_flow`: probe `address` with plain sockets and
    return why the transport fails (`exactly._transport_check`), or None."""

    address: str


def txn_coordinator_key(transactional_id: str, group_id: str | None) -> tuple[str, int]:
    """FindCoordinator (key, key type) of a transactional producer: its consumer group
    with type 2 when it is group-aware (KIP-447 draft), else its transactional.id."""
    return (group_id, COORDINATOR_TRANSACTION_GROUP) if group_id else (transactional_id, COORDINATOR_TRANSACTION)

_MAX_MESSAGE_BYTES = 128 * 1024 * 1024

# Transport status -> SDK error class. UNAVAILABLE / DEADLINE_EXCEEDED / CANCELLED are
# retriable: the request may succeed on another try (after a metadata refresh).
_ERROR_BY_STATUS: dict[grpc.StatusCode, type[errors.ExactlyError]] = {
    grpc.StatusCode.UNAVAILABLE: errors.NetworkException,
    grpc.StatusCode.CANCELLED: errors.NetworkException,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.RequestTimedOutError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.MessageTooLargeError,
    grpc.StatusCode.UNIMPLEMENTED: errors.UnsupportedVersionError,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidRequestError,
}

# Errors after which the cached metadata (leaders) is probably stale.
METADATA_ERRORS = frozenset({
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.BROKER_NOT_AVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.REPLICA_NOT_AVAILABLE,
    # Kafka's KafkaStorageException is an InvalidMetadataException: the replica's log
    # directory is offline (KIP-112) and leadership is moving to another replica.
    ErrorCode.KAFKA_STORAGE_ERROR,
})

# Errors after which the cached coordinator address must be looked up again.
COORDINATOR_ERRORS = frozenset({
    ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT,
})


def translate_rpc_error(exc: grpc.RpcError) -> errors.ExactlyError:
    """Map a gRPC transport failure to an SDK error (the seam of docs/design.md, "Code conventions")."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else None
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED) and details:
        # The services name the Kafka error first: "TOPIC_AUTHORIZATION_FAILED: ..."
        name = details.split(":", 1)[0]
        if name in ErrorCode.__members__:
            return errors.for_code(ErrorCode[name], details)
    cls = _ERROR_BY_STATUS.get(code, errors.UnknownServerError)
    name = code.name if code is not None else "UNKNOWN"
    return cls(f"{name}: {details}" if details else name)


# The deadline of the public call this thread or task is inside, with the clock it is
# on (`clock.now_s()` seconds): every retry and every blocking RPC under it gets the
# remaining time, never a fresh request.timeout.ms (docs/sdk.md,
# "Timeouts: what each one bounds").
_call_deadline: contextvars.ContextVar[tuple[float, MonotonicClock] | None] = contextvars.ContextVar(
    "exactly_call_deadline", default=None)


@contextlib.contextmanager
def call_deadline(timeout_s: float | None,
                  clock: MonotonicClock = SYSTEM_CLOCK) -> Generator[float | None, None, None]:
    """Bound every retry and blocking RPC inside the block to `timeout_s` seconds from
    now on `clock` (the client core's), or to the enclosing block's deadline when that
    ends first. `None` lifts any bound (for application callbacks, which make public
    calls with bounds of their own). Yields the deadline (`clock.now_s()` seconds) or None."""
    if timeout_s is None:
        bound = None
    else:
        bound = (clock.now_s() + max(timeout_s, 0.0), clock)
        outer = _call_deadline.get()
        if outer is not None and outer[0] < bound[0]:
            bound = outer
    token = _call_deadline.set(bound)
    try:
        yield None if bound is None else bound[0]
    finally:
        _call_deadline.reset(token)


def bounded_s(timeout_s: float) -> float:
    """`timeout_s` cut to what is left of the enclosing `call_deadline` (seconds, >= 0)."""
    bound = _call_deadline.get()
    return timeout_s if bound is None else max(min(timeout_s, bound[0] - bound[1].now_s()), 0.0)


def remaining_s(timeout_s: float) -> float:
    """`timeout_s`, cut to what is left of the enclosing `call_deadline` (seconds).
    Raises errors.RequestTimedOutError (retriable) when nothing is left."""
    bound = _call_deadline.get()
    if bound is None:
        return timeout_s
    left = bound[0] - bound[1].now_s()
    if left <= 0:
        exc = errors.RequestTimedOutError("the call's deadline passed before the request was sent")
        exc.unsent = True  # no outcome of its own: see `outcome_of_retries`
        raise exc
    return min(timeout_s, left)


def outcome_of_retries(last: BaseException, retried: list[BaseException]) -> BaseException:
    """The error a retry loop ends with: `last`, unless `last` only says that the
    call's deadline passed before its request was sent (`remaining_s`); then the
    error of the try before it (`retried[-1]`), which tells what went wrong
    (e.g. errors.UnknownTopicOrPartitionError for a topic still unknown at max.block.ms)."""
    if getattr(last, "unsent", False) and retried:
        return retried[-1]
    return last


def stop_before_deadline(clock: MonotonicClock, timeout_s: float) -> Callable[[tenacity.RetryCallState], bool]:
    """A tenacity `stop`: tenacity's stop_before_delay(`timeout_s`) on `clock` (the
    client's) instead of the real clock: stop when the next try would start `timeout_s`
    seconds or more after now (now: when the retry loop is set up)."""
    deadline = clock.now_s() + timeout_s

    def _stop(state: tenacity.RetryCallState) -> bool:
        return clock.now_s() + (state.upcoming_sleep or 0.0) >= deadline
    return _stop


def is_retriable(exc: BaseException) -> bool:
    return isinstance(exc, errors.ExactlyError) and exc.retriable


@dataclass(frozen=True)
class NodeMetadata:
    node_id: str
    role: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class PartitionMetadata:
    partition: int
    error_code: int
    leader_id: str | None
    leader_epoch: int
    replicas: tuple[str, ...]
    isr: tuple[str, ...]


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    error_code: int
    is_internal: bool
    partitions: dict[int, PartitionMetadata]


@dataclass(frozen=True)
class Metadata:
    """An immutable snapshot of the cluster: live nodes and topics."""

    nodes: dict[str, NodeMetadata]
    topics: dict[str, TopicMetadata]
    fetched_at: int = field(default_factory=monotonic_ms)  # monotonic ms (exactly_wire.clock)
    # The cluster's finalized transaction version (Kafka's `transaction.version`): 2 =
    # partition leaders add a producer's partitions to its transaction (KIP-890 part 2).
    transaction_version: int = 0

    @classmethod
    def from_response(cls, resp: pb.MetadataResponse, fetched_at: int | None = None) -> "Metadata":
        nodes = {n.node_id: NodeMetadata(n.node_id, n.role, n.host, n.port) for n in resp.nodes}
        topics = {}
        for t in resp.topics:
            parts = {p.partition: PartitionMetadata(p.partition, p.error_code, p.leader_id or None,
                                                    p.leader_epoch, tuple(p.replicas), tuple(p.isr))
                     for p in t.partitions}
            topics[t.name] = TopicMetadata(t.name, t.error_code, t.is_internal, parts)
        if fetched_at is None:
            return cls(nodes, topics, transaction_version=resp.transaction_version)
        return cls(nodes, topics, fetched_at, resp.transaction_version)

    def has_topic(self, topic: str) -> bool:
        t = self.topics.get(topic)
        return t is not None and t.error_code == ErrorCode.NONE and bool(t.partitions)

    def listed(self) -> set[str]:
        """Names of the topics this metadata lists (answered without an error)."""
        return {name for name, t in self.topics.items() if t.error_code == ErrorCode.NONE}

    def partitions(self, topic: str) -> list[int]:
        """Sorted partition ids of `topic`; [] when the topic is unknown."""
        t = self.topics.get(topic)
        if t is None or t.error_code != ErrorCode.NONE:
            return []
        return sorted(t.partitions)

    def leader(self, topic: str, partition: int) -> str | None:
        """'host:port' of the partition's leader, or None (unknown topic/partition,
        no leader elected, or leader not live)."""
        t = self.topics.get(topic)
        if t is None:
            return None
        p = t.partitions.get(partition)
        if p is None or p.leader_id is None:
            return None
        node = self.nodes.get(p.leader_id)
        return node.address if node is not None else None

    def addresses(self) -> list[str]:
        return sorted({n.address for n in self.nodes.values()})


def channel_options(settings: ClientSchema) -> list[tuple[str, Any]]:
    """gRPC channel options of every SDK channel (sync and asyncio): large messages,
    fast reconnects after a service restart (the gRPC default backs off to 120 s;
    from retry.backoff.ms up to retry.backoff.max.ms), no transparent retries (the SDK
    decides what to retry), `client.id` as the user agent, and the keepalive the services
    accept (exactly_wire.keepalive: a ping after 10 s without reads while a call is open)."""
    retry_backoff_ms, retry_backoff_max_ms = settings.retry_backoff_ms, settings.retry_backoff_max_ms
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.initial_reconnect_backoff_ms", max(retry_backoff_ms, 50)),
        ("grpc.min_reconnect_backoff_ms", max(retry_backoff_ms, 50)),
        ("grpc.max_reconnect_backoff_ms", max(retry_backoff_max_ms, 100)),
        ("grpc.enable_retries", 0),
        *keepalive.channel_options(),
    ]
    if settings.client_id:
        options.append(("grpc.primary_user_agent", f"exactly/{settings.client_id}"))
    return options


def no_metadata_yet(refresh: Any) -> errors.NetworkException:
    """The error of a call that needs metadata before any arrived (retriable), naming why
    the last refresh failed (`refresh`: its finished future or task, or None)."""
    failed = refresh.exception() if refresh is not None and refresh.done() and not refresh.cancelled() else None
    return errors.NetworkException(f"no cluster metadata yet: {failed}" if failed else "no cluster metadata yet")


# A cancelled request future (concurrent.futures or asyncio: distinct classes since
# Python 3.8), for code shared by the synchronous and the asyncio clients.
CANCELLED = (concurrent.futures.CancelledError, asyncio.CancelledError)


def run_flow(flow: Generator[Any, Any, T], perform: Callable[[Any], Any]) -> T:
    """Drive a flow synchronously: a generator that yields I/O effects (requests,
    waits) and receives their outcomes, so the rules between the I/O steps exist
    once for the synchronous clients and `exactly.aio`. `perform(effect)` returns
    the outcome sent back into the flow, or raises the exception thrown into it.
    Returns the flow's return value."""
    try:
        effect = next(flow)
        while True:
            try:
                outcome = perform(effect)
            except BaseException as exc:  # noqa: BLE001 - the flow decides
                effect = flow.throw(exc)
            else:
                effect = flow.send(outcome)
    except StopIteration as stop:
        return stop.value


class CoreBase(abc.ABC):
    """The I/O-free part of a client core, shared by `ClientCore` (blocking gRPC)
    and `exactly.aio`'s core (grpc.aio): settings, the metadata and coordinator
    caches, address rotation, and what a failed try invalidates.

    `settings`: the client's parsed settings (`exactly.config.ClientSchema`: a
    ProducerSchema, ConsumerSchema or AdminSchema from `exactly_wire.config.parse`,
    which holds every key's default): bootstrap.servers, request.timeout.ms,
    retry.backoff.ms, retry.backoff.max.ms, metadata.max.age.ms, client.id and the
    security keys. `clock`: the monotonic clock of this
    client and of everything it owns (`exactly_wire.clock.MonotonicClock`; the real
    one by default): metadata age, call deadlines, retry backoff. `transport`: where
    the calls go instead of gRPC over the network (`Transport`; None: the network).
    Raises errors.ConfigurationError for security settings that do not go together
    (unreadable files, TLS without a CA, SASL without credentials).
    """

    def __init__(self, settings: ClientSchema, clock: MonotonicClock = SYSTEM_CLOCK,
                 transport: Transport | None = None):
        self.clock = clock
        self.transport = transport
        self.settings = settings
        self.bootstrap = settings.bootstrap_addresses
        # Whether a Metadata request naming a topic that does not exist asks the services
        # to create it (MetadataRequest.allow_auto_topic_creation): producers only, as
        # Kafka's producer (the services decide: auto.create.topics.enable).
        self.allow_auto_create_topics = False
        # TLS material and SASL credentials (raises errors.ConfigurationError naming the key).
        self.security = TransportSecurity.from_settings(settings, errors.ConfigurationError)
        self._lock = threading.RLock()
        self._channels: dict[str, Any] = {}
        self._stubs: dict[tuple[type, str], Any] = {}
        self._metadata: Metadata | None = None
        self._coordinators: dict[tuple[int, str], str] = {}
        self._rr = itertools.count()
        self._closed = False
        self._transport_checked = False  # see _metadata_flow
        self.created_in_pid = os.getpid()  # a forked child must not use this client (_fork)

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    def cached_metadata(self) -> Metadata | None:
        """The metadata last fetched, without any request (None before the first)."""
        return self._metadata

    @property
    def request_timeout_s(self) -> float:
        return self.settings.request_timeout_ms / 1000.0

    @abc.abstractmethod
    def _new_channel(self, address: str) -> Any:
        """A channel to `address` (blocking gRPC in ClientCore, grpc.aio in exactly.aio)."""

    def channel(self, address: str) -> Any:
        _fork.check_process(self.created_in_pid, "client")
        with self._lock:
            if self._closed:
                raise errors.IllegalStateError("client is closed")
            ch = self._channels.get(address)
            if ch is None:
                ch = self._new_channel(address)
                self._channels[address] = ch
            return ch

    def _stub(self, cls: type, address: str):
        with self._lock:
            stub = self._stubs.get((cls, address))
            if stub is None:
                stub = cls(self._stub_channel(address))
                self._stubs[(cls, address)] = stub
            return stub

    def _stub_channel(self, address: str) -> Any:
        """What the stubs of `address` are made on: its channel."""
        return self.channel(address)

    def cluster_stub(self, address: str | None = None) -> pb_grpc.ClusterStub:
        """Cluster service stub at `address`, or at the next known address in turn."""
        return self._stub(pb_grpc.ClusterStub, address or self._next_address())

    def leader_stub(self, address: str) -> pb_grpc.PartitionLeaderStub:
        return self._stub(pb_grpc.PartitionLeaderStub, address)

    def txn_stub(self, address: str) -> pb_grpc.TransactionCoordinatorStub:
        return self._stub(pb_grpc.TransactionCoordinatorStub, address)

    def group_stub(self, address: str) -> pb_grpc.GroupCoordinatorStub:
        return self._stub(pb_grpc.GroupCoordinatorStub, address)

    def _known_addresses(self) -> list[str]:
        md = self._metadata
        known = md.addresses() if md is not None else []
        return known + [a for a in self.bootstrap if a not in known]

    def _next_address(self) -> str:
        addrs = self._known_addresses()
        return addrs[next(self._rr) % len(addrs)]

    def _metadata_flow(self) -> Generator[Any, Any, Metadata]:
        """Fetch metadata, asking the known addresses in turn until one answers:
        yields (stub method, request) pairs for `call`; raises the last retriable
        error when none answers, a non-retriable one at once. When no metadata was ever
        fetched and the failure points at the transport ("Socket closed", a TLS
        handshake), it yields a `TransportCheck` of the first address once per client
        (`exactly._transport_check`) and raises errors.ConnectionSetupError saying what
        the service expected, if that is the cause."""
        last: errors.ExactlyError | None = None
        addrs = self._known_addresses()
        start = next(self._rr)
        for i in range(len(addrs)):
            try:
                resp = yield self.cluster_stub(addrs[(start + i) % len(addrs)]).Metadata, pb.MetadataRequest()
                return Metadata.from_response(resp, self.clock())
            except errors.ExactlyError as exc:
                if not exc.retriable:
                    raise
                last = exc
        assert last is not None
        if self._metadata is None and not self._transport_checked and isinstance(last, errors.NetworkException) \
                and _transport_check.suspect(str(last)):
            self._transport_checked = True
            address = addrs[start % len(addrs)]
            why = yield TransportCheck(address)
            if why:
                raise errors.ConnectionSetupError(f"{last}: {why}") from last
        raise last

    def _retry_policy(self, timeout_s: float | None, on_retry: Callable[[BaseException], None] | None,
                      retried: list[BaseException] | None = None) -> dict[str, Any]:
        """tenacity arguments of `retry` (sync and asyncio): retriable errors are
        retried with retry.backoff.ms doubling up to retry.backoff.max.ms (with
        jitter) for `timeout_s` (default request.timeout.ms, cut to the enclosing
        `call_deadline`); between tries metadata is refreshed after leader/network
        errors and cached coordinators are dropped after coordinator errors, then
        `on_retry(exc)` is called; each retried error is appended to `retried`."""
        timeout = self.retry_timeout_s(timeout_s)

        def _before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception()
            log.debug("retrying after %r (attempt %d)", exc, state.attempt_number)
            if isinstance(exc, errors.ExactlyError):
                if exc.code in METADATA_ERRORS:
                    self._invalidate_metadata()
                if exc.code in COORDINATOR_ERRORS:
                    self._invalidate_all_coordinators_if_network(exc)
            if retried is not None:
                retried.append(exc)
            if on_retry is not None:
                on_retry(exc)

        return dict(
            retry=tenacity.retry_if_exception(is_retriable),
            wait=tenacity.wait_exponential(multiplier=self.settings.retry_backoff_ms / 1000.0,
                                           max=self.settings.retry_backoff_max_ms / 1000.0)
            + tenacity.wait_random(0, self.settings.retry_backoff_ms / 1000.0 / 5),
            stop=stop_before_deadline(self.clock, timeout),
            before_sleep=_before_sleep,
            reraise=True,
        )

    def retry_timeout_s(self, timeout_s: float | None) -> float:
        """Seconds a retry loop may take: `timeout_s` (default request.timeout.ms),
        cut to what is left of the enclosing `call_deadline` (0 when nothing is)."""
        return bounded_s(self.request_timeout_s if timeout_s is None else timeout_s)

    def _invalidate_metadata(self) -> None:
        md = self._metadata
        if md is not None:
            # Keep the node list for bootstrapping; force the next read to refetch.
            self._metadata = Metadata(md.nodes, md.topics, fetched_at=-(1 << 62),
                                      transaction_version=md.transaction_version)

    def _fresh(self, md: Metadata, topics: Iterable[str] | None) -> bool:
        if self.clock() - md.fetched_at > self.settings.metadata_max_age_ms:
            return False
        return topics is None or all(md.has_topic(t) for t in topics)

    @staticmethod
    def _leader_in(md: Metadata, topic: str, partition: int) -> str:
        """Leader address of a partition in `md`; raises errors.UnknownTopicOrPartitionError
        or errors.LeaderNotAvailableError (both retriable)."""
        addr = md.leader(topic, partition)
        if addr is None:
            if partition not in md.partitions(topic):
                raise errors.UnknownTopicOrPartitionError(f"unknown partition {topic}-{partition}")
            raise errors.LeaderNotAvailableError(f"no leader for {topic}-{partition}")
        return addr

    def check_transport(self, address: str) -> str | None:
        """Why connections to `address` fail at the transport with this client's security
        settings, or None (blocking: a few plain-socket connections, each bounded by
        request.timeout.ms, at most 5 s)."""
        facts = _transport_check.probe(address, self.security, min(self.request_timeout_s, 5.0))
        return _transport_check.explain(facts, self.security, address)

    def named_request(self, topic: str) -> pb.MetadataRequest:
        """A Metadata request naming `topic`, allowing its creation when this client is a
        producer (`allow_auto_create_topics`; the services' auto.create.topics.enable)."""
        return pb.MetadataRequest(topics=[topic], allow_auto_topic_creation=self.allow_auto_create_topics)

    @staticmethod
    def named_topic_error(topic: str, named: pb.MetadataResponse) -> None:
        """Raise what a Metadata answer naming `topic` says of a topic the listings do not
        show: errors.TopicAuthorizationFailedError (listings leave out the topics the
        principal may not Describe), errors.LeaderNotAvailableError (retriable: the service
        just created it, auto.create.topics.enable), or another error of the topic's;
        nothing when it is merely unknown."""
        for t in named.topics:
            if t.name != topic or t.error_code in (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
                continue
            if t.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                raise errors.TopicAuthorizationFailedError(f"not authorized to access topic {topic!r}")
            if t.error_code == ErrorCode.LEADER_NOT_AVAILABLE:
                raise errors.LeaderNotAvailableError(f"topic {topic!r} was created (auto.create.topics.enable) "
                                                     "and has no leader yet")
            errors.check(t.error_code, f"topic {topic!r}")

    @staticmethod
    def _require_partitions(topic: str, parts: list[int]) -> list[int]:
        if not parts:
            raise errors.UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        return parts

    @staticmethod
    def _coordinator_address(key: str, resp: pb.FindCoordinatorResponse) -> str:
        """'host:port' from a FindCoordinator answer; raises its error, or
        errors.CoordinatorNotAvailableError when no coordinator was named."""
        errors.check(resp.error_code, resp.error_message or None)
        if not resp.host:
            raise errors.CoordinatorNotAvailableError(f"no coordinator for {key!r}")
        return f"{resp.host}:{resp.port}"

    def cached_coordinator(self, key: str, key_type: int) -> str | None:
        with self._lock:
            return self._coordinators.get((key_type, key))

    def _cache_coordinator(self, key: str, key_type: int, address: str) -> None:
        with self._lock:
            self._coordinators[(key_type, key)] = address

    def invalidate_coordinator(self, key: str, key_type: int) -> None:
        with self._lock:
            self._coordinators.pop((key_type, key), None)

    def _invalidate_all_coordinators_if_network(self, exc: errors.ExactlyError) -> None:
        # A dead process takes all coordinators it hosted with it.
        if exc.code in (ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT):
            with self._lock:
                self._coordinators.clear()

    @staticmethod
    def _coordinator_outcome(resp: Any, error_code: Callable[[Any], int]) -> Any:
        """The response of a coordinator request, or its error raised."""
        errors.check(error_code(resp), getattr(resp, "error_message", None) or None)
        return resp

    def _take_channels(self) -> list[Any]:
        """Mark closed and hand over the channels to close (empty when already closed)."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
            return channels


class ClientCore(CoreBase):
    """Channels, metadata and coordinators for one SDK client instance (blocking
    gRPC). Settings: see `CoreBase`. Thread-safe.
    """

    def __init__(self, settings: ClientSchema, clock: MonotonicClock = SYSTEM_CLOCK,
                 transport: Transport | None = None):
        super().__init__(settings, clock, transport)
        self._metadata_lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._refresh: concurrent.futures.Future | None = None
        self._streaming: dict[str, _streams.StreamingChannel] = {}

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future:
        """Run `fn(*args)` on this client's background thread (made on first use):
        blocking work (a metadata refresh, a coordinator lookup) that a caller must
        not wait for. Returns its future. Raises errors.IllegalStateError when closed."""
        with self._lock:
            if self._closed:
                raise errors.IllegalStateError("client is closed")
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="exactly-background")
            return self._executor.submit(fn, *args)

    # ------------------------------------------------------------ channels

    def _new_channel(self, address: str) -> grpc.Channel:
        if self.transport is not None:
            return self.transport.channel(address)
        if _fork.grpcio_unusable():
            return _fork.PureChannel(address, self.security)
        return _fork.note_grpcio_channel(secure_channel(address, self.security, channel_options(self.settings)))

    def _stub_channel(self, address: str) -> Any:
        """The channel of `address` with the transaction path's methods on its
        Client/Calls stream (exactly._streams), where a grpcio channel carries them:
        not through a custom transport, the pure-Python channel of a forked child, or
        SASL (whose token the stream would have to renew: those calls stay direct)."""
        channel = self.channel(address)
        if self.transport is not None or self.security.sasl is not None or isinstance(channel, _fork.PureChannel):
            return channel
        with self._lock:
            streaming = self._streaming.get(address)
            if streaming is None:
                link = _link.Connector(channel, address, self.security, keepalive_s=keepalive.KEEPALIVE_TIME_MS / 1000)
                streaming = self._streaming[address] = _streams.StreamingChannel(
                    channel, _streams.CallStream(channel, link))
            return streaming

    # ------------------------------------------------------------ calls

    def call(self, method: Callable, request: Any, timeout_s: float | None = None) -> Any:
        """Invoke a unary stub method (e.g. `core.txn_stub(a).EndTxn`) and return the
        response. Transport failures raise `errors.NetworkException` (UNAVAILABLE,
        CANCELLED) or `errors.RequestTimedOutError` (DEADLINE_EXCEEDED), both
        retriable, or another `errors.ExactlyError`. `timeout_s` defaults to
        request.timeout.ms, cut to what is left of the enclosing `call_deadline`."""
        timeout = remaining_s(self.request_timeout_s if timeout_s is None else timeout_s)
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc) from None

    def call_future(self, method: Callable, request: Any,
                    timeout_s: float | None = None) -> concurrent.futures.Future:
        """Like `call` but non-blocking: returns a concurrent.futures.Future that
        resolves to the response or fails with the translated SDK error. Used to
        pipeline requests to several partition leaders. Cancelling the returned
        future cancels the RPC."""
        out: concurrent.futures.Future = concurrent.futures.Future()
        try:
            fut = method.future(request, timeout=self.request_timeout_s if timeout_s is None else timeout_s)
        except grpc.RpcError as exc:
            out.set_exception(translate_rpc_error(exc))
            return out
        except ValueError as exc:  # channel closed
            out.set_exception(errors.NetworkException(str(exc)))
            return out

        def _done(f) -> None:
            if out.done():
                return  # the caller cancelled it
            try:
                result, exc = f.result(), None
            except grpc.RpcError as rpc_exc:
                result, exc = None, translate_rpc_error(rpc_exc)
            except grpc.FutureCancelledError:
                result, exc = None, errors.NetworkException("request cancelled")
            except BaseException as other:  # noqa: BLE001 - surfaced to the waiter
                result, exc = None, other
            try:
                if exc is None:
                    out.set_result(result)
                else:
                    out.set_exception(exc)
            except concurrent.futures.InvalidStateError:
                pass  # cancelled meanwhile

        def _cancelled(o: concurrent.futures.Future) -> None:
            if o.cancelled():
                fut.cancel()

        out.add_done_callback(_cancelled)
        fut.add_done_callback(_done)
        return out

    def retry(self, fn: Callable[[], T], timeout_s: float | None = None,
              on_retry: Callable[[BaseException], None] | None = None) -> T:
        """Run `fn()` until it returns, retrying retriable `errors.ExactlyError`s with
        exponential backoff (retry.backoff.ms doubling up to retry.backoff.max.ms,
        with jitter) for at most `timeout_s` (default request.timeout.ms). Between
        tries, metadata is refreshed after leader/network errors, cached coordinators
        are dropped after coordinator errors, then `on_retry(exc)` is called.
        Non-retriable errors and the last retriable one propagate (the one before it
        when the last try found the deadline passed before sending: `outcome_of_retries`).
        Every try, and every retry inside it, ends by this loop's deadline; backoff sleeps
        and the deadline are on this core's `clock`."""
        timeout = self.retry_timeout_s(timeout_s)
        retried: list[BaseException] = []
        with call_deadline(timeout, self.clock):
            try:
                return tenacity.Retrying(sleep=self.clock.sleep,
                                         **self._retry_policy(timeout, on_retry, retried))(fn)
            except errors.RequestTimedOutError as exc:
                raise outcome_of_retries(exc, retried) from None

    # ------------------------------------------------------------ metadata

    def _fetch_metadata(self) -> Metadata:
        return run_flow(self._metadata_flow(), self._perform_metadata)

    def _perform_metadata(self, effect: Any) -> Any:
        if isinstance(effect, TransportCheck):
            return self.check_transport(effect.address)
        return self.call(*effect)

    def metadata(self, topics: Iterable[str] | None = None, refresh: bool = False) -> Metadata:
        """The cached cluster metadata, fetched again when `refresh`, older than
        metadata.max.age.ms, or missing one of `topics`. Fetching asks the known
        addresses in turn; raises `errors.NetworkException` if none answers."""
        md = self._metadata
        if not refresh and md is not None and self._fresh(md, topics):
            return md
        with self._metadata_lock:
            cur = self._metadata
            if cur is not md and cur is not None and self._fresh(cur, topics):
                return cur  # another thread refreshed meanwhile
            self._metadata = self._fetch_metadata()
            return self._metadata

    def metadata_nowait(self, topics: Iterable[str] | None = None, refresh: bool = False) -> Metadata:
        """The cached metadata without waiting (as `exactly.aio`'s `metadata()`): when
        `refresh`, stale or missing one of `topics`, a refresh starts on the background
        thread and the cached view is returned meanwhile. Raises
        errors.NetworkException (retriable) before the first metadata arrived."""
        md = self._metadata
        if not refresh and md is not None and self._fresh(md, topics):
            return md
        with self._lock:
            previous = self._refresh
            if not self._closed and (previous is None or previous.done()):
                self._refresh = self.submit(self.metadata, None, True)
        if md is None:
            raise no_metadata_yet(previous)
        return md

    def pending_refresh(self) -> concurrent.futures.Future | None:
        """The background metadata refresh in progress, if any (a waiter may wake on it)."""
        f = self._refresh
        return f if f is not None and not f.done() else None

    def partitions_for(self, topic: str) -> list[int]:
        """Sorted partition ids of `topic`. Raises errors.UnknownTopicOrPartitionError
        when the topic is still unknown after a metadata refresh (and a request naming
        it: see `named_topic_error`)."""
        parts = self.metadata([topic]).partitions(topic)
        if not parts:
            parts = self.metadata(refresh=True).partitions(topic)
        if not parts:
            self.named_topic_error(topic, self.call(self.cluster_stub().Metadata, self.named_request(topic)))
        return self._require_partitions(topic, parts)

    def leader_for(self, topic: str, partition: int) -> str:
        """'host:port' of the partition's leader, refreshing metadata once if unknown.
        Raises errors.UnknownTopicOrPartitionError (no such topic/partition) or
        errors.LeaderNotAvailableError (no live leader); both retriable."""
        md = self.metadata([topic])
        if md.leader(topic, partition) is None:
            md = self.metadata(refresh=True)
        if not md.partitions(topic):
            self.named_topic_error(topic, self.call(self.cluster_stub().Metadata, self.named_request(topic)))
        return self._leader_in(md, topic, partition)

    # ------------------------------------------------------------ coordinators

    def find_coordinator(self, key: str, key_type: int, timeout_s: float | None = None) -> str:
        """'host:port' of the coordinator for `key` (key_type: COORDINATOR_GROUP=0,
        COORDINATOR_TRANSACTION=1), cached until `invalidate_coordinator`. Retries
        COORDINATOR_NOT_AVAILABLE and network errors with backoff for up to
        `timeout_s` (default request.timeout.ms); raises the last error after that."""
        cached = self.cached_coordinator(key, key_type)
        if cached is not None:
            return cached

        def _find() -> str:
            resp = self.call(self.cluster_stub().FindCoordinator,
                             pb.FindCoordinatorRequest(key=key, key_type=key_type))
            return self._coordinator_address(key, resp)

        addr = self.retry(_find, timeout_s)
        self._cache_coordinator(key, key_type, addr)
        return addr

    def coordinator_call(self, key: str, key_type: int, stub_method: Callable[[str], Callable],
                         request: Any, error_code: Callable[[Any], int] = lambda r: r.error_code,
                         timeout_s: float | None = None) -> Any:
        """Send `request` to the coordinator of `key` and return the response,
        retrying (re-finding the coordinator) on NOT_COORDINATOR,
        COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS
        and network errors for up to `timeout_s`. `stub_method(address)` returns the
        bound method, e.g. `lambda a: core.txn_stub(a).EndTxn`; `error_code(response)`
        extracts the outcome. Other non-zero codes raise their errors.ExactlyError."""

        def _once() -> Any:
            addr = self.find_coordinator(key, key_type, timeout_s)
            try:
                return self._coordinator_outcome(self.call(stub_method(addr), request), error_code)
            except errors.ExactlyError as exc:
                if exc.code in COORDINATOR_ERRORS:
                    self.invalidate_coordinator(key, key_type)
                raise

        return self.retry(_once, timeout_s)

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close every channel. Idempotent. In a forked child, a client of the parent
        is only marked closed: its channels belong to the parent."""
        channels = self._take_channels()
        if self.created_in_pid != os.getpid():
            return
        with self._lock:
            streaming, self._streaming = list(self._streaming.values()), {}
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        for ch in [*streaming, *channels]:  # a link is not the channel's: closed with its stream
            ch.close()


__all__ = ["ClientCore", "CoreBase", "Transport", "Rpc", "no_metadata_yet", "channel_options", "run_flow", "CANCELLED", "Metadata", "NodeMetadata",
           "TopicMetadata", "PartitionMetadata",
           "COORDINATOR_GROUP", "COORDINATOR_TRANSACTION", "COORDINATOR_TRANSACTION_GROUP",
           "txn_coordinator_key", "translate_rpc_error", "is_retriable",
           "METADATA_ERRORS", "COORDINATOR_ERRORS"]
