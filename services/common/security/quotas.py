"""Client quotas as Kafka's (KIP-13 byte rates, KIP-124 request percentage, KIP-599
controller mutation rate, KIP-219 throttling), and a partition quota per principal
(docs/design.md, "Quotas").

Quota keys (Kafka's names; values are numbers > 0):
- `producer_byte_rate`: bytes/s of Produce requests (the request's size);
- `consumer_byte_rate`: bytes/s of Fetch responses;
- `request_percentage`: % of one request-handling thread's time per second (the
  handler's elapsed time; 100 = one thread's worth);
- `controller_mutation_rate`: partitions created or deleted per second (CreateTopics,
  CreatePartitions, DeleteTopics);
- `max_partitions` (Exactly's own): the partitions the topics a principal created may
  have in total, so one principal cannot take the whole `max.partitions` budget.

Entities: a user (the principal's name without "User:"), a client id, or both; the
name `<default>` (DEFAULT) stands for every user / client id without its own entry.
A quota key of a request by (user, client id) is taken from the first of these that
sets it (Kafka's precedence, ClientQuotaManager):
  user+client, user+<default> client, user, <default> user+client,
  <default> user+<default> client, <default> user, client, <default> client.
The entity that matched is the one whose rate is measured: every client of a user
shares a quota set at user level.

Throttling (ClientQuotaManager, Rate, SampledStat): a rate is the total over
`quota.window.num` samples of `quota.window.size.seconds` each, divided by the time
they span (at least `quota.window.num - 1` full windows, so a new client cannot burst
at an unbounded rate). When a recorded request takes the rate above the quota, the
throttle time is `(rate - quota) / quota * window` ms: the time after which the rate
is back at the quota. It is returned in the response's `throttle_time_ms` at once
and the caller is muted that long (the Kafka port reads no further request of the
connection, the gRPC port delays the caller's next request), as KIP-219 does.
Request-percentage throttles are capped at one window, as Kafka caps them.

Controller mutations use a token bucket (KIP-599): a burst of `quota *
quota.window.num * quota.window.size.seconds` partitions, refilled at the quota; a
request that arrives while the bucket is negative is refused with
THROTTLING_QUOTA_EXCEEDED and the time until it is back at zero.

Enforcement does not rely on the client (docs/design.md, "Quotas"): the mute is kept per
quota entity measured, so every client id of a user is held while the user's quota is
exceeded; a held call waits out the mute whatever its deadline (one whose deadline ends
first is answered THROTTLING_QUOTA_EXCEEDED without being handled); refused calls
(throttled, or denied by the authorizer) are charged to request_percentage like
handled ones, with the CPU a call costs outside its handler (`CallOverhead`). Under a
`<default>` client-id quota a client id the principal has not used for a whole
measurement yet is also charged to the principal's shared bucket of new client ids, so
a fresh client id per call gets no fresh budget. Sensors idle for
`exactly.quota.sensor.expiration.ms` (Kafka: one hour) are dropped, and client ids are
at most MAX_CLIENT_ID_LENGTH characters.

Super users (the services' own principals) are not subject to quotas, as Kafka
exempts inter-broker traffic.

Storage: one znode, `/exactly/config/quotas`, JSON `{"<entity key>": {"key": value}}`
where an entity key is `user=alice`, `user=<default>,client-id=app` and so on; only
the services write it (the Cluster service's AlterClientQuotas, with the cluster's
ZooKeeper identity when zookeeper.set.acl is on). Every service watches it.
"""
from __future__ import annotations

import contextvars
import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import grpc

from ..settings import ServiceSchema

log = logging.getLogger(__name__)

QUOTAS = "/exactly/config/quotas"
DEFAULT = "<default>"
USER, CLIENT_ID = "user", "client-id"

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
MAX_PARTITIONS = "max_partitions"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE, CONTROLLER_MUTATION_RATE, MAX_PARTITIONS)
# The quotas measured as rates, whose excess mutes the caller (KIP-219).
RATE_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
# The longest client id a request may carry (the longest quota entity name): a longer one
# is refused, so no sensor or resolution is kept for an attacker's 30 KB client ids.
MAX_CLIENT_ID_LENGTH = 255
# The client id standing for a principal's client ids under a `<default>` client-id quota
# that it has not used for a whole measurement yet (their shared bucket).
NEW_CLIENT_IDS = "<new client ids>"
# The client ids of one principal followed under `<default>` client-id quotas (each its own
# sensor once established); further ones stay in the shared bucket of new client ids.
MAX_CLIENT_IDS_PER_USER = 1000

