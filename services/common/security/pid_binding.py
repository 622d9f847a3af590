"""No producer-id hijacking: a producer id is bound to the principal it was issued to.

The KIP-98 design document ("Authorization") leaves it to future work that a principal
with Write on a topic can send batches under another producer's id: append into that
producer's open transaction, or bump its epoch and fence it. With the authorizer on,
Exactly closes this (docs/design.md, "Producer-id bindings"):

- **Registration.** A transaction coordinator answers InitProducerId only after it
  appended the binding {principal, transactional.id} of the producer id to its log,
  `TRANSACTION_STATE_TOPIC`, in partition producer id % n: it issues a producer id only
  with the residue of a partition it owns (the transactional.id's partition for a
  transactional producer). A transactional.id initialised again by another principal
  with Write on it rebinds its producer id to that principal (the previous one is
  fenced anyway). No ZooKeeper write per producer id.
- **Expiry.** A binding expires with its producer state: an idempotent producer's
  producer.id.expiration.ms after its last use (InitProducerId or a check below), a
  transactional producer's once its transactional.id no longer holds the producer id
  (expired after transactional.id.expiration.ms, or rotated) and it was not used for
  transactional.id.expiration.ms. The coordinator writes a tombstone.
- **Check.** A partition leader appends a client's idempotent or transactional batch
  only when the batch's producer id is bound to the caller's principal and, for a
  transactional batch, to the transactional.id the request carries; it asks the
  coordinator owning partition producer id % n (VerifyProducerId, a service-only
  call) on the first sight of the (producer id, principal, transactional.id) and
  caches the answer, asking again after a quarter of producer.id.expiration.ms so
  that an active producer's binding stays alive. Anything else is refused before the
  producer state is touched (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for a
  transactional batch, CLUSTER_AUTHORIZATION_FAILED for an idempotent one), so the
  victim's sequence and epoch do not move; except that an idempotent batch whose
  producer id is bound to no one (expired after the producer idled, or never issued)
  gets UNKNOWN_PRODUCER_ID, Kafka's answer for a producer id whose state expired:
  the producer takes a new producer id (bound to itself) and sends again. A group
  coordinator checks the same for TxnOffsetCommit.

Why it holds across failover: the binding is in the replicated log the coordinators
replay when they take a partition over (appended with the owner's writer id, so a
deposed owner cannot write one), and the owner of a producer id's binding follows from
the producer id alone. While no coordinator answers, a batch is refused with a
retriable error, never appended unchecked.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

import grpc
from tenacity import AsyncRetrying, retry_if_result, stop_after_delay, wait_exponential_jitter

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from ..transport.connections import TokenBucket
from ..transport.rpc import transport_error_code
from ..transport.tunnel import method_path

if TYPE_CHECKING:
    from services.txn_coordinator.txn_log import ProducerIdBinding

log = logging.getLogger(__name__)

CACHE_SIZE = 100_000
_VERIFY = method_path("TransactionCoordinator", "VerifyProducerId")
# Answers after which asking again may succeed: the owner moves or loads.
_RETRY_CODES = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                          ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NETWORK_EXCEPTION,
                          ErrorCode.REQUEST_TIMED_OUT})


def refusal(binding: "ProducerIdBinding | None", producer_id: int, principal: str, transactional_id: str,
            transactional: bool) -> tuple[ErrorCode, str] | None:
    """Why a batch of `producer_id` from `principal` is refused, as (error, why), or
    None when it is not. A transactional batch must also carry the transactional.id
    the id was issued for. Errors: see `refusal_code`."""
    if binding is None:
        return refusal_code(transactional, bound=False), (
            f"producer id {producer_id} is not bound: not issued by a transaction coordinator of this cluster, "
            "or expired")
    if binding.principal != principal:
        return refusal_code(transactional), f"producer id {producer_id} was issued to another principal, not {principal}"
    if transactional and binding.transactional_id != transactional_id:
        return refusal_code(transactional), (
            f"producer id {producer_id} was issued for transactional.id {binding.transactional_id!r}, "
            f"not {transactional_id!r}")
    return None


def refusal_code(transactional: bool, bound: bool = True) -> ErrorCode:
    """Kafka's error for a refused batch: the transactional.id's for a transactional
    batch, the Cluster's (IdempotentWrite) for an idempotent one, and for an
    idempotent one whose producer id is bound to no one (`bound` False: expired or
    never issued) UNKNOWN_PRODUCER_ID, on which the producer takes a new producer id."""
    if transactional:
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    return ErrorCode.CLUSTER_AUTHORIZATION_FAILED if bound else ErrorCode.UNKNOWN_PRODUCER_ID


# A leader's or group coordinator's allowed answer is trusted for this part of
# producer.id.expiration.ms, so an active producer's binding is used (kept alive) in time.
REFRESHES_PER_EXPIRATION = 4
# The answers of VerifyProducerId that end a check.
_FINAL_REFUSALS = frozenset({ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                             ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ErrorCode.UNKNOWN_PRODUCER_ID})


class RatePerPrincipal:
    """A token bucket per principal: `rate` calls per second, bursts of `rate` calls
    (at least one). clock: monotonic seconds. Buckets of principals idle for a
    minute are dropped (so the map is bounded by the principals active in a minute)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._swept = clock()

    def acquire(self, principal: str) -> int:
        """Take one call for `principal`: 0 when allowed, else the ms until it would be."""
        now = self._clock()
        if now - self._swept > 60:
            self._buckets = {p: b for p, b in self._buckets.items() if now - b.stamp < 60}
            self._swept = now
        bucket = self._buckets.get(principal)
        if bucket is None:
            bucket = self._buckets[principal] = TokenBucket(self.rate, self._clock)
        return 0 if bucket.take() else bucket.wait_ms()


