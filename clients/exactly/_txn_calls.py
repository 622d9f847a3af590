"""The coordinator requests of a producer's transaction flows, one class per RPC (as
aiokafka's sender gives each coordinator call its handler: `InitPIDHandler`,
`AddOffsetsHandler`, `EndTxnHandler`, ...).

Each call builds its request from the producer's `TransactionManager` when it is made,
names the RPC that carries it (`rpc`: the generated stub's method, in code, so a reader
and a type checker find it), says where it goes (the coordinator of `key`) and how its
answer reads (`error_code`; `outcome` applies a successful answer to the transaction
state). A flow yields the call; the producer's driver sends it with the client core's
`coordinator_call` (retrying coordinator moves and retriable errors until `timeout_s`)
and sends the answer back into the flow, or throws the error in. KIP-98 design document,
"Data Flow" steps 2 (InitProducerId), 4.3 (AddOffsetsToTxn), 4.4 (TxnOffsetCommit) and
5.1 (EndTxn); KIP-447 (the group metadata of TxnOffsetCommit; the group-aware fields of
its draft); KIP-939 (PrepareTxn, keepPreparedTxn).
"""
from __future__ import annotations

import abc
import collections
import logging
from typing import Any, Callable, Iterable, Mapping

from exactly_wire.v1 import exactly_pb2 as pb

from ._client import COORDINATOR_GROUP, CoreBase, txn_coordinator_key
from ._txn_manager import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TransactionManager
from .types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition

# The calls log as the Producer did before they had a module of their own.
log = logging.getLogger("exactly.producer")


class CoordinatorCall(abc.ABC):
    """One request to the coordinator of `key` (`key_type`: COORDINATOR_GROUP or
    COORDINATOR_TRANSACTION...), sent within `timeout_s` seconds."""

    key: str
    key_type: int
    request: Any
    timeout_s: float

    @abc.abstractmethod
    def rpc(self, core: CoreBase, address: str) -> Callable[..., Any]:
        """The stub method of the coordinator at `address` that carries the request."""

    def error_code(self, response: Any) -> int:
        """The error code of `response` (0: success)."""
        return response.error_code

    def outcome(self, response: Any) -> None:
        """Apply a successful answer to the producer's transaction state (nothing here)."""


class _TxnCoordinatorCall(CoordinatorCall):
    """A request of the transactional producer `transactional_id` to its transaction
    coordinator (that of its consumer group when it is group-aware: KIP-447 draft)."""

    def __init__(self, transactional_id: str, txn: TransactionManager, timeout_s: float):
        self.key, self.key_type = txn_coordinator_key(transactional_id, txn.group_id)
        self.timeout_s = timeout_s


def group_fields(txn: TransactionManager) -> dict[str, Any]:
    """consumer_group_id / generation_id of a group-aware producer's transactional
    requests (KIP-447 draft); empty for the others."""
    return {"consumer_group_id": txn.group_id, "generation_id": txn.generation_id} if txn.group_id else {}


class InitProducerId(_TxnCoordinatorCall):
    """InitProducerId: the producer id and a new epoch for the transactional.id, which
    fences older instances (step 2 of the data flow). `bump` passes the current PID and
    epoch so the coordinator bumps the epoch (KIP-360); a group-aware producer sends its
    group, generation and `assigned` input partitions; `keep_prepared_txn` keeps a
    prepared transaction (KIP-939)."""

    def __init__(self, transactional_id: str, txn: TransactionManager, txn_timeout_ms: int, timeout_s: float,
                 bump: bool = False, assigned: Iterable[TopicPartition] = (), keep_prepared_txn: bool = False):
        super().__init__(transactional_id, txn, timeout_s)
        self.transactional_id, self.txn, self.keep_prepared_txn = transactional_id, txn, keep_prepared_txn
        self.request = pb.InitProducerIdRequest(
            transactional_id=transactional_id or "", transaction_timeout_ms=txn_timeout_ms,
            producer_id=txn.producer_id if bump else NO_PRODUCER_ID,
            producer_epoch=txn.producer_epoch if bump else NO_PRODUCER_EPOCH,
            keep_prepared_txn=keep_prepared_txn, **group_fields(txn))
        if txn.group_id:
            by_topic: dict[str, list[int]] = collections.defaultdict(list)
            for tp in assigned:
                by_topic[tp.topic].append(tp.partition)
            self.request.assigned_partitions.extend(pb.TopicPartitions(topic=t, partitions=sorted(ps))
                                                    for t, ps in sorted(by_topic.items()))

    def rpc(self, core: CoreBase, address: str) -> Callable[..., Any]:
        return core.txn_stub(address).InitProducerId

    def outcome(self, resp: pb.InitProducerIdResponse) -> None:
        """Adopt the answer's PID and epoch; with keep_prepared_txn and a kept
        transaction, that transaction's own pair too (KIP-939: this producer talks with
        the new epoch, which fences the previous instance)."""
        if self.keep_prepared_txn and resp.HasField("ongoing_txn_producer_id"):
            self.txn.restore_prepared(resp.producer_id, resp.producer_epoch, resp.ongoing_txn_producer_id,
                                      resp.ongoing_txn_producer_epoch)
            log.info("producer %s: PID %d epoch %d, kept the prepared transaction of PID %d epoch %d",
                     self.transactional_id, resp.producer_id, resp.producer_epoch, resp.ongoing_txn_producer_id,
                     resp.ongoing_txn_producer_epoch)
            return
        self.txn.set_producer_id_and_epoch(resp.producer_id, resp.producer_epoch)
        log.info("producer %s: PID %d epoch %d", self.transactional_id, resp.producer_id, resp.producer_epoch)


