"""Prometheus metrics shared by every service process (docs/design.md, "Metrics").

- The HTTP `/metrics` endpoint (`start_metrics_server`), started by `server.serve()`
  when the setting `metrics.port` is above 0, bound to `metrics.bind.address`
  (default: the gRPC bind host). It serves the default registry: the series below,
  the role's own series (services/<role>/metrics.py) and prometheus-client's
  label-free `process_*` series.
- `RpcMetricsInterceptor`, installed on every gRPC server by `server.serve()`:
    exactly_rpc_request_duration_seconds{service, method}   histogram, seconds
    exactly_rpc_errors_total{service, method, error_code}   counter
  `service` is the gRPC service name without its package (PartitionLeader,
  TransactionCoordinator, GroupCoordinator, Cluster, Health) and `method` the RPC
  name. An answer is counted once per distinct Kafka error code it carries in any
  `error_code` field (top level, per topic, per partition), under the code's Kafka
  name (NOT_COORDINATOR, ...). A call that fails at the transport level (handler
  exception, abort, cancellation) is counted under `GRPC_<status>`
  (GRPC_UNKNOWN, GRPC_CANCELLED, ...).
- `CONNECTIONS_REFUSED`, counted by services/common/transport/connections.py (docs/design.md,
  "Connections"):
    exactly_connections_refused_total{listener, reason}   counter
  `listener` is grpc or kafka, `reason` the limit's setting name (max.connections,
  max.connections.per.ip, max.connection.creation.rate, connections.max.idle.ms) or
  ssl.handshake.timeout / ssl.handshake.failed; every series exists from start-up.
- `BUILD_INFO`, set once by `server.serve()` (`declare_build_info`):
    exactly_build_info{version, python_version}   gauge, always 1
  the release the process runs (exactly_wire.version()) and its Python version.
- `QUOTA_SENSORS`, read from the process's QuotaManager at scrape time (docs/design.md, "Quotas"):
    exactly_quota_sensors   gauge
- `LoopCollector`: base of the collectors that read service state at scrape time. A
  scrape runs on the HTTP server's thread; the collector hops onto the asyncio loop
  that owns the state, so it never sees a half-applied change.
- `coordinator_partitions(kind, owners)`: the family
    exactly_coordinator_partitions{kind, state}   gauge
  of a coordinator process: owned partitions of its internal topic (kind txn:
  `TRANSACTION_STATE_TOPIC`, group: `CONSUMER_OFFSETS_TOPIC`) by state, `loading` (not
  answering yet: COORDINATOR_LOAD_IN_PROGRESS) or `serving`; both states exported.
- Topic and group labels (`topic_label`, `group_label`, `TopicRows`): /metrics answers
  whoever reaches the port, before any authentication (plain HTTP), and topic and group
  names are the tenants' own (Metadata and ListGroups show each principal only what it
  may Describe). So unless `metrics.topic.labels=true` (`set_topic_labels`, set by
  `server.serve()`), a user topic's series carry topic="(hidden)" and no partition: the
  series of all user topics of the process are summed into one (the maximum for ages
  and lags), so totals, rates and alerts keep working without naming a topic. The
  internal topics (`TRANSACTION_STATE_TOPIC`, `CONSUMER_OFFSETS_TOPIC`) keep their names.
  Consumer groups likewise: group="(hidden)" unless `metrics.group.labels=true`
  (`set_group_labels`), their committed offsets and lags summed. docs/design.md,
  "Metrics and topic names".
- The endpoint answers at most SCRAPES_PER_SECOND scrapes a second, in turn, at most
  MAX_SCRAPES at once, and gives a scraper SCRAPE_TIMEOUT_S to send its request
  (`PacedExposition`): however many scrapers there are, the process does at most that
  many scrapes' work a second (the collectors that read domain state hop onto its event
  loop; the formatting runs on the HTTP server's threads).
"""
from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import gzip
import inspect
import logging
import platform
import socket
import threading
import time
import weakref
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable, Sequence
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from prometheus_client import (CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exactly_wire import version
from exactly_wire.error_codes import ErrorCode

from .protocol import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from .protocol import REQUEST_ARRIVAL_S
from .transport.guard import UnaryHandlerInterceptor

log = logging.getLogger(__name__)

disable_created_metrics()  # no `*_created` series: Prometheus does not need them

HIDDEN_TOPIC = HIDDEN_GROUP = "(hidden)"
INTERNAL_TOPICS = frozenset((TRANSACTION_STATE_TOPIC, CONSUMER_OFFSETS_TOPIC))
_topic_labels = False
_group_labels = False


def set_topic_labels(enabled: bool) -> None:
    """`metrics.topic.labels`: export user topic names as labels (module docstring)."""
    global _topic_labels
    _topic_labels = bool(enabled)


def set_group_labels(enabled: bool) -> None:
    """`metrics.group.labels`: export consumer group names as labels (module docstring)."""
    global _group_labels
    _group_labels = bool(enabled)


def group_label(group: str) -> str:
    """The `group` label value of `group`: its name when `metrics.group.labels` is on,
    else HIDDEN_GROUP."""
    return group if _group_labels else HIDDEN_GROUP


def topic_label(topic: str) -> str:
    """The `topic` label value of `topic`: its name when `metrics.topic.labels` is on
    or it is an internal topic, else HIDDEN_TOPIC."""
    return topic if _topic_labels or topic in INTERNAL_TOPICS else HIDDEN_TOPIC


class TopicRows:
    """Rows of one gauge family whose labels include `topic` (and maybe `partition`),
    merged when the topic is hidden (module docstring): `add(prefix, topic, partition,
    value)` with `partition` None for a family without one; `merge` combines the
    values of hidden rows (sum, or max for ages and lags)."""

    def __init__(self, family: GaugeMetricFamily, merge: Callable[[float, float], float] = lambda a, b: a + b):
        self.family = family
        self.merge = merge
        self.rows: dict[tuple[str, ...], float] = {}

    def add(self, prefix: Sequence[str], topic: str, partition: int | None, value: float) -> None:
        label = topic_label(topic)
        key = (*prefix, label) if partition is None else \
            (*prefix, label, str(partition) if label == topic else "")
        old = self.rows.get(key)
        self.rows[key] = value if old is None else self.merge(old, value)

    def done(self) -> GaugeMetricFamily:
        for labels, value in self.rows.items():
            self.family.add_metric(list(labels), value)
        return self.family


RPC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
               1, 2.5, 5, 10, 30)

