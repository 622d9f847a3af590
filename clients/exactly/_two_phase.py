"""KIP-939's two-phase commit on the client side: the state of a prepared transaction and
its completion from any process.

`Producer.prepare_transaction()` flushes and seals the open transaction at the coordinator
(PrepareTxn) and returns a `PreparedTxnState` (transactional.id, PID, epoch); any process may
then decide its outcome with `complete_transaction(prepared, conf, commit=...)` (EndTxn with
that PID and epoch). The coordinator never aborts a prepared transaction by itself; a new
producer instance calling init_transactions() with the same transactional.id aborts it
(KIP-939's keepPreparedTxn=false), while `init_transactions(keep_prepared_txn=True)` keeps it
under a new epoch that fences every earlier instance, and `Producer.complete_transaction(state)`
then commits it when `state` (read back from the external transaction manager, e.g. a
database) is the prepared one and aborts it otherwise. `producer.decide_prepared_transaction`
is the operator's decision of one whose application does not come back (docs/design.md,
"Two-phase commit with a database").
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from exactly_wire.v1 import exactly_pb2 as pb

from . import errors
from ._client import COORDINATOR_TRANSACTION, ClientCore, is_retriable
from ._txn_manager import normalize
from .config import ProducerSchema, parse


class PreparedTxnState(NamedTuple):
    """KIP-939's PreparedTxnState: a transaction sealed by
    `Producer.prepare_transaction()`, to be completed by `Producer.complete_transaction()`
    or `exactly.complete_transaction()`: its transactional.id, producer id (PID) and
    producer epoch. Plain values (picklable, JSON-friendly); `serialize()` gives a
    short string ("<pid>:<epoch>:<transactional.id>") that `deserialize` reads back."""

    transactional_id: str
    producer_id: int
    epoch: int

    def serialize(self) -> str:
        """The state as "<producer id>:<epoch>:<transactional.id>"."""
        return f"{self.producer_id}:{self.epoch}:{self.transactional_id}"

    @classmethod
    def deserialize(cls, text: str) -> "PreparedTxnState":
        """Read back `serialize()`'s string. Raises ValueError for any other text."""
        try:
            pid, epoch, tid = str(text).split(":", 2)
            return cls(tid, int(pid), int(epoch))
        except ValueError:
            raise ValueError(f"not a serialized PreparedTxnState: {text!r}") from None


# The name this SDK used before KIP-939's (the Spark sink's two-phase commit).
PreparedTransaction = PreparedTxnState


def complete_transaction(prepared: PreparedTxnState | tuple[str, int, int], conf: Mapping[str, Any] | str,
                         commit: bool = True, timeout: float | None = None) -> None:
    """Second phase of a two-phase commit: commit (commit=True) or abort the
    transaction sealed by `Producer.prepare_transaction()`, from any process, with
    EndTxn carrying its PID and epoch. `prepared`: a PreparedTxnState or a
    (transactional_id, producer_id, epoch) tuple; `conf`: producer settings
    (`config.ProducerSchema`, bootstrap.servers required), or the bootstrap.servers
    string itself; `timeout` in
    seconds (default request.timeout.ms). Idempotent: completing again with the same
    decision succeeds. Returns once the coordinator has logged the decision; the
    transaction markers follow within milliseconds (the coordinator rolls them forward
    after a failover).

    Raises errors.ProducerFencedError when the transactional.id has a newer epoch
    (a new producer instance initialised: it aborted the transaction, or kept it to
    decide it itself);
    errors.InvalidTxnStateError when it was completed the other way, or has no
    transaction; errors.InvalidProducerIdMappingError for an unknown PID;
    errors.KafkaTimeoutError when the coordinator does not answer in time (call again).
    """
    tid, pid, epoch = prepared
    settings = {"bootstrap.servers": conf} if isinstance(conf, str) else dict(conf)
    core = ClientCore(parse(ProducerSchema, settings))
    try:
        timeout_s = core.request_timeout_s if timeout is None else timeout
        req = pb.EndTxnRequest(transactional_id=tid, producer_id=int(pid), producer_epoch=int(epoch),
                               committed=bool(commit))
        try:
            core.coordinator_call(tid, COORDINATOR_TRANSACTION, lambda addr: core.txn_stub(addr).EndTxn, req,
                                  timeout_s=timeout_s)
        except errors.ExactlyError as exc:
            if is_retriable(exc):
                raise errors.KafkaTimeoutError(
                    f"EndTxn({'commit' if commit else 'abort'}) of {tid!r} did not succeed within "
                    f"{timeout_s:.1f} s: {exc}") from exc
            raise normalize(exc) from None
    finally:
        core.close()

__all__ = ["PreparedTxnState", "PreparedTransaction", "complete_transaction"]