# The schema's defaults of quota.window.num, quota.window.size.seconds and
# exactly.quota.sensor.expiration.ms.
DEFAULT_WINDOW_NUM = ServiceSchema.model_fields["quota_window_num"].default
DEFAULT_WINDOW_SIZE_S = ServiceSchema.model_fields["quota_window_size_seconds"].default
DEFAULT_SENSOR_EXPIRATION_MS = ServiceSchema.model_fields["quota_sensor_expiration_ms"].default

# The client id of the request in progress (the Kafka header's, or the SDK's
# `client.id` from the gRPC user agent); set beside auth.current_principal.
current_client_id: contextvars.ContextVar[str] = contextvars.ContextVar("client_id", default="")


class QuotaError(ValueError):
    """A quota entity or value that is not valid (INVALID_REQUEST)."""


def client_id_error(client_id: str) -> str | None:
    """Why a request's client id is refused (None when it is not): longer than
    MAX_CLIENT_ID_LENGTH characters."""
    if len(client_id) > MAX_CLIENT_ID_LENGTH:
        return (f"client.id of {len(client_id)} characters; at most {MAX_CLIENT_ID_LENGTH} are accepted "
                f"(a quota entity name's limit)")
    return None


@dataclass(frozen=True)
class QuotaEntity:
    """A quota entity: `user` and/or `client_id` (None: not part of the entity;
    DEFAULT: the default entity of that type)."""

    user: str | None = None
    client_id: str | None = None

    def key(self) -> str:
        """The entity's key in the quotas znode: "user=alice,client-id=app"."""
        parts = []
        if self.user is not None:
            parts.append(f"{USER}={self.user}")
        if self.client_id is not None:
            parts.append(f"{CLIENT_ID}={self.client_id}")
        return ",".join(parts)

    @classmethod
    def parse(cls, key: str) -> "QuotaEntity":
        """The entity of a `key()`; raises QuotaError for anything else."""
        user = client = None
        for part in key.split(","):
            kind, sep, name = part.partition("=")
            if not sep or not name:
                raise QuotaError(f"bad quota entity {key!r}")
            if kind == USER and user is None:
                user = name
            elif kind == CLIENT_ID and client is None:
                client = name
            else:
                raise QuotaError(f"bad quota entity {key!r}")
        return cls(user, client)

    def validate(self) -> None:
        """Raise QuotaError unless the entity names a user, a client id, or both."""
        if self.user is None and self.client_id is None:
            raise QuotaError("a quota entity needs a user, a client id or both")
        for name in (self.user, self.client_id):
            if name is not None and (not name or "," in name or "=" in name or len(name) > 255):
                raise QuotaError(f"invalid entity name {name!r}: 1-255 characters, no ',' or '='")


def validate_value(key: str, value: float) -> None:
    """Raise QuotaError for an unknown quota key or a value that is not > 0."""
    if key not in QUOTA_KEYS:
        raise QuotaError(f"unknown quota key {key!r}; the keys are {', '.join(QUOTA_KEYS)}")
    if not isinstance(value, (int, float)) or math.isnan(value) or value <= 0 or math.isinf(value):
        raise QuotaError(f"quota {key} must be a number > 0, got {value!r}")


def user_name(principal: str) -> str:
    """The quota user of a principal: "User:alice" -> "alice"."""
    return principal.split(":", 1)[1] if principal.startswith("User:") else principal


def candidates(user: str, client_id: str) -> list[QuotaEntity]:
    """The entities a request by (user, client id) takes a quota from, in Kafka's
    precedence order (the module docstring)."""
    return [QuotaEntity(user, client_id), QuotaEntity(user, DEFAULT), QuotaEntity(user, None),
            QuotaEntity(DEFAULT, client_id), QuotaEntity(DEFAULT, DEFAULT), QuotaEntity(DEFAULT, None),
            QuotaEntity(None, client_id), QuotaEntity(None, DEFAULT)]


def resolve(configs: dict[QuotaEntity, dict[str, float]], user: str, client_id: str, key: str
            ) -> tuple[QuotaEntity, float] | None:
    """(sensor entity, quota) of `key` for a request by (user, client id), or None
    when no entity sets it. The matched entity names the sensor: user-level
    quotas are shared by all the user's clients, so the sensor is keyed by the
    concrete user/client the entity covers (a default entity stands for each
    user/client separately, as Kafka's quota metric tags do)."""
    found = _matched(configs, user, client_id, key)
    return None if found is None else found[:2]


def _matched(configs: dict[QuotaEntity, dict[str, float]], user: str, client_id: str, key: str
             ) -> tuple[QuotaEntity, float, bool] | None:
    """`resolve`'s answer and whether the matched entity is a `<default>` client id
    (a sensor per client id, which a new client id does not get for free)."""
    for entity in candidates(user, client_id):
        value = configs.get(entity, {}).get(key)
        if value is not None:
            sensor = QuotaEntity(None if entity.user is None else user,
                                 None if entity.client_id is None else client_id)
            return sensor, value, entity.client_id == DEFAULT
    return None