REQUEST_DURATION = Histogram("exactly_rpc_request_duration_seconds",
                             "Server-side duration of gRPC calls, by gRPC service and method",
                             ["service", "method"], buckets=RPC_BUCKETS)
QUOTA_SENSORS = Gauge(
    "exactly_quota_sensors",
    "Client quota sensors the process keeps: the rates and mutation buckets of the users and client ids that "
    "requests were measured under (services/common/security/quotas.py); one idle for "
    "exactly.quota.sensor.expiration.ms is dropped")
CONNECTIONS_REFUSED = Counter(
    "exactly_connections_refused",
    "Connections refused or closed by a connection limit (services/common/transport/connections.py), "
    "by listener (grpc, kafka, link) and reason (max.connections, max.connections.per.ip, "
    "max.connection.creation.rate, connections.max.idle.ms, ssl.handshake.timeout, ssl.handshake.failed; links: "
    "pending (too many waiting for their ticket), ticket (not one issued, used or expired), authorization "
    "(the ticket's principal no longer admitted), socket.request.max.bytes)", ["listener", "reason"])
TUNNEL_LINKS = Gauge(
    "exactly_tunnel_links",
    "Links open on this process's link listener (services/common/transport/link.py), by kind: service "
    "(other services' tunnel calls to it on TCP connections) or client (SDKs' Client/Calls on TCP connections)",
    ["kind"])
BUILD_INFO = Gauge("exactly_build_info",
                   "1, labelled with the release the process runs (version: pyproject.toml's, as exactly --version "
                   "prints it) and its Python version (python_version), as Prometheus' *_build_info series",
                   ["version", "python_version"])
RPC_ERRORS = Counter("exactly_rpc_errors",
                     "gRPC answers carrying a Kafka error code (by its name), and calls failed at the "
                     "transport level (GRPC_<status>), by gRPC service and method",
                     ["service", "method", "error_code"])

