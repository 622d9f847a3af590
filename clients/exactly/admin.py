"""AdminClient: topics (create, delete, grow, describe, configs), consumer groups
(list, describe, delete, offsets and lag, offset resets) and transactions (list,
describe, producer states, hanging transactions and their abort, KIP-664)."""
from __future__ import annotations

import time
from typing import Any, Callable, Generator, Iterable, Mapping, NamedTuple

from . import errors
from .config import AdminSchema, parse
from ._client import COORDINATOR_GROUP, COORDINATOR_TRANSACTION, ClientCore, CoreBase, Metadata, Transport, run_flow
from ._sender import txn_coordinator_addresses
from ._two_phase import PreparedTxnState
from ._unclosed import collected, creation_stack
from exactly_wire.error_codes import ErrorCode
from .types import NewTopic, TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pb_grpc


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


PREPARED_STATE = "PrepareTxn"  # the listed state of a transaction sealed by PrepareTxn, not yet decided


class TransactionListing(NamedTuple):
    """A transaction ListTransactions lists. state: Kafka's state name, or
    "PrepareTxn" for a prepared transaction (KIP-939), which then has prepared_time_ms
    (ms) and prepared_state: its PreparedTxnState (the transaction's own PID and
    epoch, which may differ from the client-facing producer_id / producer_epoch)."""

    transactional_id: str
    producer_id: int
    state: str
    producer_epoch: int = -1
    transaction_start_time_ms: int = -1  # -1: no transaction started
    prepared_time_ms: int = -1  # -1: not prepared
    prepared_state: PreparedTxnState | None = None


