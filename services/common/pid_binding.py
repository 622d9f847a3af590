"""No producer-id hijacking: a producer id is bound to the principal it was issued to.

The KIP-98 design document ("Authorization") leaves it to future work that a principal
with Write on a topic can send batches under another producer's id: append into that
producer's open transaction, or bump its epoch and fence it. With the authorizer on,
Exactly closes this:

- **Registration.** A transaction coordinator answers InitProducerId only after it
  wrote the binding `/exactly/producer_ids/<producer id>` = {"principal",
  "transactional_id"} to ZooKeeper (the principal of the call, or of the client a
  service forwards the request for). A transactional.id initialised again by another
  principal with Write on it rebinds its producer id to that principal (the previous
  one is fenced anyway).
- **Check.** A partition leader appends a client's idempotent or transactional batch
  only when the batch's producer id is bound to the caller's principal and, for a
  transactional batch, to the transactional.id the request carries. Anything else is
  refused before the producer state is touched (TRANSACTIONAL_ID_AUTHORIZATION_FAILED
  for a transactional batch, CLUSTER_AUTHORIZATION_FAILED for an idempotent one), so
  the victim's sequence and epoch do not move. A group coordinator checks the same
  for TxnOffsetCommit.

Why it holds across failover: the binding is not coordinator or leader state. It sits
in ZooKeeper, written before the producer id is handed out and writable only by the
cluster's identity (`zookeeper.set.acl`), so a new transaction coordinator, a new
partition leader or a restarted one reads the same answer. Leaders cache bindings; a
batch that does not match the cached binding reads it again (after a ZooKeeper sync)
before it is refused, so a rebinding is seen at once. docs/design.md, "Security".
"""
from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass

from kazoo.exceptions import NoNodeError, NodeExistsError

from exactly_wire.error_codes import ErrorCode

BINDINGS = "/exactly/producer_ids"
CACHE_SIZE = 100_000


@dataclass(frozen=True)
class Binding:
    """Who a producer id was issued to: principal ("User:alice") and transactional.id
    ("" for an idempotent producer)."""
    principal: str
    transactional_id: str = ""

    def to_json(self) -> bytes:
        return json.dumps({"principal": self.principal, "transactional_id": self.transactional_id}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Binding":
        body = json.loads(data)
        return cls(str(body["principal"]), str(body.get("transactional_id", "")))


def refusal(binding: Binding | None, producer_id: int, principal: str, transactional_id: str,
            transactional: bool) -> str | None:
    """Why a batch of `producer_id` from `principal` is refused (None: it is not).
    A transactional batch must also carry the transactional.id the id was issued for."""
    if binding is None:
        return f"producer id {producer_id} was not issued by a transaction coordinator of this cluster"
    if binding.principal != principal:
        return f"producer id {producer_id} was issued to another principal, not {principal}"
    if transactional and binding.transactional_id != transactional_id:
        return (f"producer id {producer_id} was issued for transactional.id {binding.transactional_id!r}, "
                f"not {transactional_id!r}")
    return None


def refusal_code(transactional: bool) -> ErrorCode:
    """Kafka's error for a refused batch: the transactional.id's for a transactional
    batch, the Cluster's (IdempotentWrite) for an idempotent one."""
    return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED if transactional \
        else ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class ProducerIdBindings:
    """The bindings in ZooKeeper, with a bounded cache (see the module docstring).

    zk: a started KazooClient of the cluster identity. `bind` blocks (call it in a
    thread); `check` is a coroutine."""

    def __init__(self, zk, cache_size: int = CACHE_SIZE):
        self._zk = zk
        self._cache: OrderedDict[int, Binding] = OrderedDict()
        self._cache_size = cache_size

    def bind(self, producer_id: int, principal: str, transactional_id: str = "") -> None:
        """Record that `producer_id` belongs to `principal` (and `transactional_id`).
        Raises kazoo errors when ZooKeeper cannot be written (the InitProducerId then
        fails with a retriable error and hands out nothing)."""
        binding = Binding(principal, transactional_id)
        path = f"{BINDINGS}/{producer_id}"
        try:
            self._zk.create(path, binding.to_json(), makepath=True)
        except NodeExistsError:
            self._zk.set(path, binding.to_json())
        self._remember(producer_id, binding)

    def lookup(self, producer_id: int) -> Binding | None:
        """The binding as ZooKeeper has it now (after a sync), cached; blocks."""
        path = f"{BINDINGS}/{producer_id}"
        try:
            self._zk.sync(path)
            data, _ = self._zk.get(path)
        except NoNodeError:
            return None
        binding = Binding.from_json(data)
        self._remember(producer_id, binding)
        return binding

    def _remember(self, producer_id: int, binding: Binding) -> None:
        self._cache[producer_id] = binding
        self._cache.move_to_end(producer_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def check(self, producer_id: int, principal: str, transactional_id: str,
                    transactional: bool) -> str | None:
        """None when `principal` may write batches of `producer_id`, else the reason.
        A cached binding that allows it answers at once; otherwise ZooKeeper is read."""
        cached = self._cache.get(producer_id)
        if cached is not None and refusal(cached, producer_id, principal, transactional_id, transactional) is None:
            return None
        binding = await asyncio.to_thread(self.lookup, producer_id)
        return refusal(binding, producer_id, principal, transactional_id, transactional)