# Error codes whose series exist from start-up (value 0) for every method of a gRPC
# service, so that dashboards show a flat line rather than "no data" while nothing fails.
EXPECTED_ERRORS: dict[str, tuple[str, ...]] = {
    "PartitionLeader": ("NOT_LEADER_OR_FOLLOWER", "UNKNOWN_TOPIC_OR_PARTITION", "UNKNOWN_SERVER_ERROR"),
    "TransactionCoordinator": ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "CONCURRENT_TRANSACTIONS",
                               "PRODUCER_FENCED", "UNKNOWN_SERVER_ERROR"),
    "GroupCoordinator": ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "REBALANCE_IN_PROGRESS",
                         "UNKNOWN_SERVER_ERROR"),
    "Cluster": ("COORDINATOR_NOT_AVAILABLE", "UNKNOWN_SERVER_ERROR"),
}


def code_name(code: int) -> str:
    """Kafka name of an error code ("NOT_COORDINATOR"); the number as text if unknown."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def split_method(full_method: str) -> tuple[str, str]:
    """"/exactly.v1.PartitionLeader/Produce" -> ("PartitionLeader", "Produce")."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service.rpartition(".")[2] or "unknown", method or "unknown"


# ------------------------------------------------------------------ error codes of a response

_Plan = tuple[str | None, tuple[tuple[str, bool], ...]]
_PLANS: dict[str, _Plan] = {}


def _repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 5.29; `label` before
    return bool(flag) if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


def _plan(desc: Descriptor) -> _Plan:
    """(name of the message's own `error_code` field or None, (name, repeated) of the
    message fields that may hold error codes further down), once per message type."""
    plan = _PLANS.get(desc.full_name)
    if plan is not None:
        return plan
    _PLANS[desc.full_name] = (None, ())  # breaks cycles of recursive message types
    own = desc.fields_by_name.get("error_code")
    if own is not None and own.type not in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64,
                                            FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_UINT32):
        own = None
    children = tuple((f.name, _repeated(f)) for f in desc.fields
                     if f.message_type is not None and _may_hold_codes(f.message_type))
    plan = (own.name if own is not None else None, children)
    _PLANS[desc.full_name] = plan
    return plan


def _may_hold_codes(desc: Descriptor, seen: frozenset[str] = frozenset()) -> bool:
    if desc.full_name in seen:
        return False
    if "error_code" in desc.fields_by_name:
        return True
    seen = seen | {desc.full_name}
    return any(f.message_type is not None and _may_hold_codes(f.message_type, seen) for f in desc.fields)


def response_error_codes(message: Any) -> set[int]:
    """The distinct non-zero values of every `error_code` field of a protobuf message,
    at any depth (top level, per topic, per partition, per marker...)."""
    codes: set[int] = set()
    _collect(message, codes)
    return codes


def _collect(message: Any, codes: set[int]) -> None:
    own, children = _plan(message.DESCRIPTOR)
    if own is not None:
        value = getattr(message, own)
        if value:
            codes.add(value)
    for name, repeated in children:
        if repeated:
            for item in getattr(message, name):
                _collect(item, codes)
        elif message.HasField(name):
            _collect(getattr(message, name), codes)


# ------------------------------------------------------------------ the interceptor

def declare_service(service_descriptor) -> None:
    """Create the duration series of every unary method of a gRPC service (protobuf
    ServiceDescriptor) and its EXPECTED_ERRORS series, all at 0."""
    service = service_descriptor.name
    for method in service_descriptor.methods:
        if getattr(method, "client_streaming", False) or getattr(method, "server_streaming", False):
            continue
        REQUEST_DURATION.labels(service, method.name)
        for code in EXPECTED_ERRORS.get(service, ()):
            RPC_ERRORS.labels(service, method.name, code)


def _status_name(context) -> str | None:
    code_of = getattr(context, "code", None)
    code = code_of() if callable(code_of) else None
    if code is None:
        return None
    if isinstance(code, grpc.StatusCode):
        return None if code is grpc.StatusCode.OK else code.name
    try:
        status = next(s for s in grpc.StatusCode if s.value[0] == int(code))
    except (StopIteration, TypeError, ValueError):
        return "UNKNOWN"
    return None if status is grpc.StatusCode.OK else status.name