class TransactionDescription(NamedTuple):
    """A transaction DescribeTransactions describes; prepared_time_ms and
    prepared_state as in TransactionListing."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int
    partitions: tuple[tuple[str, int], ...]
    prepared_time_ms: int = -1
    prepared_state: PreparedTxnState | None = None


def _prepared(tid: str, msg) -> tuple[int, PreparedTxnState | None]:
    """(prepared_time_ms, PreparedTxnState) of a listing or description; (-1, None)
    when it carries no prepared transaction."""
    if not msg.HasField("prepared"):
        return -1, None
    return msg.prepared.prepared_time_ms, PreparedTxnState(tid, msg.prepared.producer_id, msg.prepared.producer_epoch)


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


def list_transactions_request(states: Iterable[str], producer_ids: Iterable[int],
                              duration_ms: int = 0) -> pb.ListTransactionsRequest:
    return pb.ListTransactionsRequest(state_filters=list(states), producer_id_filters=list(producer_ids),
                                      duration_filter_ms=int(duration_ms))


def transaction_listings(resp: pb.ListTransactionsResponse) -> list[TransactionListing]:
    errors.check(resp.error_code)
    return [TransactionListing(t.transactional_id, t.producer_id, t.state, t.producer_epoch,
                               t.transaction_start_time_ms, *_prepared(t.transactional_id, t))
            for t in resp.transaction_states]


def describe_transaction_request(transactional_id: str) -> pb.DescribeTransactionsRequest:
    return pb.DescribeTransactionsRequest(transactional_ids=[transactional_id])


def describe_transaction_code(resp: pb.DescribeTransactionsResponse) -> int:
    return resp.transaction_states[0].error_code if resp.transaction_states else 0


def transaction_descriptions(resp: pb.DescribeTransactionsResponse) -> dict[str, TransactionDescription]:
    return {d.transactional_id: TransactionDescription(
        d.transactional_id, d.state, d.producer_id, d.producer_epoch, d.transaction_timeout_ms,
        d.transaction_start_time_ms, tuple(sorted((t.topic, p) for t in d.topics for p in t.partitions)),
        *_prepared(d.transactional_id, d))
        for d in resp.transaction_states}


class RefreshMetadata(NamedTuple):
    """Effect of `wait_serving_flow` and `wait_unlisted_flow`: metadata fetched now,
    for `topics`; outcome: Metadata."""

    topics: frozenset[str]


class ProbeLeader(NamedTuple):
    """Effect of `wait_serving_flow`: whether the leader at `address` answers
    `leader_probe(topic, partition)`; outcome: bool."""

    address: str
    topic: str
    partition: int


class Sleep(NamedTuple):
    """Effect of `wait_serving_flow` and `wait_unlisted_flow`: wait `seconds`."""

    seconds: float


class MetadataAt(NamedTuple):
    """Effect of `wait_serving_flow` and `wait_unlisted_flow`: the metadata the
    service at `address` answers now; outcome: Metadata, or None when it does not answer."""

    address: str


def probe_timeout_s(core: CoreBase) -> float:
    """The timeout (seconds) of one probe of `wait_serving_flow` (a leader's
    ListOffsets, a service's Metadata): request.timeout.ms, at most 5 s."""
    return min(core.request_timeout_s, 5.0)


def poll_flow(core: CoreBase, deadline: float, check: Callable[[], Generator],
              what: Callable[[], str]) -> Generator:
    """Run the flow `check()` (yielding effects, returning True when done) until it
    returns True, sleeping retry.backoff.ms between rounds, doubling up to
    retry.backoff.max.ms; a retriable error counts as not done, a non-retriable one
    is raised. Raises errors.KafkaTimeoutError(what()) at `deadline` (seconds of
    `core.clock`)."""
    backoff = core.settings.retry_backoff_ms / 1000.0
    while True:
        try:
            if (yield from check()):
                return
        except errors.ExactlyError as exc:
            if not exc.retriable:
                raise
        if core.clock.now_s() >= deadline:
            raise errors.KafkaTimeoutError(what())
        yield Sleep(backoff)
        backoff = min(backoff * 2, core.settings.retry_backoff_max_ms / 1000.0)


def wait_serving_flow(core: CoreBase, topics: list[str], deadline: float) -> Generator:
    """Until every partition of `topics` has a leader that answers and every service
    that answers lists them all (a flow of the effects above, see
    exactly._client.run_flow); raises errors.KafkaTimeoutError at `deadline`
    (seconds of the core's clock, `core.clock.now_s()`) and non-retriable metadata
    errors. Each service answers Metadata from its own ZooKeeper cache, which a watch
    updates: waiting for all of them makes the change visible to the next call
    whichever service it asks."""
    pending = set(topics)

    def serving() -> Generator:
        md = yield RefreshMetadata(frozenset(topics))
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
        if pending:
            return False
        for address in md.addresses():
            seen = yield MetadataAt(address)
            if seen is not None and any(len(seen.partitions(t)) < len(md.partitions(t)) for t in topics):
                return False
        return True

    yield from poll_flow(core, deadline, serving, lambda: f"topics {sorted(pending or topics)} do not serve yet"
                         + ("" if pending else " on every service"))


def wait_unlisted_flow(core: CoreBase, topics: set[str], deadline: float) -> Generator:
    """Until no service that answers lists any of `topics` (a flow of the effects
    above, as `wait_serving_flow`); raises errors.KafkaTimeoutError at `deadline`
    (seconds of `core.clock`). Each service answers Metadata from its own ZooKeeper
    cache: waiting for all of them keeps a deleted topic out of the next call's
    answer whichever service it asks."""
    listed = set(topics)

    def unlisted() -> Generator:
        md = yield RefreshMetadata(frozenset())
        listed.clear()
        listed.update(topics & md.listed())
        if listed:
            return False
        for address in md.addresses():
            seen = yield MetadataAt(address)
            if seen is not None:
                listed.update(topics & seen.listed())
        return not listed

    yield from poll_flow(core, deadline, unlisted, lambda: f"topics {sorted(listed or topics)} are still listed")


def create_topics_timeout_s(core: CoreBase, timeout: float | None) -> float:
    """create_topics' default timeout: request.timeout.ms, at least 30 s."""
    return max(core.request_timeout_s, 30.0) if timeout is None else timeout

class AclBinding(NamedTuple):
    """An ACL (KIP-98 design document, "Authorization"): `principal` ("User:name" or
    "User:*") is allowed (or denied) `operation` (Read, Write, Create, Delete, Alter,
    Describe, ClusterAction, IdempotentWrite, All) on the `resource_type` (Topic,
    Group, TransactionalId, Cluster) named `name` ("*": all of the type; with
    pattern "Prefixed": every name starting with it; the Cluster is "kafka-cluster")."""

    principal: str
    resource_type: str
    name: str
    operation: str
    permission: str = "Allow"
    pattern: str = "Literal"


class ConfigEntry(NamedTuple):
    """One topic config: source "TOPIC_CONFIG" (set on the topic) or "DEFAULT_CONFIG"."""

    name: str
    value: str
    source: str
    documentation: str = ""


class GroupListing(NamedTuple):
    group_id: str
    protocol_type: str  # "consumer"; "" for a group that only has committed offsets
    state: str  # Kafka's state name: Empty, PreparingRebalance, CompletingRebalance, Stable, Dead


class MemberDescription(NamedTuple):
    member_id: str
    group_instance_id: str
    subscription: tuple[str, ...]
    assignment: tuple[TopicPartition, ...]


class GroupDescription(NamedTuple):
    group_id: str
    state: str  # "Dead": the group does not exist
    protocol_type: str
    protocol_name: str
    generation_id: int
    leader: str
    members: tuple[MemberDescription, ...]
    coordinator: str  # "host:port" of the group coordinator


class OffsetLag(NamedTuple):
    """A group's position on one partition: committed offset (-1: none), the high
    watermark, the last stable offset, and lag = end - committed where end is the LSO
    for read_committed and the high watermark otherwise (None without a commit)."""

    committed_offset: int
    high_watermark: int
    last_stable_offset: int
    lag: int | None
    metadata: str = ""


class ProducerState(NamedTuple):
    """A producer's state on a partition (DescribeProducers, KIP-664)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int  # ms
    coordinator_epoch: int
    current_transaction_start_offset: int  # -1: no open transaction


class HangingTransaction(NamedTuple):
    """An open transaction on a partition that its transaction coordinator does not
    know as ongoing there, or a prepared transaction (KIP-939) waiting for its decision
    longer than its transaction.timeout.ms, which no coordinator decides
    (`find_hanging`); prepared_state: the latter's PreparedTxnState string, None for
    the former. A prepared transaction with no partition is one row with topic "" and
    partition -1."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int
    last_timestamp: int  # ms
    duration_ms: int
    transactional_id: str | None  # the id the coordinators list for the producer id, if any
    reason: str
    prepared_state: str | None = None


# ListOffsets sentinels (docs/design.md, "Last stable offset and read_committed").
_EARLIEST, _LATEST, _LAST_STABLE = -2, -1, -3
READ_COMMITTED = "read_committed"
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms


class FeatureUpdate(NamedTuple):
    """One update of `AdminClient.update_features` (Kafka's FeatureUpdate, KIP-584):
    the level to finalize, and "upgrade" (raise it) or "safe_downgrade" (lower it;
    refused while the higher level's formats may be written)."""

    level: int
    upgrade_type: str = "upgrade"


class ProcessFeatures(NamedTuple):
    """A live process and the feature levels it supports: {name: (min, max)};
    `advertised` False for a version before feature levels (metadata.version 1 only)."""

    node_id: str
    role: str
    supported: dict[str, tuple[int, int]]
    advertised: bool


class FeatureMetadata(NamedTuple):
    """`AdminClient.describe_features`: the finalized levels ({name: level}) and their
    epoch, the levels the answering process supports ({name: (min, max)}), and every
    live process's (docs/operating/upgrades.md)."""

    finalized: dict[str, int]
    finalized_epoch: int
    supported: dict[str, tuple[int, int]]
    processes: list[ProcessFeatures]


_UPGRADE_TYPES = {"upgrade": 1, "safe_downgrade": 2, "unsafe_downgrade": 3}


class AdminClient:
    """Administrative operations. `conf`: the keys of `config.AdminSchema`
    (bootstrap.servers required; request.timeout.ms, retry.backoff.ms, ...).
    Raises errors.ConfigurationError for an unknown key or a wrong value. `transport`:
    where its calls go instead of the network (an `exactly.testing.MockCluster`)."""

    def __init__(self, conf: Mapping[str, Any], *, transport: Transport | None = None):
        self._created = creation_stack()  # where, in debug mode, for the unclosed warning (`__del__`)
        self._core = ClientCore(parse(AdminSchema, conf), transport=transport)

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
        deadline = self._core.clock.now_s() + timeout_s
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
        if isinstance(effect, MetadataAt):
            return self._metadata_at(effect.address)
        if isinstance(effect, Sleep):
            return self._core.clock.sleep(effect.seconds)
        raise TypeError(f"unknown effect {effect!r}")

    def _leader_answers(self, address: str, topic: str, partition: int) -> bool:
        core = self._core
        try:
            resp = core.call(core.leader_stub(address).ListOffsets, leader_probe(topic, partition),
                             timeout_s=probe_timeout_s(core))
        except errors.ExactlyError:
            return False
        return probe_answered(resp)

    def _metadata_at(self, address: str) -> Metadata | None:
        core = self._core
        try:
            resp = core.call(core.cluster_stub(address).Metadata, pb.MetadataRequest(), timeout_s=probe_timeout_s(core))
        except errors.ExactlyError:
            return None
        return Metadata.from_response(resp, core.clock())

    def _fresh_metadata(self) -> Metadata:
        """Metadata fetched now, retried as any admin call is (retriable errors such
        as errors.NetworkException while a process restarts or a leader moves, with
        retry.backoff.ms backoff for request.timeout.ms); raises the last error after
        that."""
        core = self._core
        return core.retry(lambda: core.metadata(refresh=True))

    def list_topics(self, include_internal: bool = False) -> dict[str, list[int]]:
        """Topic name -> sorted partition ids (internal topics only if asked)."""
        return topic_listing(self._fresh_metadata(), include_internal)

    def describe_topics(self, topics: Iterable[str] | None = None) -> dict[str, TopicDescription]:
        """Topic name -> TopicDescription (partitions with leader address, replicas,
        ISR). Raises errors.UnknownTopicOrPartitionError for a named unknown topic,
        errors.NetworkException when no process answers within request.timeout.ms."""
        return topic_descriptions(self._fresh_metadata(), topics)

    def _txn_coordinators(self) -> list[str]:
        return txn_coordinator_addresses(self._fresh_metadata())

    def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                          duration_ms: int = 0) -> list[TransactionListing]:
        """Transactions known to every live transaction coordinator, optionally
        filtered by state name ("Ongoing", "PrepareCommit", ...), PID, and
        `duration_ms` > 0: started at least that many ms ago (KIP-994)."""
        core = self._core
        req = list_transactions_request(states, producer_ids, duration_ms)
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

    # ------------------------------------------------------------ topic administration

    # ------------------------------------------------------------ ACLs and users
    def _cluster_call(self, method: Callable[[pb_grpc.ClusterStub], Callable[..., Any]], request: Any) -> Any:
        """`request` by `method` of the Cluster service (e.g. `lambda stub: stub.CreateAcls`)
        of any process, retried as `ClientCore.retry` retries."""
        core = self._core
        return core.retry(lambda: core.call(method(core.cluster_stub()), request))

    @staticmethod
    def _acl_messages(acls: Iterable[AclBinding]) -> list[pb.Acl]:
        return [pb.Acl(principal=a.principal, resource_type=a.resource_type, name=a.name, pattern=a.pattern,
                       operation=a.operation, permission=a.permission) for a in acls]

    def create_acls(self, acls: Iterable[AclBinding]) -> None:
        """Store ACLs (every service applies them within a second, no restart).
        Raises errors.ClusterAuthorizationFailedError without Alter on the Cluster,
        errors.InvalidRequestError naming a malformed ACL (the others are stored)."""
        resp = self._cluster_call(lambda stub: stub.CreateAcls,
                                  pb.CreateAclsRequest(creations=self._acl_messages(acls)))
        for r in resp.results:
            errors.check(r.error_code, r.error_message or None)

    def delete_acls(self, acls: Iterable[AclBinding]) -> None:
        """Remove ACLs (an ACL that is not stored is ignored). Errors as create_acls."""
        resp = self._cluster_call(lambda stub: stub.DeleteAcls,
                                  pb.DeleteAclsRequest(deletions=self._acl_messages(acls)))
        for r in resp.results:
            errors.check(r.error_code, r.error_message or None)

    def describe_acls(self) -> list[AclBinding]:
        """Every stored ACL. Raises errors.ClusterAuthorizationFailedError without
        Describe on the Cluster."""
        resp = self._cluster_call(lambda stub: stub.DescribeAcls, pb.DescribeAclsRequest())
        return [AclBinding(a.principal, a.resource_type, a.name, a.operation, a.permission, a.pattern)
                for a in resp.acls]

    def alter_user_scram_credentials(self, upsertions: Mapping[str, str] = {}, deletions: Iterable[str] = (),
                                     iterations: int = 4096) -> None:
        """Create or change SASL users ({name: password}; stored only as salted
        SCRAM-SHA-256 and SCRAM-SHA-512 credentials) and delete users. Passwords are accepted over TLS
        only (errors.SecurityDisabledError otherwise). `iterations`: the SCRAM iteration
        count, 4096..16384 as in Kafka (errors.UnacceptableCredentialError outside). Raises
        errors.ClusterAuthorizationFailedError without Alter on the Cluster."""
        resp = self._cluster_call(lambda stub: stub.AlterUserScramCredentials, pb.AlterUserScramCredentialsRequest(
            upsertions=[pb.ScramUpsertion(name=n, password=p, iterations=iterations) for n, p in upsertions.items()],
            deletions=list(deletions)))
        for r in resp.results:
            errors.check(r.error_code, r.error_message or None)

    def describe_user_scram_credentials(self) -> list[str]:
        """The SASL user names."""
        return list(self._cluster_call(lambda stub: stub.DescribeUserScramCredentials,
                                       pb.DescribeUserScramCredentialsRequest()).users)

    # ------------------------------------------------------------ feature levels
    def _feature_call(self, method: Callable[[pb_grpc.ClusterStub], Callable[..., Any]], request: Any) -> Any:
        """`method` of the Cluster service on the first process that implements it,
        of every process the metadata lists (coordinators too) and the bootstrap
        servers: a process of a version before feature levels answers UNIMPLEMENTED
        (errors.UnsupportedVersionError), and the next one is asked, so the calls work
        in the middle of a rolling upgrade. Raises errors.UnsupportedVersionError when
        none does."""
        core = self._core
        self._fresh_metadata()
        for address in core._known_addresses():
            try:
                return core.retry(lambda: core.call(method(core.cluster_stub(address)), request))
            except errors.UnsupportedVersionError:
                continue
        raise errors.UnsupportedVersionError("no process reached runs a version with feature levels "
                                            f"({type(request).__name__.removesuffix('Request')})")

    def describe_features(self) -> FeatureMetadata:
        """The finalized feature levels (metadata.version), their epoch and the levels
        every live process supports (KIP-584 DescribeFeatures; `exactly features
        describe`). Raises errors.ClusterAuthorizationFailedError without Describe on
        the Cluster, errors.UnsupportedVersionError when no process reached has
        feature levels."""
        resp = self._feature_call(lambda stub: stub.DescribeFeatures, pb.DescribeFeaturesRequest())
        errors.check(resp.error_code, resp.error_message or None)

        def ranges(items) -> dict[str, tuple[int, int]]:
            return {f.name: (f.min_version, f.max_version) for f in items}
        return FeatureMetadata({f.name: f.level for f in resp.finalized}, resp.finalized_epoch,
                               ranges(resp.supported),
                               [ProcessFeatures(p.node_id, p.role, ranges(p.supported), p.advertised)
                                for p in resp.processes])

    def update_features(self, updates: Mapping[str, FeatureUpdate], validate_only: bool = False) -> None:
        """Finalize feature levels ({name: FeatureUpdate}; KIP-584 UpdateFeatures;
        `exactly features upgrade|downgrade`): metadata.version is raised only when
        every live process supports the level, and never lowered below a level whose
        formats may be written. `validate_only`: check, change nothing. Raises
        errors.InvalidUpdateVersionError with the reason (naming the processes that
        lack the level), errors.FeatureUpdateFailedError,
        errors.ClusterAuthorizationFailedError without Alter on the Cluster,
        errors.InvalidRequestError for an unknown upgrade_type."""
        items = []
        for name, u in updates.items():
            if u.upgrade_type not in _UPGRADE_TYPES:
                raise errors.InvalidRequestError(f"upgrade_type {u.upgrade_type!r}: one of {', '.join(_UPGRADE_TYPES)}")
            items.append(pb.FeatureUpdate(name=name, level=u.level, upgrade_type=_UPGRADE_TYPES[u.upgrade_type]))
        resp = self._feature_call(lambda stub: stub.UpdateFeatures, pb.UpdateFeaturesRequest(updates=items,
                                                                             validate_only=validate_only))
        errors.check(resp.error_code, resp.error_message or None)
        for r in resp.results:
            errors.check(r.error_code, r.error_message or None)

    # ------------------------------------------------------------ client quotas
    def alter_client_quotas(self, entity: Mapping[str, str | None], set_values: Mapping[str, float] = {},
                            remove: Iterable[str] = ()) -> None:
        """Set and remove quota keys of one entity (KIP-546 AlterClientQuotas;
        docs/design.md, "Quotas"). `entity`: {"user": name, "client-id": name}, one or
        both, None for the default entity of the type (Kafka's <default>). Keys:
        producer_byte_rate and consumer_byte_rate (bytes/s), request_percentage (%),
        controller_mutation_rate (partitions/s), max_partitions. Raises
        errors.InvalidRequestError for an unknown key, a value not > 0 or a bad entity,
        errors.ClusterAuthorizationFailedError without Alter on the Cluster."""
        values = [pb.ClientQuotaValue(key=k, value=float(v)) for k, v in set_values.items()]
        values += [pb.ClientQuotaValue(key=k, remove=True) for k in remove]
        resp = self._cluster_call(lambda stub: stub.AlterClientQuotas, pb.AlterClientQuotasRequest(entries=[
            pb.ClientQuotaEntry(entity=_quota_entity(entity), values=values)]))
        for r in resp.entries:
            errors.check(r.error_code, r.error_message or None)

    def describe_client_quotas(self, entity: Mapping[str, str | None] | None = None,
                               strict: bool = False) -> list[tuple[dict[str, str | None], dict[str, float]]]:
        """The stored quotas: [(entity, {key: value})], entity as alter_client_quotas
        takes it. `entity` filters: each type given must match (a name, or None for
        the default entity); `strict`: no other type in the entity. Raises
        errors.ClusterAuthorizationFailedError without Describe on the Cluster."""
        components = [pb.ClientQuotaFilterComponent(entity_type=t, match_type=1 if n is None else 0, match=n or "")
                      for t, n in (entity or {}).items()]
        resp = self._cluster_call(lambda stub: stub.DescribeClientQuotas,
                                  pb.DescribeClientQuotasRequest(components=components, strict=strict))
        errors.check(resp.error_code, resp.error_message or None)
        return [({c.entity_type: None if c.is_default else c.name for c in e.entity},
                 {v.key: v.value for v in e.values}) for e in resp.entries]

    def delete_topics(self, topics: Iterable[str], timeout: float | None = None) -> None:
        """Delete topics and return once no service that answers lists them; every
        replica then removes its data and producer state. `timeout` in seconds
        (default request.timeout.ms). Raises errors.UnknownTopicOrPartitionError for
        an unknown topic, errors.InvalidTopicException for an internal one (the others
        are still deleted), errors.KafkaTimeoutError when they stay listed."""
        names = list(topics)
        if not names:
            return
        core = self._core
        timeout_s = core.request_timeout_s if timeout is None else timeout
        deadline = self._core.clock.now_s() + timeout_s
        resp = core.retry(lambda: core.call(core.cluster_stub().DeleteTopics,
                                            pb.DeleteTopicsRequest(topic_names=names)), timeout_s)
        failures = [errors.for_code(r.error_code, r.error_message or None) for r in resp.responses if r.error_code]
        deleted = {r.name for r in resp.responses if not r.error_code}
        run_flow(wait_unlisted_flow(core, deleted, deadline), self._perform)
        if failures:
            raise failures[0]

    def create_partitions(self, new_counts: Mapping[str, int], timeout: float | None = None,
                          validate_only: bool = False) -> None:
        """Grow topics to the given total partition counts ({topic: count}) and return
        when every partition has a serving leader. Raises
        errors.InvalidPartitionsError (count not larger than the current one),
        errors.UnknownTopicOrPartitionError, errors.InvalidTopicException (internal
        topic), errors.InvalidReplicationFactorError (too few live partition leaders)."""
        if not new_counts:
            return
        core = self._core
        timeout_s = max(core.request_timeout_s, 30.0) if timeout is None else timeout
        deadline = self._core.clock.now_s() + timeout_s
        req = pb.CreatePartitionsRequest(validate_only=validate_only, topics=[
            pb.CreatePartitionsTopic(name=t, count=int(n)) for t, n in new_counts.items()])
        resp = core.retry(lambda: core.call(core.cluster_stub().CreatePartitions, req), timeout_s)
        for r in resp.results:
            errors.check(r.error_code, r.error_message or None)
        if not validate_only:
            self._wait_until(lambda: all(len(core.metadata(refresh=True).partitions(t)) >= n
                                         for t, n in new_counts.items()), deadline, "new partitions not listed")
            self._wait_serving(list(new_counts), deadline)

    def describe_configs(self, topics: Iterable[str]) -> dict[str, dict[str, ConfigEntry]]:
        """topic -> {config name -> ConfigEntry} with every topic config (set or
        default). Raises errors.UnknownTopicOrPartitionError for an unknown topic."""
        core = self._core
        req = pb.DescribeConfigsRequest(resources=[pb.DescribeConfigsResource(resource_name=t) for t in topics])
        resp = core.retry(lambda: core.call(core.cluster_stub().DescribeConfigs, req))
        out = {}
        for r in resp.results:
            errors.check(r.error_code, r.error_message or None)
            out[r.resource_name] = {c.name: ConfigEntry(c.name, c.value, c.source, c.documentation)
                                    for c in r.configs}
        return out

    def incremental_alter_configs(self, changes: Mapping[str, Mapping[str, str | None]],
                                  validate_only: bool = False) -> None:
        """Set topic configs ({topic: {key: value}}; value None deletes the key, back to
        the default). Keys are checked against the topic configs the partition leaders
        understand: errors.InvalidConfigError names an unknown key or a malformed
        value (nothing of that topic is changed); errors.UnknownTopicOrPartitionError
        for an unknown topic. Partition leaders apply the change to their replicas."""
        core = self._core
        req = pb.IncrementalAlterConfigsRequest(validate_only=validate_only, resources=[
            pb.AlterConfigsResource(resource_name=t, configs=[
                pb.AlterableConfig(name=k, config_operation=1 if v is None else 0, value="" if v is None else str(v))
                for k, v in kv.items()]) for t, kv in changes.items()])
        resp = core.retry(lambda: core.call(core.cluster_stub().IncrementalAlterConfigs, req))
        for r in resp.responses:
            errors.check(r.error_code, r.error_message or None)

    # ------------------------------------------------------------ consumer groups

    def _coordinators(self, role: str) -> list[str]:
        md = self._fresh_metadata()
        return sorted(n.address for n in md.nodes.values() if n.role == role)

    def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        """Groups of every live group coordinator (also groups that only have
        committed offsets, as Empty), optionally only in `states` (Kafka names)."""
        core = self._core
        req = pb.ListGroupsRequest(states_filter=list(states))
        out = []
        for addr in self._coordinators("group_coordinator"):
            def _list(a=addr):
                resp = core.call(core.group_stub(a).ListGroups, req)
                errors.check(resp.error_code)
                return resp
            out.extend(GroupListing(g.group_id, g.protocol_type, g.group_state)
                       for g in core.retry(_list).groups)
        return sorted(out)

    def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        """group id -> GroupDescription (state, generation, members with their
        subscriptions and assignments), asked of each group's coordinator. A group
        that does not exist is described with state "Dead", as Kafka does."""
        core = self._core
        out = {}
        for gid in group_ids:
            resp = core.coordinator_call(gid, COORDINATOR_GROUP, lambda a: core.group_stub(a).DescribeGroups,
                                         pb.DescribeGroupsRequest(groups=[gid]),
                                         error_code=lambda r: r.groups[0].error_code if r.groups else 0)
            coordinator = core.find_coordinator(gid, COORDINATOR_GROUP)
            for g in resp.groups:
                out[g.group_id] = GroupDescription(
                    g.group_id, g.group_state, g.protocol_type, g.protocol_name, g.generation_id, g.leader,
                    tuple(MemberDescription(m.member_id, m.group_instance_id, tuple(m.subscription),
                                            tuple(TopicPartition(t.topic, p) for t in m.assignment
                                                  for p in t.partitions)) for m in g.members),
                    coordinator)
        return out

    def delete_groups(self, group_ids: Iterable[str]) -> None:
        """Delete groups with no members: their committed offsets and metadata are
        tombstoned. Raises the first failure after trying every group:
        errors.GroupIdNotFoundError, errors.NonEmptyGroupError, ..."""
        core = self._core
        failures = []
        for gid in group_ids:
            try:
                core.coordinator_call(gid, COORDINATOR_GROUP, lambda a: core.group_stub(a).DeleteGroups,
                                      pb.DeleteGroupsRequest(groups_names=[gid]),
                                      error_code=lambda r: r.results[0].error_code if r.results else 0)
            except errors.ExactlyError as exc:
                failures.append(errors.for_code(exc.code, f"group {gid!r}: {exc}"))
        if failures:
            raise failures[0]

    def list_consumer_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None = None,
                                    isolation_level: str = "read_uncommitted") -> dict[TopicPartition, OffsetLag]:
        """The group's committed offsets with the partitions' high watermark, last
        stable offset and lag ({TopicPartition: OffsetLag}); lag is measured to the
        LSO for isolation_level "read_committed" (what such a consumer can still
        read) and to the high watermark otherwise. `partitions` None: every
        partition with a committed offset."""
        core = self._core
        topics: dict[str, list[int]] = {}
        for tp in partitions or ():
            topics.setdefault(tp[0], []).append(tp[1])
        req = pb.OffsetFetchRequest(group_id=group_id, topics=[
            pb.TopicPartitions(topic=t, partitions=ps) for t, ps in topics.items()])
        resp = core.coordinator_call(group_id, COORDINATOR_GROUP, lambda a: core.group_stub(a).OffsetFetch, req)
        committed = {TopicPartition(t.name, p.partition): (p.committed_offset, p.metadata)
                     for t in resp.topics for p in t.partitions}
        ends = self.list_offsets(list(committed))
        out = {}
        for tp, (offset, metadata) in sorted(committed.items()):
            hw, lso = ends.get(tp, (-1, -1))
            end = lso if isolation_level == READ_COMMITTED else hw
            lag = max(end - offset, 0) if offset >= 0 and end >= 0 else None
            out[tp] = OffsetLag(offset, hw, lso, lag, metadata)
        return out

    def list_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """{TopicPartition: (high watermark, last stable offset)}, asked of each
        partition's leader (ListOffsets -1 and -3); (-1, -1) for a partition without
        a leader. Raises errors.UnknownTopicOrPartitionError."""
        return {tp: (v[0], v[1]) for tp, v in self._offsets_at(partitions, (_LATEST, _LAST_STABLE)).items()}

    def list_start_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """{TopicPartition: log start offset} (ListOffsets -2); -1 without a leader."""
        return {tp: v[0] for tp, v in self._offsets_at(partitions, (_EARLIEST,)).items()}

    def _offsets_at(self, partitions: Iterable[TopicPartition], timestamps: tuple[int, ...]
                    ) -> dict[TopicPartition, list[int]]:
        out: dict[TopicPartition, list[int]] = {}
        for addr, tps in self._by_leader(partitions).items():
            if addr is None:
                out.update({tp: [-1] * len(timestamps) for tp in tps})
                continue
            by_topic: dict[str, list[int]] = {}
            for tp in tps:
                by_topic.setdefault(tp[0], []).append(tp[1])
            req = pb.ListOffsetsRequest(topics=[pb.ListOffsetsTopic(name=t, partitions=[
                pb.ListOffsetsPartition(partition=p, timestamp=ts) for p in ps for ts in timestamps])
                for t, ps in by_topic.items()])
            resp = self._core.retry(lambda a=addr, req=req: self._core.call(self._core.leader_stub(a).ListOffsets,
                                                                            req))
            for t in resp.topics:
                for p in t.partitions:
                    out.setdefault(TopicPartition(t.name, p.partition), []).append(
                        p.offset if p.error_code == ErrorCode.NONE else -1)
        return out

    def alter_consumer_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit `offsets` ({TopicPartition: next offset to consume}) for a group
        outside group management (OffsetCommit with generation -1), as
        kafka-consumer-groups --reset-offsets does; the group should have no active
        members (errors as OffsetCommit: e.g. errors.UnknownMemberIdError)."""
        core = self._core
        topics: dict[str, list[pb.OffsetCommitPartition]] = {}
        for tp, off in offsets.items():
            topics.setdefault(tp[0], []).append(pb.OffsetCommitPartition(partition=tp[1], committed_offset=int(off),
                                                                         committed_leader_epoch=-1))
        req = pb.OffsetCommitRequest(group_id=group_id, generation_id=-1, topics=[
            pb.OffsetCommitTopic(name=t, partitions=ps) for t, ps in topics.items()])
        core.coordinator_call(group_id, COORDINATOR_GROUP, lambda a: core.group_stub(a).OffsetCommit, req,
                              error_code=lambda r: next((p.error_code for t in r.topics for p in t.partitions
                                                         if p.error_code), 0))

    # ------------------------------------------------------------ producers and hanging transactions

    def _by_leader(self, partitions: Iterable[TopicPartition]) -> dict[str | None, list[TopicPartition]]:
        md = self._fresh_metadata()
        out: dict[str | None, list[TopicPartition]] = {}
        for tp in partitions:
            tp = TopicPartition(*tp)
            if tp.partition not in md.partitions(tp.topic):
                raise errors.UnknownTopicOrPartitionError(f"unknown partition {tp.topic}-{tp.partition}")
            out.setdefault(md.leader(tp.topic, tp.partition), []).append(tp)
        return out

    def describe_producers(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, list[ProducerState]]:
        """The producer states of each partition, from its leader (KIP-664
        DescribeProducers): PID, epoch, last sequence, last timestamp (ms),
        coordinator epoch and the start offset of the open transaction (-1: none).
        Raises errors.UnknownTopicOrPartitionError, errors.LeaderNotAvailableError."""
        core = self._core
        out: dict[TopicPartition, list[ProducerState]] = {}
        for addr, tps in self._by_leader(partitions).items():
            if addr is None:
                raise errors.LeaderNotAvailableError(f"no leader for {', '.join(f'{t}-{p}' for t, p in tps)}")
            by_topic: dict[str, list[int]] = {}
            for tp in tps:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            req = pb.DescribeProducersRequest(topics=[pb.TopicPartitions(topic=t, partitions=ps)
                                                      for t, ps in by_topic.items()])

            def _describe(a=addr, req=req):
                resp = core.call(core.leader_stub(a).DescribeProducers, req)
                for t in resp.topics:
                    for p in t.partitions:
                        errors.check(p.error_code, p.error_message or f"{t.name}-{p.partition}")
                return resp
            for t in core.retry(_describe).topics:
                for p in t.partitions:
                    out[TopicPartition(t.name, p.partition)] = [
                        ProducerState(s.producer_id, s.producer_epoch, s.last_sequence, s.last_timestamp,
                                      s.coordinator_epoch, s.current_txn_start_offset) for s in p.active_producers]
        return out

    def delete_records(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Delete the records of each partition below an offset (Kafka's
        deleteRecords): the log start offset moves there (-1: the high watermark),
        reads below it get OFFSET_OUT_OF_RANGE, the segments wholly below it are
        deleted on every replica. Returns each partition's new log start offset
        (its low watermark). Raises errors.OffsetOutOfRangeError for an offset
        above the high watermark, errors.UnknownTopicOrPartitionError,
        errors.InvalidTopicException for an internal topic,
        errors.LeaderNotAvailableError. docs/design.md, "Retention and compaction"."""
        core = self._core
        out: dict[TopicPartition, int] = {}
        for addr, tps in self._by_leader(offsets).items():
            if addr is None:
                raise errors.LeaderNotAvailableError(f"no leader for {', '.join(f'{t}-{p}' for t, p in tps)}")
            by_topic: dict[str, list[pb.DeleteRecordsPartition]] = {}
            for tp in tps:
                by_topic.setdefault(tp.topic, []).append(pb.DeleteRecordsPartition(partition=tp.partition,
                                                                                   offset=int(offsets[tp])))
            req = pb.DeleteRecordsRequest(topics=[pb.DeleteRecordsTopic(name=t, partitions=ps)
                                                  for t, ps in by_topic.items()],
                                          timeout_ms=int(core.request_timeout_s * 1000))

            def _delete(a=addr, req=req):
                resp = core.call(core.leader_stub(a).DeleteRecords, req)
                for t in resp.topics:
                    for p in t.partitions:
                        errors.check(p.error_code, p.error_message or f"{t.name}-{p.partition}")
                return resp
            for t in core.retry(_delete).topics:
                for p in t.partitions:
                    out[TopicPartition(t.name, p.partition)] = p.low_watermark
        return out

    def abort_transaction(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                          coordinator_epoch: int) -> None:
        """Write an ABORT marker for `producer_id` on one partition (KIP-664
        abortTransaction: WriteTxnMarkers to the partition's leader, as a transaction
        coordinator would), ending a hanging transaction; its data stays in the log
        and read_committed consumers skip it, and the LSO moves past it. Use the
        epochs `describe_producers` reports. Raises
        errors.TransactionCoordinatorFencedError (coordinator epoch older than the
        partition's), errors.InvalidProducerEpochError (older producer epoch),
        errors.NotEnoughReplicasError, ..."""
        core = self._core
        req = pb.WriteTxnMarkersRequest(markers=[pb.WritableTxnMarker(
            producer_id=producer_id, producer_epoch=producer_epoch, committed=False,
            coordinator_epoch=coordinator_epoch, transaction_version=0,
            topics=[pb.TopicPartitions(topic=topic, partitions=[partition])])])

        def _abort():
            resp = core.call(core.leader_stub(core.leader_for(topic, partition)).WriteTxnMarkers, req)
            for m in resp.markers:
                for t in m.topics:
                    for p in t.partitions:
                        errors.check(p.error_code, p.error_message or None)
        core.retry(_abort)

    def find_hanging(self, partitions: Iterable[TopicPartition] | None = None, broker: str | None = None,
                     max_transaction_timeout_ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
                     now_ms: int | None = None) -> list[HangingTransaction]:
        """Hanging transactions (KIP-664 findHangingTransactions): open transactions on
        `partitions` (or on the partitions led by node id `broker`, or on every
        partition) whose producer last wrote more than `max_transaction_timeout_ms`
        ago (Kafka's transaction.max.timeout.ms, 15 minutes) and that the owning
        transaction coordinator does not know as an ongoing transaction of that
        producer id including the partition: no coordinator lists the producer id,
        or its transaction is in another state, epoch or partition set. Any real
        transaction that old would have been aborted by its coordinator.

        Also every prepared transaction (KIP-939, listed as "PrepareTxn") that has
        waited for its decision longer than its transaction.timeout.ms since it was
        prepared, one row per partition of it that is scanned: its coordinator knows
        it but never decides it (docs/design.md, "Two-phase commit with a database");
        the reason says how to decide it, and prepared_state is the state string its
        commit needs."""
        md = self._fresh_metadata()
        scan_all = partitions is None and broker is None
        if partitions is None:
            partitions = [TopicPartition(t, p) for t, tm in sorted(md.topics.items()) if tm.error_code == 0
                          for p in sorted(tm.partitions)
                          if broker is None or tm.partitions[p].leader_id == broker]
        now = int(time.time() * 1000) if now_ms is None else now_ms
        producers = self.describe_producers(list(partitions))
        prepared = self.list_transactions([PREPARED_STATE])
        out = _prepared_rows(self.describe_transactions_lenient(t.transactional_id for t in prepared),
                             producers, scan_all, now)
        candidates = [(tp, s) for tp, states in sorted(producers.items()) for s in states
                      if s.current_transaction_start_offset >= 0 and now - s.last_timestamp > max_transaction_timeout_ms]
        if not candidates:
            return out
        listed = {t.producer_id: t for t in self.list_transactions(producer_ids={s.producer_id for _, s in candidates})}
        listed.update({t.prepared_state.producer_id: t for t in prepared})  # known by its own producer id
        described = self.describe_transactions_lenient(sorted({t.transactional_id for t in listed.values()}))
        for tp, s in candidates:
            listing = listed.get(s.producer_id)
            reason = None
            if listing is None:
                reason = f"no transaction coordinator knows producer id {s.producer_id}"
            else:
                d = described.get(listing.transactional_id)
                if d is None:
                    reason = f"the coordinator cannot describe {listing.transactional_id!r}"
                elif d.state not in ("Ongoing", PREPARED_STATE, "PrepareCommit", "PrepareAbort"):
                    reason = f"the coordinator's transaction of {d.transactional_id!r} is {d.state}"
                elif _transaction_producer(d) != s.producer_id or _transaction_epoch(d) < s.producer_epoch:
                    reason = (f"the coordinator's transaction of {d.transactional_id!r} is producer "
                              f"{_transaction_producer(d)} epoch {_transaction_epoch(d)}")
                elif (tp.topic, tp.partition) not in d.partitions:
                    reason = f"the coordinator's transaction of {d.transactional_id!r} does not include the partition"
            if reason is not None:
                out.append(HangingTransaction(tp.topic, tp.partition, s.producer_id, s.producer_epoch,
                                              s.coordinator_epoch, s.current_transaction_start_offset,
                                              s.last_timestamp, now - s.last_timestamp,
                                              listing.transactional_id if listing else None, reason))
        return out

    def describe_transactions_lenient(self, transactional_ids: Iterable[str]) -> dict[str, TransactionDescription]:
        """Like `describe_transactions`, leaving out ids that cannot be described."""
        out = {}
        for tid in transactional_ids:
            try:
                out.update(self.describe_transactions([tid]))
            except errors.ExactlyError:
                continue
        return out

    def _wait_until(self, done, deadline: float, what: str) -> None:
        backoff = self._core.settings.retry_backoff_ms / 1000.0
        while True:
            try:
                if done():
                    return
            except errors.ExactlyError as exc:
                if not exc.retriable:
                    raise
            if self._core.clock.now_s() >= deadline:
                raise errors.KafkaTimeoutError(what)
            self._core.clock.sleep(backoff)
            backoff = min(backoff * 2, self._core.settings.retry_backoff_max_ms / 1000.0)

    def close(self) -> None:
        """Release connections. Idempotent."""
        self._core.close()

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        # Unclosed: a ResourceWarning, and the connections close (exactly._unclosed).
        core = getattr(self, "_core", None)
        collected(self, core is not None and not core.closed, lambda: core.close())


