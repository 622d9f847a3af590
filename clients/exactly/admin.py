"""AdminClient: create and describe topics, list and describe transactions."""
from __future__ import annotations

import time
from typing import Any, Generator, Iterable, Mapping, NamedTuple

from . import errors
from .config import AdminSchema, parse
from ._client import COORDINATOR_TRANSACTION, ClientCore, CoreBase, Metadata, run_flow
from ._sender import txn_coordinator_addresses
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


# The rules of the admin operations, shared with exactly.aio's AIOAdminClient.

def create_topics_request(topics: list[NewTopic], timeout_s: float) -> pb.CreateTopicsRequest:
    """The CreateTopics request for `topics`; raises TypeError for a non-NewTopic."""
    for t in topics:
        if not isinstance(t, NewTopic):
            raise TypeError(f"expected NewTopic, not {type(t).__name__}")
    return pb.CreateTopicsRequest(
        timeout_ms=int(timeout_s * 1000),
        topics=[pb.CreatableTopic(name=t.name, num_partitions=t.num_partitions,
                                  replication_factor=t.replication_factor,
                                  configs={str(k): str(v) for k, v in (t.config or {}).items()})
                for t in topics])


def create_topics_outcome(resp: pb.CreateTopicsResponse, tries: int) -> tuple[list[str], list[errors.ExactlyError]]:
    """(created topic names, errors of the others) of a CreateTopics answer after
    `tries` sends: after a lost answer, a retry finds the topic created by the first try."""
    failures: list[errors.ExactlyError] = []
    created = []
    for r in resp.topics:
        if r.error_code == ErrorCode.NONE or (r.error_code == ErrorCode.TOPIC_ALREADY_EXISTS and tries > 1):
            created.append(r.name)
        else:
            code_name = errors.for_code(r.error_code).code.name
            failures.append(errors.for_code(r.error_code, f"topic {r.name!r}: {r.error_message or code_name}"))
    return created, failures


def leader_probe(topic: str, partition: int) -> pb.ListOffsetsRequest:
    """The ListOffsets a partition's leader must answer before its topic counts as serving."""
    return pb.ListOffsetsRequest(topics=[pb.ListOffsetsTopic(
        name=topic, partitions=[pb.ListOffsetsPartition(partition=partition, timestamp=-1)])])


def probe_answered(resp: pb.ListOffsetsResponse) -> bool:
    return all(p.error_code == ErrorCode.NONE for t in resp.topics for p in t.partitions)


def topic_listing(md: Metadata, include_internal: bool) -> dict[str, list[int]]:
    """Topic name -> sorted partition ids (internal topics only if asked)."""
    return {name: md.partitions(name) for name, t in sorted(md.topics.items())
            if t.error_code == ErrorCode.NONE and (include_internal or not t.is_internal)}


def topic_descriptions(md: Metadata, topics: Iterable[str] | None) -> dict[str, TopicDescription]:
    """Topic name -> TopicDescription from `md`; raises errors.UnknownTopicOrPartitionError
    for a named unknown topic."""
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


def list_transactions_request(states: Iterable[str], producer_ids: Iterable[int]) -> pb.ListTransactionsRequest:
    return pb.ListTransactionsRequest(state_filters=list(states), producer_id_filters=list(producer_ids))


def transaction_listings(resp: pb.ListTransactionsResponse) -> list[TransactionListing]:
    errors.check(resp.error_code)
    return [TransactionListing(t.transactional_id, t.producer_id, t.state) for t in resp.transaction_states]


def describe_transaction_request(transactional_id: str) -> pb.DescribeTransactionsRequest:
    return pb.DescribeTransactionsRequest(transactional_ids=[transactional_id])


def describe_transaction_code(resp: pb.DescribeTransactionsResponse) -> int:
    return resp.transaction_states[0].error_code if resp.transaction_states else 0


def transaction_descriptions(resp: pb.DescribeTransactionsResponse) -> dict[str, TransactionDescription]:
    return {d.transactional_id: TransactionDescription(
        d.transactional_id, d.state, d.producer_id, d.producer_epoch, d.transaction_timeout_ms,
        d.transaction_start_time_ms, tuple(sorted((t.topic, p) for t in d.topics for p in t.partitions)))
        for d in resp.transaction_states}


class RefreshMetadata(NamedTuple):
    """Effect of `wait_serving_flow`: metadata fetched now, for `topics`; outcome: Metadata."""

    topics: frozenset[str]


class ProbeLeader(NamedTuple):
    """Effect of `wait_serving_flow`: whether the leader at `address` answers
    `leader_probe(topic, partition)`; outcome: bool."""

    address: str
    topic: str
    partition: int