class Rate:
    """Kafka's Rate over a SampledStat: `samples` windows of `window_ms` each; times
    are ms on any monotonic clock."""

    def __init__(self, samples: int = DEFAULT_WINDOW_NUM, window_ms: int = DEFAULT_WINDOW_SIZE_S * 1000):
        if samples < 2 or window_ms < 1:
            raise ValueError("a rate needs at least 2 samples of at least 1 ms")
        self.samples = samples
        self.window_ms = window_ms
        self._starts: list[float] = []  # start of each sample (ms), oldest first
        self._values: list[float] = []

    def _retained(self, now_ms: float) -> int:
        """Index of the oldest sample still inside the horizon at `now_ms`."""
        horizon = now_ms - self.samples * self.window_ms
        i = 0
        while i < len(self._starts) and self._starts[i] < horizon:
            i += 1
        return i

    def _purge(self, now_ms: float) -> None:
        i = self._retained(now_ms)
        del self._starts[:i], self._values[:i]

    def record(self, value: float, now_ms: float) -> None:
        self._purge(now_ms)
        if not self._starts or now_ms - self._starts[-1] >= self.window_ms:
            self._starts.append(now_ms)
            self._values.append(0.0)
            if len(self._starts) > self.samples:
                self._starts.pop(0)
                self._values.pop(0)
        self._values[-1] += value

    def window_size_ms(self, now_ms: float) -> float:
        """The time the rate is measured over (Rate.windowSize): since the oldest
        sample's start, at least `samples - 1` full windows."""
        i = self._retained(now_ms)
        oldest = self._starts[i] if i < len(self._starts) else now_ms
        elapsed = now_ms - oldest
        full = int(elapsed // self.window_ms)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return elapsed

    def measure(self, now_ms: float) -> float:
        """Units recorded per second, as measured at `now_ms` (no later than the
        next record; samples that have aged out by then are left out)."""
        total = sum(self._values[self._retained(now_ms):])
        return total / (self.window_size_ms(now_ms) / 1000.0)

    def expiries(self, after_ms: float) -> list[float]:
        """The times after `after_ms` at which a sample ages out (the rate drops)."""
        return [s + self.samples * self.window_ms for s in self._starts
                if s + self.samples * self.window_ms > after_ms]


def throttle_time_ms(rate: Rate, quota: float, now_ms: float) -> int:
    """ms until `rate` is back at `quota` (units/s) if nothing more is recorded; 0
    at or under it. Kafka's QuotaUtils.throttleTime, `(rate - quota) / quota *
    window`, assumes the window only grows; the measured window also jumps when a
    sample ages out or a young rate passes a window boundary, so the formula is
    applied from each such point until the rate is at the quota (a few steps)."""
    observed = rate.measure(now_ms)
    if observed <= quota:
        return 0
    t = now_ms
    expiries = rate.expiries(now_ms)
    for _ in range(4 * rate.samples + 8):
        observed = rate.measure(t)
        if observed <= quota * 1.0001:
            break
        step = max((observed - quota) / quota * rate.window_size_ms(t), 1.0)
        later = [e for e in expiries if t < e <= t + step]
        t = later[0] + 0.001 if later else t + step
    return int(math.ceil(t - now_ms))


class TokenBucket:
    """KIP-599's token bucket: at most `quota * burst_s` tokens, refilled at `quota`
    per second; a record takes tokens and may leave the bucket negative."""

    def __init__(self, quota: float, burst_s: float, now_ms: float):
        self.quota = quota
        self.burst = quota * burst_s
        self.tokens = self.burst
        self._last_ms = now_ms

    def _refill(self, now_ms: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now_ms - self._last_ms) / 1000.0 * self.quota)
        self._last_ms = now_ms

    def throttle_ms(self, now_ms: float) -> int:
        """0 while the bucket is not negative, else ms until it is back at zero."""
        self._refill(now_ms)
        return 0 if self.tokens >= 0 else int(math.ceil(-self.tokens / self.quota * 1000))

    def record(self, value: float, now_ms: float) -> None:
        self._refill(now_ms)
        self.tokens -= value


_UNRESOLVED = object()
_MAX_RESOLVED = 10_000


def _now_ms() -> float:
    return time.monotonic() * 1000.0


class _Sensor:
    """A quota entity's measurement: its Rate, when it was last recorded (ms) and
    until when its excess mutes its callers (ms)."""

    __slots__ = ("rate", "last_ms", "muted_until")

    def __init__(self, rate: "Rate", now_ms: float):
        self.rate = rate
        self.last_ms = now_ms
        self.muted_until = 0.0