class RpcMetricsInterceptor(UnaryHandlerInterceptor):
    """Times every unary gRPC call and counts its error codes (module docstring).
    Streaming methods (e.g. Health.Watch) are passed through untouched. The outermost
    interceptor (of direct and tunneled calls): it also records each call's arrival
    in services.common.protocol.REQUEST_ARRIVAL_S (time.monotonic s), before any
    later interceptor (a quota mute) holds the call."""

    def __init__(self) -> None:
        super().__init__(lambda behavior, method: _instrument(behavior, *split_method(method)))


def _instrument(behavior: Callable, service: str, method: str) -> Callable:
    duration = REQUEST_DURATION.labels(service, method)
    errors: dict[str, Any] = {}

    def count(name: str) -> None:
        child = errors.get(name)
        if child is None:
            child = errors[name] = RPC_ERRORS.labels(service, method, name)
        child.inc()

    async def handler(request, context):
        arrival = REQUEST_ARRIVAL_S.set(time.monotonic())
        start = time.perf_counter()
        try:
            response = behavior(request, context)
            if inspect.isawaitable(response):
                response = await response
        except asyncio.CancelledError:
            count("GRPC_CANCELLED")
            raise
        except BaseException:
            count(f"GRPC_{_status_name(context) or 'UNKNOWN'}")
            raise
        finally:
            duration.observe(time.perf_counter() - start)
            REQUEST_ARRIVAL_S.reset(arrival)
        status = _status_name(context)
        if status is not None:
            count(f"GRPC_{status}")
        elif response is not None:
            for code in response_error_codes(response):
                count(code_name(code))
        return response

    return handler


# ------------------------------------------------------------------ the HTTP endpoint

class MetricsServer:
    """A running /metrics HTTP server; `address` is (host, port); `close()` stops it."""

    def __init__(self, httpd, thread: threading.Thread):
        self._httpd = httpd
        self._thread = thread
        self.address: tuple[str, int] = httpd.server_address[:2]

    def close(self) -> None:
        """Stop serving and close the port. Shutting the listening socket down first
        wakes the server thread's select at once (on Linux), instead of at its next
        poll (socketserver polls every 0.5 s)."""
        with contextlib.suppress(OSError):
            self._httpd.socket.shutdown(socket.SHUT_RDWR)
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def declare_build_info() -> None:
    """Set `exactly_build_info{version, python_version}` to 1 for this process's release
    (exactly_wire.version()) and interpreter."""
    BUILD_INFO.labels(version=version(), python_version=platform.python_version()).set(1)


MAX_SCRAPES = 8  # scrapes served at once; more connections wait in the listen backlog
SCRAPE_TIMEOUT_S = 10.0  # for a scraper to send its request and read the answer
SCRAPES_PER_SECOND = 2  # answers sent per second at most; a scrape beyond waits its turn


