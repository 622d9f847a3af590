"""AdminClient: create and describe topics, list and describe transactions."""
from __future__ import annotations

import time
from typing import Any, Iterable, Mapping, NamedTuple

from . import errors
from .config import AdminSchema, parse
from ._client import COORDINATOR_TRANSACTION, ClientCore
from exactly_wire.error_codes import ErrorCode
from .types import NewTopic
from exactly_wire.v1 import exactly_pb2 as pb


class PartitionDescription(NamedTuple):
    partition: int
    leader: str | None  # "host:port" of the live leader, None when there is none
    leader_id: str | None
    replicas: tuple[str, ...]
    isr: tuple[str, ...]


class TopicDescription(NamedTuple):
    name: str
    internal: bool
    partitions: dict[int, PartitionDescription]


class TransactionListing(NamedTuple):
    transactional_id: str
    producer_id: int
    state: str


class TransactionDescription(NamedTuple):
    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int
    partitions: tuple[tuple[str, int], ...]


class AdminClient:
    """Administrative operations. `conf`: the keys of `config.AdminSchema`
    (bootstrap.servers required; request.timeout.ms, retry.backoff.ms, ...).
    Raises errors.ConfigurationError for an unknown key or a wrong value."""

    def __init__(self, conf: Mapping[str, Any]):
        self._core = ClientCore(parse(AdminSchema, conf).as_dict())

    def create_topics(self, new_topics: Iterable[NewTopic], timeout: float | None = None) -> None:
        """Create topics and return when every new partition has a leader that
        answers requests. `timeout` in seconds (default request.timeout.ms, at least 30 s).

        Raises errors.TopicAlreadyExistsError when a topic exists (the other topics
        are still created and waited for); errors.InvalidTopicException for a bad
        or reserved ('__' prefix) name, errors.InvalidPartitionsError for fewer than
        1 partition, errors.InvalidReplicationFactorError for a replication factor
        below 1 or above the live partition leaders; errors.KafkaTimeoutError when
        the topics do not serve in time.
        docs/design.md, "Decisions"."""
        topics = list(new_topics)
        if not topics:
            return
        for t in topics:
            if not isinstance(t, NewTopic):
                raise TypeError(f"expected NewTopic, not {type(t).__name__}")
        timeout_s = max(self._core.request_timeout_s, 30.0) if timeout is None else timeout
        deadline = time.monotonic() + timeout_s
        core = self._core
        req = pb.CreateTopicsRequest(
            timeout_ms=int(timeout_s * 1000),
            topics=[pb.CreatableTopic(name=t.name, num_partitions=t.num_partitions,
                                      replication_factor=t.replication_factor,
                                      configs={str(k): str(v) for k, v in (t.config or {}).items()})
                    for t in topics])
        tried = [0]

        def _create():
            tried[0] += 1
            return core.call(core.cluster_stub().CreateTopics, req)

        resp = core.retry(_create, timeout_s)
        failures: list[errors.ExactlyError] = []
        created = []
        for r in resp.topics:
            # After a lost answer, a retry finds the topic created by the first try.
            if r.error_code == ErrorCode.NONE or (r.error_code == ErrorCode.TOPIC_ALREADY_EXISTS and tried[0] > 1):
                created.append(r.name)
            else:
                code_name = errors.for_code(r.error_code).code.name
                failures.append(errors.for_code(r.error_code, f"topic {r.name!r}: {r.error_message or code_name}"))
        self._wait_serving(created, deadline)
        if failures:
            raise failures[0]

    def _wait_serving(self, topics: list[str], deadline: float) -> None:
        core = self._core
        pending = set(topics)
        backoff = core.retry_backoff_ms / 1000.0
        while pending:
            try:
                md = core.metadata(pending, refresh=True)
                for topic in sorted(pending):
                    parts = md.partitions(topic)
                    if parts and all(self._leader_answers(md.leader(topic, p), topic, p) for p in parts):
                        pending.discard(topic)
            except errors.ExactlyError as exc:
                if not exc.retriable:
                    raise
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise errors.KafkaTimeoutError(f"topics {sorted(pending)} do not serve yet")
            time.sleep(backoff)
            backoff = min(backoff * 2, core.retry_backoff_max_ms / 1000.0)

    def _leader_answers(self, address: str | None, topic: str, partition: int) -> bool:
        if address is None:
            return False
        core = self._core
        req = pb.ListOffsetsRequest(topics=[pb.ListOffsetsTopic(
            name=topic, partitions=[pb.ListOffsetsPartition(partition=partition, timestamp=-1)])])
        try:
            resp = core.call(core.leader_stub(address).ListOffsets, req, timeout_s=min(core.request_timeout_s, 5.0))
        except errors.ExactlyError:
            return False
        return all(p.error_code == ErrorCode.NONE for t in resp.topics for p in t.partitions)

    def list_topics(self, include_internal: bool = False) -> dict[str, list[int]]:
        """Topic name -> sorted partition ids (internal topics only if asked)."""
        md = self._core.metadata(refresh=True)
        return {name: md.partitions(name) for name, t in sorted(md.topics.items())
                if t.error_code == ErrorCode.NONE and (include_internal or not t.is_internal)}

    def describe_topics(self, topics: Iterable[str] | None = None) -> dict[str, TopicDescription]:
        """Topic name -> TopicDescription (partitions with leader address, replicas,
        ISR). Raises errors.UnknownTopicOrPartitionError for a named unknown topic."""
        md = self._core.metadata(refresh=True)
        names = sorted(md.topics) if topics is None else list(topics)
        out = {}
        for name in names:
            t = md.topics.get(name)
            if t is None or t.error_code != ErrorCode.NONE:
                raise errors.UnknownTopicOrPartitionError(f"unknown topic {name!r}")
            out[name] = TopicDescription(name, t.is_internal, {
                p.partition: PartitionDescription(p.partition, md.leader(name, p.partition), p.leader_id,
                                                  p.replicas, p.isr)
                for p in sorted(t.partitions.values(), key=lambda p: p.partition)})
        return out

    def _txn_coordinators(self) -> list[str]:
        md = self._core.metadata(refresh=True)
        return sorted(n.address for n in md.nodes.values() if n.role == "txn_coordinator")

    def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = ()
                          ) -> list[TransactionListing]:
        """Transactions known to every live transaction coordinator, optionally
        filtered by state name ("Ongoing", "PrepareCommit", ...) and PID."""
        core = self._core
        req = pb.ListTransactionsRequest(state_filters=list(states), producer_id_filters=list(producer_ids))
        out = []
        for addr in self._txn_coordinators():
            resp = core.retry(lambda a=addr: core.call(core.txn_stub(a).ListTransactions, req))
            errors.check(resp.error_code)
            out.extend(TransactionListing(t.transactional_id, t.producer_id, t.state)
                       for t in resp.transaction_states)
        return sorted(out)

    def describe_transactions(self, transactional_ids: Iterable[str]) -> dict[str, TransactionDescription]:
        """transactional.id -> TransactionDescription, asked of each id's coordinator.
        Raises the error of an id the coordinator cannot describe
        (e.g. errors.TransactionalIdNotFoundError)."""
        core = self._core
        out = {}
        for tid in transactional_ids:
            resp = core.coordinator_call(
                tid, COORDINATOR_TRANSACTION, lambda a: core.txn_stub(a).DescribeTransactions,
                pb.DescribeTransactionsRequest(transactional_ids=[tid]),
                error_code=lambda r: r.transaction_states[0].error_code if r.transaction_states else 0)
            for d in resp.transaction_states:
                out[d.transactional_id] = TransactionDescription(
                    d.transactional_id, d.state, d.producer_id, d.producer_epoch, d.transaction_timeout_ms,
                    d.transaction_start_time_ms,
                    tuple(sorted((t.topic, p) for t in d.topics for p in t.partitions)))
        return out

    def close(self) -> None:
        """Release connections. Idempotent."""
        self._core.close()

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


__all__ = ["AdminClient", "TopicDescription", "PartitionDescription", "TransactionListing",
           "TransactionDescription"]