class QuotaManager:
    """The quotas of one service process: the configured values (`set_configs`,
    fed by `QuotaStore`'s watch) and the sensors of the entities that matched.

    samples / window_s: quota.window.num / quota.window.size.seconds;
    super_users: principals never throttled; clock: monotonic ms;
    sensor_expiration_ms: a sensor (rate, mute, new-client-id record) idle this long
    is dropped (exactly.quota.sensor.expiration.ms; Kafka's quota sensors expire after
    an hour); overhead: the estimate of a call's cost outside its handler (a
    CallOverhead of the process's CPU by default)."""

    def __init__(self, samples: int = DEFAULT_WINDOW_NUM, window_s: int = DEFAULT_WINDOW_SIZE_S,
                 super_users: Iterable[str] = (), clock: Callable[[], float] = _now_ms,
                 sensor_expiration_ms: float = DEFAULT_SENSOR_EXPIRATION_MS, overhead: "CallOverhead | None" = None):
        self.overhead = overhead if overhead is not None else CallOverhead()
        self.samples = samples
        self.window_ms = window_s * 1000
        self.super_users = frozenset(super_users)
        self.clock = clock
        self.sensor_expiration_ms = sensor_expiration_ms
        # The configs and their resolutions, (user, client id, key) -> _matched()'s answer,
        # replaced together (one attribute): a resolution never outlives its configs.
        self._view: tuple[dict[QuotaEntity, dict[str, float]],
                          dict[tuple[str, str, str], tuple[QuotaEntity, float, bool] | None]] = ({}, {})
        self._lock = threading.Lock()
        self._sensors: dict[tuple[str, QuotaEntity, float], _Sensor] = {}
        self._buckets: dict[tuple[QuotaEntity, float], tuple[TokenBucket, list[float]]] = {}
        self._muted: dict[tuple[str, str], float] = {}  # (principal, client id) -> until (ms): handlers' throttles
        # user -> client id -> when it was first seen (ms), for client ids under a
        # <default> client-id quota (at most MAX_CLIENT_IDS_PER_USER per user).
        self._first_seen: dict[str, dict[str, float]] = {}
        self._next_expiry_ms = 0.0

    def set_configs(self, configs: dict[QuotaEntity, dict[str, float]]) -> None:
        with self._lock:
            self._view = ({e: dict(v) for e, v in configs.items()}, {})
            # Sensors of a quota no entity sets any more (or not at that value) go now.
            kept = {(key, value) for values in configs.values() for key, value in values.items()}
            self._sensors = {k: v for k, v in self._sensors.items() if (k[0], k[2]) in kept}
            self._buckets = {k: v for k, v in self._buckets.items() if (CONTROLLER_MUTATION_RATE, k[1]) in kept}

    def configs(self) -> dict[QuotaEntity, dict[str, float]]:
        return self._view[0]

    def sensors(self) -> int:
        """How many sensors (rates and mutation buckets) are kept."""
        return len(self._sensors) + len(self._buckets)

    def _match(self, principal: str, client_id: str, key: str) -> tuple[QuotaEntity, float, bool] | None:
        configs, resolved = self._view
        if not configs or principal in self.super_users:
            return None
        user, client_id = user_name(principal), client_id or ""
        found = resolved.get((user, client_id, key), _UNRESOLVED)
        if found is _UNRESOLVED:
            found = _matched(configs, user, client_id, key)
            if len(resolved) >= _MAX_RESOLVED:  # client ids are the callers' to choose: bounded
                resolved.clear()
            resolved[(user, client_id, key)] = found
        return found

    def quota(self, principal: str, client_id: str, key: str) -> tuple[QuotaEntity, float] | None:
        """(sensor entity, quota) of `key` for this caller, None when unlimited (no
        entity sets it, or a super user)."""
        found = self._match(principal, client_id, key)
        return None if found is None else found[:2]

    def record(self, principal: str, client_id: str, key: str, value: float) -> int:
        """Record `value` (bytes, or percent-seconds for request_percentage) against
        the caller's `key` quota; returns the throttle time in ms (0: within it), for
        which the entity measured is muted (`muted_ms`). A client id new under a
        `<default>` client-id quota is charged to the principal's bucket of new client
        ids as well, until it has been used for a whole measurement."""
        found = self._match(principal, client_id, key)
        if found is None:
            return 0
        now = self.clock()
        with self._lock:
            entity = self._sensor_entity(principal, found, now)
            throttle = self._record(key, entity, found[1], value, now)
            if now >= self._next_expiry_ms:
                self._expire(now)
        return throttle

    def _record(self, key: str, entity: QuotaEntity, bound: float, value: float, now: float) -> int:
        sensor = self._sensors.get((key, entity, bound))
        if sensor is None:
            sensor = self._sensors[(key, entity, bound)] = _Sensor(Rate(self.samples, self.window_ms), now)
        sensor.rate.record(value, now)
        sensor.last_ms = now
        throttle = throttle_time_ms(sensor.rate, bound, now)
        if key == REQUEST_PERCENTAGE:
            throttle = min(throttle, self.window_ms)
        if throttle > 0:
            sensor.muted_until = max(sensor.muted_until, now + throttle)
        return throttle

    def _sensor_entity(self, principal: str, found: tuple[QuotaEntity, float, bool], now: float) -> QuotaEntity:
        """The entity whose sensor measures a request: `found`'s, except for a client id
        matched by a `<default>` client-id entity that the principal has not used for a
        whole measurement (quota.window.num windows) yet, or beyond the
        MAX_CLIENT_IDS_PER_USER it is followed with: then the principal's shared bucket of
        new client ids, so that a fresh client id per call gets no fresh budget."""
        entity, _, per_client = found
        if not per_client:
            return entity
        user = user_name(principal)
        seen = self._first_seen.setdefault(user, {})
        first = seen.get(entity.client_id or "")
        if first is None:
            if len(seen) >= MAX_CLIENT_IDS_PER_USER:
                return QuotaEntity(user, NEW_CLIENT_IDS)
            first = seen[entity.client_id or ""] = now
        if now - first < self.samples * self.window_ms:
            return QuotaEntity(user, NEW_CLIENT_IDS)
        return entity

    def _expire(self, now: float) -> None:
        """Drop what has been idle for sensor_expiration_ms (at most once a window)."""
        self._next_expiry_ms = now + min(self.window_ms, self.sensor_expiration_ms)
        horizon = now - self.sensor_expiration_ms
        self._sensors = {k: v for k, v in self._sensors.items() if v.last_ms > horizon or v.muted_until > now}
        self._buckets = {k: v for k, v in self._buckets.items() if v[1][0] > horizon}
        self._muted = {k: v for k, v in self._muted.items() if v > now}
        live = {e.client_id for _, e, _ in self._sensors}
        for user, seen in list(self._first_seen.items()):
            kept = {c: t for c, t in seen.items() if t > horizon or c in live}
            if kept:
                self._first_seen[user] = kept
            else:
                del self._first_seen[user]

    def expire(self) -> None:
        """Drop the sensors idle for sensor_expiration_ms now (also done as requests
        are recorded)."""
        with self._lock:
            self._expire(self.clock())

    def record_request_time(self, principal: str, client_id: str, elapsed_s: float) -> int:
        """A request's handling time against request_percentage (Kafka records
        percent-seconds: elapsed * 100); returns the throttle time in ms."""
        return self.record(principal, client_id, REQUEST_PERCENTAGE, elapsed_s * 100.0)

    def mutation_throttle(self, principal: str, client_id: str) -> int:
        """ms until the caller may mutate again (0: it may now) under
        controller_mutation_rate (KIP-599, strict: refuse while the bucket is negative)."""
        found = self.quota(principal, client_id, CONTROLLER_MUTATION_RATE)
        if found is None:
            return 0
        with self._lock:
            return self._bucket(found).throttle_ms(self.clock())

    def record_mutations(self, principal: str, client_id: str, partitions: int) -> int:
        """Record `partitions` created or deleted; returns the throttle time in ms."""
        found = self.quota(principal, client_id, CONTROLLER_MUTATION_RATE)
        if found is None or partitions <= 0:
            return 0
        now = self.clock()
        with self._lock:
            bucket = self._bucket(found)
            bucket.record(partitions, now)
            return bucket.throttle_ms(now)

    def _bucket(self, found: tuple[QuotaEntity, float]) -> TokenBucket:
        entity, bound = found
        now = self.clock()
        entry = self._buckets.get((entity, bound))
        if entry is None:
            entry = self._buckets[(entity, bound)] = (
                TokenBucket(bound, self.samples * self.window_ms / 1000, now), [now])
        entry[1][0] = now
        return entry[0]

    def partition_quota(self, principal: str) -> float | None:
        """The principal's `max_partitions` (user, then <default> user), None when unlimited."""
        found = self.quota(principal, "", MAX_PARTITIONS)
        return None if found is None else found[1]

    def mute(self, principal: str, client_id: str, throttle_ms: int) -> None:
        """Mute the caller for `throttle_ms` (its next gRPC request waits): a throttle a
        handler answered itself; the quotas' own excess mutes their entities (`record`)."""
        if throttle_ms <= 0:
            return
        until = self.clock() + throttle_ms
        with self._lock:
            key = (principal, client_id)
            self._muted[key] = max(self._muted.get(key, 0.0), until)

    def muted_ms(self, principal: str, client_id: str) -> float:
        """ms the caller is still muted (0: not muted): the longest mute of the entities
        its rate quotas are measured on (every client id of a user under a user quota,
        a new client id also under its principal's bucket of new client ids), or of a
        throttle a handler answered it."""
        if not self._view[0] and not self._muted:  # no quota and nobody muted: no lock needed to say so
            return 0.0
        now = self.clock()
        until = 0.0
        with self._lock:
            for key in RATE_KEYS:
                found = self._match(principal, client_id, key)
                if found is None:
                    continue
                sensor = self._sensors.get((key, self._sensor_entity(principal, found, now), found[1]))
                if sensor is not None:
                    until = max(until, sensor.muted_until)
            own = self._muted.get((principal, client_id))
            if own is not None:
                if own <= now:
                    del self._muted[(principal, client_id)]
                else:
                    until = max(until, own)
        return max(until - now, 0.0)