class PacedExposition:
    """`registry` in Prometheus' text format, rendered for each scrape, at most
    `per_second` scrapes answered a second: a scrape beyond waits for its turn, on the
    HTTP server's thread, so what serving scrapers costs the process (the collectors'
    work on the event loop included) does not grow with their number. `app` is the WSGI
    application serving it (any path, GET only, gzip when asked). clock: () -> monotonic
    seconds; sleep: (seconds) -> None."""

    def __init__(self, registry=REGISTRY, per_second: float = SCRAPES_PER_SECOND,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.registry = registry
        self.spacing_s = 1.0 / per_second
        self.clock = clock
        self.sleep = sleep
        self._turns = threading.Lock()
        self._next_turn = float("-inf")

    def wait_turn(self) -> None:
        """Wait until this answer's turn: one every `spacing_s`."""
        with self._turns:
            now = self.clock()
            turn = max(now, self._next_turn)
            if turn - now > MAX_SCRAPES * self.spacing_s:
                # Further ahead than the scrapes served at once can queue: the clock went
                # back (a stepped clock under faketime steps CLOCK_MONOTONIC too). Start
                # the turns again from now rather than wait out the step.
                turn = now
            self._next_turn = turn + self.spacing_s
        if turn > now:
            try:
                self.sleep(turn - now)
            except OSError:
                # A clock the kernel refuses to sleep against (a process under faketime
                # stepped behind gets EINVAL from clock_nanosleep): answer unpaced
                # rather than fail the scrape.
                pass

    def app(self, environ, start_response):
        if environ.get("REQUEST_METHOD") != "GET":
            start_response("405 Method Not Allowed", [("Allow", "GET")])
            return [b""]
        self.wait_turn()
        body, headers = generate_latest(self.registry), [("Content-Type", CONTENT_TYPE_LATEST)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]


class _QuietHandler(WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT_S  # a scraper that sends nothing is cut off

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per scrape, at most MAX_SCRAPES at once: the serving thread stops
    accepting while that many run."""

    daemon_threads = True
    slots = threading.BoundedSemaphore(MAX_SCRAPES)

    def process_request(self, request, client_address):
        self.slots.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def start_metrics_server(port: int, address: str, registry=REGISTRY) -> MetricsServer:
    """Serve `registry` on http://address:port/metrics from daemon threads
    (`PacedExposition`: at most SCRAPES_PER_SECOND scrapes answered a second, MAX_SCRAPES
    at once). Raises OSError if the port is taken."""
    family, _, _, _, sockaddr = socket.getaddrinfo(address.strip("[]"), port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]
    server_class = type("MetricsHTTPServer", (_BoundedServer,), {
        "address_family": family, "slots": threading.BoundedSemaphore(MAX_SCRAPES)})
    httpd = make_server(sockaddr[0], port, PacedExposition(registry).app, server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)


# ------------------------------------------------------------------ scrape-time collectors

def call_on_loop(loop: asyncio.AbstractEventLoop | None, fn: Callable[[], Any], timeout_s: float = 5.0) -> Any:
    """Run `fn()` on `loop`'s thread and return its result; run it here when `loop` is
    None, not running, or is this thread's running loop. Raises TimeoutError when the
    loop does not get to it within `timeout_s`."""
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if loop is None or loop is here or not loop.is_running():
        return fn()
    done: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the scraping thread
            done.set_exception(exc)

    loop.call_soon_threadsafe(run)
    return done.result(timeout_s)


def coordinator_partitions(kind: str, owners: Iterable[Any]) -> Metric:
    """exactly_coordinator_partitions{kind, state} over coordinators with
    `owned_partitions()` ({partition: serving}); see the module docstring."""
    family = GaugeMetricFamily("exactly_coordinator_partitions",
                               "Owned partitions of the coordinator's internal topic, by state (loading, serving)",
                               labels=["kind", "state"])
    serving = loading = 0
    for owner in owners:
        for is_serving in owner.owned_partitions().values():
            serving += bool(is_serving)
            loading += not is_serving
    family.add_metric([kind, "loading"], loading)
    family.add_metric([kind, "serving"], serving)
    return family


class LoopCollector(abc.ABC):
    """A prometheus-client collector over tracked domain objects, read at scrape time
    on the event loop that owns them. Subclasses implement `families(objects)`,
    returning the metric families (and should emit them even for no objects)."""

    timeout_s = 5.0

    def __init__(self, registry=REGISTRY) -> None:
        self._tracked: weakref.WeakSet = weakref.WeakSet()
        self._loop: asyncio.AbstractEventLoop | None = None
        if registry is not None:
            registry.register(self)

    def track(self, obj: Any) -> None:
        """Read `obj` at every scrape, on the event loop running now (if any)."""
        self._tracked.add(obj)
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            pass

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        objects = list(self._tracked)
        try:
            return call_on_loop(self._loop, lambda: self.families(objects), self.timeout_s)
        except Exception:  # noqa: BLE001 - one failing collector must not fail the whole scrape
            log.warning("%s: scrape failed", type(self).__name__, exc_info=True)
            return []

    @abc.abstractmethod
    def families(self, objects: Sequence[Any]) -> list[Metric]:
        """The metric families of `objects` (the tracked objects alive now)."""