__all__ = ["AdminClient", "TopicDescription", "PartitionDescription", "TransactionListing",
           "TransactionDescription", "ConfigEntry", "GroupListing", "GroupDescription", "MemberDescription",
           "OffsetLag", "ProducerState", "HangingTransaction"]


def _transaction_producer(d: TransactionDescription) -> int:
    """The producer id the data of `d`'s transaction carries: its prepared
    transaction's own once a new instance kept it, else the client-facing one."""
    return d.prepared_state.producer_id if d.prepared_state is not None else d.producer_id


def _transaction_epoch(d: TransactionDescription) -> int:
    """The producer epoch that goes with `_transaction_producer(d)`."""
    return d.prepared_state.epoch if d.prepared_state is not None else d.producer_epoch


def _prepared_rows(prepared: Mapping[str, TransactionDescription], producers: Mapping[TopicPartition, list],
                   scan_all: bool, now_ms: int) -> list[HangingTransaction]:
    """`AdminClient.find_hanging`'s rows of the prepared transactions of `prepared`
    (transactional.id -> description) prepared more than their transaction.timeout.ms
    ago, on the scanned partitions (`producers`: their producer states; a transaction
    without partitions only when `scan_all`)."""
    out = []
    for d in prepared.values():
        state, waited = d.prepared_state, now_ms - d.prepared_time_ms
        if state is None or waited <= d.transaction_timeout_ms:
            continue
        reason = (f"prepared {waited} ms ago, longer than its transaction.timeout.ms ({d.transaction_timeout_ms} ms); "
                  "no coordinator decides it: restart the application that owns it (its recovery decides), or "
                  "run `exactly transactions commit-prepared` with the state its database holds, or "
                  "`exactly transactions abort-prepared`")
        tps = [TopicPartition(*tp) for tp in d.partitions if TopicPartition(*tp) in producers]
        rows = [(tp, next((s for s in producers[tp] if s.producer_id == state.producer_id), None)) for tp in tps]
        if not d.partitions and scan_all:
            rows = [(TopicPartition("", -1), None)]
        for tp, s in rows:
            out.append(HangingTransaction(tp.topic, tp.partition, state.producer_id, state.epoch,
                                          s.coordinator_epoch if s else -1,
                                          s.current_transaction_start_offset if s else -1,
                                          s.last_timestamp if s else -1, waited, d.transactional_id, reason,
                                          state.serialize()))
    return out


def _quota_entity(entity: Mapping[str, str | None]) -> list[pb.ClientQuotaEntityComponent]:
    """{"user": name | None, "client-id": name | None} as entity components (None: default)."""
    return [pb.ClientQuotaEntityComponent(entity_type=t, name=n or "", is_default=n is None)
            for t, n in entity.items()]