class CallOverhead:
    """The CPU one call costs a process outside its handler: gRPC's transport,
    (de)serialization, interceptors (KIP-124 counts network thread time as well as
    request handler time). Measured as the process's CPU time over an interval, less
    the handlers' own timed seconds, per call, over intervals of at least
    `interval_s` and `min_calls` calls (with fewer calls the background work of the
    process would be charged to them); 0 until one such interval has passed.
    cpu: () -> process CPU seconds; clock: () -> monotonic seconds."""

    def __init__(self, interval_s: float = 1.0, min_calls: int = 100,
                 cpu: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.min_calls = min_calls
        self.cpu = cpu
        self.clock = clock
        self.per_call_s = 0.0
        self._start_s = clock()
        self._start_cpu = cpu()
        self._calls = 0
        self._handled_s = 0.0

    def add(self, handled_s: float) -> float:
        """Count one call whose handler ran `handled_s` seconds; returns the per-call
        overhead (seconds) to charge it."""
        self._calls += 1
        self._handled_s += handled_s
        now = self.clock()
        if now - self._start_s >= self.interval_s:
            cpu = self.cpu()
            if self._calls >= self.min_calls:
                self.per_call_s = max(cpu - self._start_cpu - self._handled_s, 0.0) / self._calls
            self._start_s, self._start_cpu, self._calls, self._handled_s = now, cpu, 0, 0.0
        return self.per_call_s


def encode_configs(configs: dict[QuotaEntity, dict[str, float]]) -> bytes:
    return json.dumps({e.key(): v for e, v in sorted(configs.items(), key=lambda kv: kv[0].key()) if v},
                      sort_keys=True).encode()


def decode_configs(data: bytes | None) -> dict[QuotaEntity, dict[str, float]]:
    """The quotas znode's JSON; malformed entries are left out (logged)."""
    if not data:
        return {}
    out: dict[QuotaEntity, dict[str, float]] = {}
    try:
        raw = json.loads(data)
    except ValueError as exc:
        log.warning("unreadable quotas znode (%s); no quotas apply", exc)
        return {}
    for key, values in (raw.items() if isinstance(raw, dict) else ()):
        try:
            entity = QuotaEntity.parse(key)
            entity.validate()
            good = {}
            for k, v in dict(values).items():
                validate_value(k, v)
                good[k] = float(v)
            out[entity] = good
        except (QuotaError, TypeError, ValueError) as exc:
            log.warning("ignoring a malformed quota entry %r: %s", key, exc)
    return out


def alter(configs: dict[QuotaEntity, dict[str, float]], entity: QuotaEntity,
          ops: Iterable[tuple[str, float | None]]) -> dict[QuotaEntity, dict[str, float]]:
    """`configs` with `ops` applied to `entity`: (key, value) sets, (key, None)
    removes. Raises QuotaError for a bad entity, key or value."""
    entity.validate()
    out = {e: dict(v) for e, v in configs.items()}
    values = out.setdefault(entity, {})
    for key, value in ops:
        if value is None:
            if key not in QUOTA_KEYS:
                raise QuotaError(f"unknown quota key {key!r}; the keys are {', '.join(QUOTA_KEYS)}")
            values.pop(key, None)
        else:
            validate_value(key, value)
            values[key] = float(value)
    if not values:
        del out[entity]
    return out


class QuotaStore:
    """The quotas znode: `watch(manager)` keeps a QuotaManager current;
    `change(fn)` applies `fn(configs) -> configs` with a version check (retried on a
    concurrent change). zk: a started KazooClient whose default ACL is the cluster's."""

    def __init__(self, zk):
        self.zk = zk

    def watch(self, manager: QuotaManager) -> None:
        self.zk.ensure_path(QUOTAS)

        def on_data(data, stat):
            manager.set_configs(decode_configs(data))
            log.info("quotas: %d entities", len(manager.configs()))
        self.zk.DataWatch(QUOTAS, on_data)

    def read(self) -> dict[QuotaEntity, dict[str, float]]:
        self.zk.ensure_path(QUOTAS)
        data, _ = self.zk.get(QUOTAS)
        return decode_configs(data)

    def change(self, fn: Callable[[dict[QuotaEntity, dict[str, float]]], dict[QuotaEntity, dict[str, float]]]
               ) -> dict[QuotaEntity, dict[str, float]]:
        from kazoo.exceptions import BadVersionError
        self.zk.ensure_path(QUOTAS)
        for _ in range(20):
            data, stat = self.zk.get(QUOTAS)
            new = fn(decode_configs(data))
            try:
                self.zk.set(QUOTAS, encode_configs(new), version=stat.version)
                return new
            except BadVersionError:
                continue
        raise RuntimeError("the quotas znode kept changing; try again")


# Calls between the services themselves: never throttled (Kafka exempts inter-broker
# requests; replica fetches are recognised by their replica_id).
INTERNAL_METHODS = frozenset({"PartitionLeader/CoordinatorProduce", "PartitionLeader/WriteTxnMarkers",
                              "PartitionLeader/TxnPartitionsAdded"})
PRODUCE_METHOD, FETCH_METHOD = "PartitionLeader/Produce", "PartitionLeader/Fetch"


def exempt(method: str, request) -> bool:
    """Whether a call is one between the services themselves (INTERNAL_METHODS, or a
    replica's fetch): never throttled, and never held for its principal's mute."""
    return method in INTERNAL_METHODS or bool(getattr(request, "replica_id", ""))


def grpc_client_id(metadata) -> str:
    """The SDK's `client.id`, from the gRPC user agent it sends ("exactly/<client.id> grpc-...");
    "" for other clients."""
    for key, value in metadata or ():
        if key == "user-agent" and isinstance(value, str) and value.startswith("exactly/"):
            return value.split(" ", 1)[0][len("exactly/"):]
    return ""


def throttle_request(manager: QuotaManager, principal: str, client_id: str, method: str, request, response,
                     elapsed_s: float, request_bytes: int | None = None, response_bytes: int | None = None) -> int:
    """Record one handled request against the caller's quotas: its handling time
    (`elapsed_s`, the Timed seconds, plus the CPU a call costs outside its handler,
    `CallOverhead`; request_percentage), a Produce's request bytes (producer_byte_rate)
    and a Fetch's response bytes (consumer_byte_rate). Returns the throttle time in ms
    (the largest of the quotas exceeded), 0 for internal calls.
    `method`: "Service/Method" (authz.method_key); byte counts default to the
    messages' serialized sizes."""
    overhead = manager.overhead.add(elapsed_s)
    if exempt(method, request):
        return 0
    throttle = manager.record_request_time(principal, client_id, elapsed_s + overhead)
    if method == PRODUCE_METHOD:
        size = request.ByteSize() if request_bytes is None else request_bytes
        throttle = max(throttle, manager.record(principal, client_id, PRODUCER_BYTE_RATE, size))
    elif method == FETCH_METHOD and response is not None:
        size = response.ByteSize() if response_bytes is None else response_bytes
        throttle = max(throttle, manager.record(principal, client_id, CONSUMER_BYTE_RATE, size))
    return throttle


def charge_refused(manager: QuotaManager, principal: str, client_id: str) -> int:
    """Record a call refused before its handler ran (throttled, or denied by the
    authorizer) against request_percentage: what a call costs outside its handler
    (`CallOverhead`), so that refused calls are not free. Returns the throttle time in ms."""
    return manager.record_request_time(principal, client_id, manager.overhead.add(0.0))


class Timed:
    """Await `coro` and keep in `seconds` the time spent running it: the synchronous
    steps of its coroutine chain on the event loop, not the time it waited (for data,
    replication, ZooKeeper, a thread). What request_percentage measures, as Kafka
    counts a request's thread time but not its time in purgatory. `clock`: () ->
    seconds, time.perf_counter by default."""

    def __init__(self, awaitable, clock: Callable[[], float] = time.perf_counter):
        # A coroutine steps itself; any other awaitable through its __await__ iterator.
        self.coro = awaitable if hasattr(awaitable, "send") else awaitable.__await__()
        self.clock = clock
        self.seconds = 0.0

    def __await__(self):
        coro, value, error, clock = self.coro, None, None, self.clock
        while True:
            start = clock()
            try:
                step = coro.throw(error) if error is not None else coro.send(value)
            except StopIteration as done:
                self.seconds += clock() - start
                return done.value
            except BaseException:
                self.seconds += clock() - start
                raise
            self.seconds += clock() - start
            try:
                value, error = (yield step), None
            except BaseException as exc:  # noqa: BLE001 - cancellation and the like go to the handler
                value, error = None, exc


def _has_throttle_field(message) -> bool:
    return message is not None and "throttle_time_ms" in message.DESCRIPTOR.fields_by_name


class QuotaInterceptor(grpc.aio.ServerInterceptor):
    """gRPC server interceptor after authentication (auth.current_principal is set)
    that records each handled request (`throttle_request`), puts the throttle time in
    the response's `throttle_time_ms` when it has one and mutes what is over its
    quota (KIP-219); and the `gate` of auth.AuthInterceptor, which calls `admit`
    between authentication and authorization, and `denied` for a call the authorizer
    refused. `manager` may be set after the server was built (None: no quotas).

    A muted caller's call is held until the mute ends, by the server whatever the
    client does: one whose deadline comes first is held to its deadline and answered
    THROTTLING_QUOTA_EXCEEDED with the time left in `throttle_time_ms`, never handled
    (a client with 0.3 s deadlines once wrote 19x its byte rate, each call waiting
    only until its deadline and then handled). Held calls keep their HTTP/2 stream,
    so a connection's `exactly.max.concurrent.streams` bounds what a muted client
    sends meanwhile. A client id longer than MAX_CLIENT_ID_LENGTH is refused with
    INVALID_ARGUMENT."""

    def __init__(self, manager: QuotaManager | None = None):
        self.manager = manager

    async def admit(self, principal: str, method: str, request, context):
        """None when the call may go on (after waiting out the caller's mute), else the
        response answering it throttled. Aborts with INVALID_ARGUMENT for a client id
        longer than MAX_CLIENT_ID_LENGTH."""
        manager = self.manager
        client_id = grpc_client_id(context.invocation_metadata() if context is not None else ())
        if (bad := client_id_error(client_id)) is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"INVALID_REQUEST: {bad}")
        if manager is None or exempt(method, request):
            return None
        left_ms = await _hold(manager, principal, client_id, context)
        if left_ms <= 0:
            return None
        charge_refused(manager, principal, client_id)
        return throttled_response(method, request, int(math.ceil(left_ms)))

    def denied(self, principal: str, context) -> None:
        """A call the authorizer refused: charged to the caller's request_percentage."""
        if self.manager is not None and self.manager.configs():
            charge_refused(self.manager, principal,
                           grpc_client_id(context.invocation_metadata() if context is not None else ()))

    async def intercept_service(self, continuation, handler_call_details):
        from . import authz
        from .auth import current_principal
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        method = authz.method_key(handler_call_details.method)
        interceptor = self

        async def behavior(request, context):
            manager = interceptor.manager
            client_id = grpc_client_id(context.invocation_metadata() if context is not None else ())
            token = current_client_id.set(client_id)
            try:
                if manager is None:
                    return await inner(request, context)
                principal = current_principal.get()
                if not manager.configs():  # no quota set: nothing to time or record
                    response, throttle = await inner(request, context), 0
                else:
                    timed = Timed(inner(request, context))
                    response = await timed
                    throttle = throttle_request(manager, principal, client_id, method, request, response,
                                                timed.seconds)
                if _has_throttle_field(response):
                    throttle = max(throttle, response.throttle_time_ms)
                    response.throttle_time_ms = throttle
                manager.mute(principal, client_id, throttle)
                return response
            finally:
                current_client_id.reset(token)

        return grpc.unary_unary_rpc_method_handler(behavior, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)