class ProducerIdBindings:
    """The check of partition leaders and group coordinators (see the module
    docstring): asks the transaction coordinator owning a producer id's binding, and
    caches what it allowed.

    cluster: ClusterState (coordinator ownership); client: ClusterClient (the tunnel
    to the coordinator, as the service's principal); expiration_ms: the process's
    producer.id.expiration.ms (ms; the coordinators' binding expiry, the same setting):
    an allowed answer is trusted for 1 / REFRESHES_PER_EXPIRATION of it before it is
    asked again; backoff_ms / backoff_max_ms: retry backoff while the owner moves or loads."""

    def __init__(self, cluster, client, expiration_ms: int, cache_size: int = CACHE_SIZE,
                 backoff_ms: int = 20, backoff_max_ms: int = 1000, clock: Callable[[], float] = time.monotonic):
        self.cluster = cluster
        self.client = client
        self.refresh_s = expiration_ms / 1000 / REFRESHES_PER_EXPIRATION
        self.backoff_ms = backoff_ms
        self.backoff_max_ms = backoff_max_ms
        self.clock = clock
        self._cache: OrderedDict[tuple[int, str, str, bool], float] = OrderedDict()  # -> trusted until
        self._cache_size = cache_size

    async def check(self, producer_id: int, principal: str, transactional_id: str, transactional: bool,
                    deadline: float | None = None) -> tuple[ErrorCode, str]:
        """Whether `principal` may write batches of `producer_id` (for a transactional
        batch: of `transactional_id`). deadline: clock seconds (default: 5 s from now).
        Returns (NONE, ""); (TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        CLUSTER_AUTHORIZATION_FAILED or UNKNOWN_PRODUCER_ID, why) when it is not bound
        so (`refusal_code`); or (NOT_ENOUGH_REPLICAS, why) when no coordinator answered
        in time (retriable; nothing may be appended)."""
        key = (producer_id, principal, transactional_id if transactional else "", transactional)
        now = self.clock()
        until = self._cache.get(key)
        if until is not None and until > now:
            return ErrorCode.NONE, ""
        if deadline is None:
            deadline = now + 5.0
        remaining = deadline - now
        code, why = ErrorCode.REQUEST_TIMED_OUT, ""
        if remaining > 0:
            code, why = await AsyncRetrying(
                stop=stop_after_delay(remaining), retry=retry_if_result(lambda r: r[0] in _RETRY_CODES),
                wait=wait_exponential_jitter(initial=self.backoff_ms / 1000, max=self.backoff_max_ms / 1000,
                                             jitter=self.backoff_ms / 1000),
                retry_error_callback=lambda state: state.outcome.result(),
            )(self._ask, producer_id, principal, transactional_id, transactional, deadline)
        if code == ErrorCode.NONE:
            self._cache[key] = self.clock() + self.refresh_s
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return ErrorCode.NONE, ""
        self._cache.pop(key, None)
        if code in _FINAL_REFUSALS:
            return ErrorCode(code), why
        log.info("producer id %d of %s: its binding could not be checked (%s)", producer_id, principal,
                 ErrorCode(code).name if code in ErrorCode._value2member_map_ else code)
        return ErrorCode.NOT_ENOUGH_REPLICAS, f"the binding of producer id {producer_id} could not be checked; retry"

    async def _ask(self, producer_id: int, principal: str, transactional_id: str, transactional: bool,
                   deadline: float) -> tuple[int, str]:
        node = await self.cluster.lookup_coordinator_of_partition("txn", producer_id)
        if node is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, ""
        request = pb.VerifyProducerIdRequest(producer_id=producer_id, principal=principal,
                                             transactional_id=transactional_id, transactional=transactional)
        try:
            resp = await self.client.tunnel(node.address).call(
                _VERIFY, request, pb.VerifyProducerIdResponse, max(deadline - self.clock(), 0.05))
        except grpc.RpcError as exc:
            return transport_error_code(exc), ""
        except asyncio.TimeoutError:
            return ErrorCode.REQUEST_TIMED_OUT, ""
        return resp.error_code, resp.error_message