class AddOffsetsToTxn(_TxnCoordinatorCall):
    """AddOffsetsToTxn: the consumer group `group_id`'s offsets join the transaction
    (step 4.3); once per group per transaction."""

    def __init__(self, transactional_id: str, txn: TransactionManager, group_id: str, timeout_s: float):
        super().__init__(transactional_id, txn, timeout_s)
        self.txn, self.group_id = txn, group_id
        self.request = pb.AddOffsetsToTxnRequest(
            transactional_id=transactional_id, producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
            group_id=group_id, **group_fields(txn))

    def rpc(self, core: CoreBase, address: str) -> Callable[..., Any]:
        return core.txn_stub(address).AddOffsetsToTxn

    def outcome(self, resp: pb.AddOffsetsToTxnResponse) -> None:
        self.txn.offsets_added(self.group_id)


class TxnOffsetCommit(CoordinatorCall):
    """TxnOffsetCommit to the group coordinator of `group`: the consumed `offsets`
    (TopicPartition -> OffsetAndMetadata or an offset), pending until the transaction
    commits, with the consumer's group metadata, which the coordinator checks against
    the group's generation (KIP-447; step 4.4)."""

    def __init__(self, transactional_id: str, txn: TransactionManager, group: ConsumerGroupMetadata,
                 offsets: Mapping[TopicPartition, OffsetAndMetadata | int], timeout_s: float):
        self.key, self.key_type, self.timeout_s = group.group_id, COORDINATOR_GROUP, timeout_s
        by_topic: dict[str, list[pb.OffsetCommitPartition]] = collections.defaultdict(list)
        for tp, om in sorted(offsets.items()):
            if isinstance(om, int):
                om = OffsetAndMetadata(om)
            by_topic[tp.topic].append(pb.OffsetCommitPartition(
                partition=tp.partition, committed_offset=om.offset, committed_leader_epoch=-1,
                metadata=om.metadata or ""))
        self.request = pb.TxnOffsetCommitRequest(
            transactional_id=transactional_id, group_id=group.group_id,
            producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
            generation_id=group.generation_id, member_id=group.member_id or "",
            group_instance_id=group.group_instance_id or "", group_aware_producer=txn.group_id == group.group_id,
            topics=[pb.OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()])

    def rpc(self, core: CoreBase, address: str) -> Callable[..., Any]:
        return core.group_stub(address).TxnOffsetCommit

    def error_code(self, response: pb.TxnOffsetCommitResponse) -> int:
        """The first partition's error: the coordinator answers each partition."""
        return next((p.error_code for t in response.topics for p in t.partitions if p.error_code), 0)


class EndTxn(_TxnCoordinatorCall):
    """EndTxn(COMMIT or ABORT) of the producer's transaction (step 5.1); the answer
    names the PID and epoch the producer continues with (KIP-890 part 2)."""

    def __init__(self, transactional_id: str, txn: TransactionManager, committed: bool, timeout_s: float):
        super().__init__(transactional_id, txn, timeout_s)
        self.request = pb.EndTxnRequest(transactional_id=transactional_id, producer_id=txn.producer_id,
                                        producer_epoch=txn.producer_epoch, committed=committed, **group_fields(txn))

    def rpc(self, core: CoreBase, address: str) -> Callable[..., Any]:
        return core.txn_stub(address).EndTxn


class PrepareTxn(_TxnCoordinatorCall):
    """PrepareTxn: seal the producer's transaction, the first phase of KIP-939's
    two-phase commit."""

    def __init__(self, transactional_id: str, txn: TransactionManager, timeout_s: float):
        super().__init__(transactional_id, txn, timeout_s)
        self.txn = txn
        self.request = pb.PrepareTxnRequest(transactional_id=transactional_id, producer_id=txn.producer_id,
                                            producer_epoch=txn.producer_epoch, **group_fields(txn))

    def rpc(self, core: CoreBase, address: str) -> Callable[..., Any]:
        return core.txn_stub(address).PrepareTxn

    def outcome(self, resp: pb.PrepareTxnResponse) -> None:
        self.txn.transaction_sealed()


__all__ = ["CoordinatorCall", "InitProducerId", "AddOffsetsToTxn", "TxnOffsetCommit", "EndTxn", "PrepareTxn",
           "group_fields"]