# What a held call keeps of its deadline to be answered in (s).
_ANSWER_MARGIN_S = 0.05


async def _hold(manager: QuotaManager, principal: str, client_id: str, context) -> float:
    """Wait while the caller is muted, up to the call's deadline less _ANSWER_MARGIN_S;
    returns the ms of the mute still left then (0: the call may be handled)."""
    import asyncio
    time_remaining = getattr(context, "time_remaining", None)
    while True:
        muted_s = manager.muted_ms(principal, client_id) / 1000.0
        if muted_s <= 0:
            return 0.0
        remaining = time_remaining() if time_remaining is not None else None
        if remaining is not None and remaining - _ANSWER_MARGIN_S <= 0:
            return muted_s * 1000.0
        await asyncio.sleep(muted_s if remaining is None else min(muted_s, remaining - _ANSWER_MARGIN_S))


def throttled_response(method: str, request, throttle_ms: int):
    """The response of `method` ("Service/Method") answering `request` with
    THROTTLING_QUOTA_EXCEEDED in each of its error fields (authz.denied_response) and
    `throttle_ms` in its throttle_time_ms when it has one."""
    from exactly_wire.error_codes import ErrorCode
    from . import authz
    service, _, name = method.partition("/")
    response = authz.denied_response(service, name, request, authz.Denied(
        ErrorCode.THROTTLING_QUOTA_EXCEEDED, f"the caller is over its quota; retry in {throttle_ms} ms (KIP-219)"))
    if _has_throttle_field(response):
        response.throttle_time_ms = throttle_ms
    return response