class Sleep(NamedTuple):
    """Effect of `wait_serving_flow`: wait `seconds`."""

    seconds: float


def wait_serving_flow(core: CoreBase, topics: list[str], deadline: float) -> Generator:
    """Until every partition of `topics` has a leader that answers (a flow of the
    effects above, see exactly._client.run_flow); raises errors.KafkaTimeoutError
    at `deadline` (time.monotonic() seconds) and non-retriable metadata errors."""
    pending = set(topics)
    backoff = core.retry_backoff_ms / 1000.0
    while pending:
        try:
            md = yield RefreshMetadata(frozenset(pending))
            for topic in sorted(pending):
                parts = md.partitions(topic)
                if not parts:
                    continue
                answers = []
                for p in parts:
                    address = md.leader(topic, p)
                    answers.append(address is not None and (yield ProbeLeader(address, topic, p)))
                if all(answers):
                    pending.discard(topic)
        except errors.ExactlyError as exc:
            if not exc.retriable:
                raise
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise errors.KafkaTimeoutError(f"topics {sorted(pending)} do not serve yet")
        yield Sleep(backoff)
        backoff = min(backoff * 2, core.retry_backoff_max_ms / 1000.0)


def create_topics_timeout_s(core: CoreBase, timeout: float | None) -> float:
    """create_topics' default timeout: request.timeout.ms, at least 30 s."""
    return max(core.request_timeout_s, 30.0) if timeout is None else timeout


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
        timeout_s = create_topics_timeout_s(self._core, timeout)
        deadline = time.monotonic() + timeout_s
        core = self._core
        req = create_topics_request(topics, timeout_s)
        tried = [0]

        def _create():
            tried[0] += 1
            return core.call(core.cluster_stub().CreateTopics, req)

        created, failures = create_topics_outcome(core.retry(_create, timeout_s), tried[0])
        self._wait_serving(created, deadline)
        if failures:
            raise failures[0]

    def _wait_serving(self, topics: list[str], deadline: float) -> None:
        run_flow(wait_serving_flow(self._core, topics, deadline), self._perform)

    def _perform(self, effect: Any) -> Any:
        if isinstance(effect, RefreshMetadata):
            return self._core.metadata(effect.topics, refresh=True)
        if isinstance(effect, ProbeLeader):
            return self._leader_answers(*effect)
        if isinstance(effect, Sleep):
            return time.sleep(effect.seconds)
        raise TypeError(f"unknown effect {effect!r}")

    def _leader_answers(self, address: str, topic: str, partition: int) -> bool:
        core = self._core
        try:
            resp = core.call(core.leader_stub(address).ListOffsets, leader_probe(topic, partition),
                             timeout_s=min(core.request_timeout_s, 5.0))
        except errors.ExactlyError:
            return False
        return probe_answered(resp)

    def list_topics(self, include_internal: bool = False) -> dict[str, list[int]]:
        """Topic name -> sorted partition ids (internal topics only if asked)."""
        return topic_listing(self._core.metadata(refresh=True), include_internal)

    def describe_topics(self, topics: Iterable[str] | None = None) -> dict[str, TopicDescription]:
        """Topic name -> TopicDescription (partitions with leader address, replicas,
        ISR). Raises errors.UnknownTopicOrPartitionError for a named unknown topic."""
        return topic_descriptions(self._core.metadata(refresh=True), topics)

    def _txn_coordinators(self) -> list[str]:
        return txn_coordinator_addresses(self._core.metadata(refresh=True))

    def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = ()
                          ) -> list[TransactionListing]:
        """Transactions known to every live transaction coordinator, optionally
        filtered by state name ("Ongoing", "PrepareCommit", ...) and PID."""
        core = self._core
        req = list_transactions_request(states, producer_ids)
        out = []
        for addr in self._txn_coordinators():
            resp = core.retry(lambda a=addr: core.call(core.txn_stub(a).ListTransactions, req))
            out.extend(transaction_listings(resp))
        return sorted(out)

    def describe_transactions(self, transactional_ids: Iterable[str]) -> dict[str, TransactionDescription]:
        """transactional.id -> TransactionDescription, asked of each id's coordinator.
        Raises the error of an id the coordinator cannot describe
        (e.g. errors.TransactionalIdNotFoundError)."""
        core = self._core
        out = {}
        for tid in transactional_ids:
            out.update(transaction_descriptions(core.coordinator_call(
                tid, COORDINATOR_TRANSACTION, lambda a: core.txn_stub(a).DescribeTransactions,
                describe_transaction_request(tid), error_code=describe_transaction_code)))
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
