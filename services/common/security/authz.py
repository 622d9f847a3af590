"""What each RPC requires (KIP-98 design document, "Authorization"; docs/design.md,
"Security"). `checks(method, request, principal)` lists the (operation, resource,
error) triples a call must pass; the gRPC interceptor (`AuthInterceptor`) refuses a
call failing one with PERMISSION_DENIED whose details start with the Kafka error name
(TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED,
CLUSTER_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED), which the SDK
raises as the matching exception. Filtering answers (Metadata lists only the topics
the principal may Describe; ListTransactions and ListGroups only what it may
Describe) happens in the servicers through `visible`.

Inter-service calls (replica fetch, OffsetForLeaderEpoch of a replica,
WriteTxnMarkers, a coordinator's appends to its internal topic, verification of a
transaction, and opening a `Tunnel/Calls` stream at all) need ClusterAction on the
Cluster; a replica fetch must moreover come
from the principal of the replica it names (`User:<node id>`), so nobody can stand in
for a follower and advance the high watermark without replication.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.records import CorruptRecordError

from .acl import CLUSTER_NAME, Authorizer, Operation as Op, Resource, ResourceType as R
from .principal import current_principal

TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED
CLUSTER_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
TXN_DENIED = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
CLUSTER = Resource(R.CLUSTER, CLUSTER_NAME)
GROUP_KEY, TXN_KEY = 0, 1


@dataclass(frozen=True)
class Check:
    operation: Op
    resource: Resource
    error: ErrorCode
    # Alternatives: the check passes when this one or any of `any_of` is allowed.
    any_of: tuple["Check", ...] = ()
    # When set, only this principal passes (no ACL, no super user, decides).
    principal: str | None = None


class Denied(Exception):
    """A failed check: `error` is the Kafka error code to answer."""

    def __init__(self, error: ErrorCode, message: str):
        super().__init__(f"{error.name}: {message}")
        self.error = error


def topic(name: str, op: Op) -> Check:
    return Check(op, Resource(R.TOPIC, name), TOPIC_DENIED)


def group(name: str, op: Op = Op.READ) -> Check:
    return Check(op, Resource(R.GROUP, name), GROUP_DENIED)


def txn(tid: str, op: Op = Op.WRITE) -> Check:
    return Check(op, Resource(R.TRANSACTIONAL_ID, tid), TXN_DENIED)


def cluster(op: Op) -> Check:
    return Check(op, CLUSTER, CLUSTER_DENIED)


def _topics(names: Iterable[str], op: Op) -> list[Check]:
    return [topic(n, op) for n in dict.fromkeys(names)]


def _produce(req, principal: str) -> list[Check]:
    """Write on every topic (which also covers an idempotent producer, as in Kafka);
    a transactional batch also needs Write on the transactional.id it carries, and a
    transactional batch without one is refused."""
    out = _topics((t.name for t in req.topics), Op.WRITE)
    if req.transactional_id:
        return [txn(req.transactional_id)] + _member_of(req.consumer_group_id) + out
    for t in req.topics:
        for p in t.partitions:
            try:
                transactional = records.parse_header(p.records).is_transactional
            except CorruptRecordError:
                continue  # refused by the partition leader with CORRUPT_MESSAGE
            if transactional:
                return [txn("", Op.WRITE)] + out  # no transactional.id: nobody may
    return out


def _fetch(req, principal: str) -> list[Check]:
    if req.replica_id:
        return [cluster(Op.CLUSTER_ACTION), _same_principal(principal, req.replica_id)]
    return _topics((t.topic for t in req.topics), Op.READ)


def _same_principal(principal: str, node_id: str) -> Check:
    """Only the principal of replica `node_id` (`User:<node_id>`) passes."""
    return Check(Op.CLUSTER_ACTION, Resource(R.CLUSTER, CLUSTER_NAME), CLUSTER_DENIED, principal=f"User:{node_id}")


def _offset_for_leader_epoch(req, principal: str) -> list[Check]:
    if req.replica_id:
        return [cluster(Op.CLUSTER_ACTION), _same_principal(principal, req.replica_id)]
    return _topics((t.topic for t in req.topics), Op.DESCRIBE)


def _find_coordinator(req, principal: str) -> list[Check]:
    if req.key_type == GROUP_KEY:
        return [group(req.key, Op.DESCRIBE)]
    if req.key_type == TXN_KEY:
        return [txn(req.key, Op.DESCRIBE)]
    return [group(req.key, Op.DESCRIBE)]  # the KIP-447 draft's transaction-group key


def _init_producer_id(req, principal: str) -> list[Check]:
    # Only a service may name the principal the producer id is bound to (pid_binding.py).
    forwarded = [cluster(Op.CLUSTER_ACTION)] if req.principal else []
    if req.transactional_id:
        # A group-aware producer (KIP-447 draft) names its group and the input partitions
        # it was assigned, whose other producers it fences: Read on each.
        return forwarded + [txn(req.transactional_id)] + _member_of(req.consumer_group_id) + \
            _topics((t.topic for t in req.assigned_partitions), Op.READ)
    return forwarded + [cluster(Op.IDEMPOTENT_WRITE)]


def _add_partitions(req, principal: str) -> list[Check]:
    if req.verify_only or req.implicit:  # a partition leader verifying or adding (KIP-890 parts 1, 2)
        return [cluster(Op.CLUSTER_ACTION)]
    return [txn(req.transactional_id)] + _member_of(req.consumer_group_id) + \
        _topics((t.topic for t in req.topics), Op.WRITE)


def _create_topics(topics) -> list[Check]:
    """Create on each topic of the request, or on the Cluster (which covers them all):
    one check per topic, so no topic is created on the strength of another's ACL
    (Kafka's CreateTopics answers TOPIC_AUTHORIZATION_FAILED per topic)."""
    create_any = (cluster(Op.CREATE),)
    return [Check(Op.CREATE, Resource(R.TOPIC, n), TOPIC_DENIED, any_of=create_any)
            for n in dict.fromkeys(t.name for t in topics)]


def _member_of(consumer_group_id: str) -> list[Check]:
    """A group-aware producer's later requests name its group (KIP-447 draft): Read on
    it, as its InitProducerId needed."""
    return [group(consumer_group_id)] if consumer_group_id else []


_CHECKS: dict[str, Callable[[Any, str], list[Check]]] = {
    # Cluster
    "Cluster/Metadata": lambda r, p: [],  # filtered by the servicer
    "Cluster/CreateTopics": lambda r, p: _create_topics(r.topics),
    "Cluster/FindCoordinator": _find_coordinator,
    "Cluster/DeleteTopics": lambda r, p: _topics(r.topic_names, Op.DELETE),
    "Cluster/CreatePartitions": lambda r, p: _topics((t.name for t in r.topics), Op.ALTER),
    "Cluster/DescribeConfigs": lambda r, p: _topics((x.resource_name for x in r.resources), Op.DESCRIBE_CONFIGS),
    "Cluster/IncrementalAlterConfigs": lambda r, p: _topics((x.resource_name for x in r.resources),
                                                            Op.ALTER_CONFIGS),
    "Cluster/CreateAcls": lambda r, p: [cluster(Op.ALTER)],
    "Cluster/DeleteAcls": lambda r, p: [cluster(Op.ALTER)],
    "Cluster/DescribeAcls": lambda r, p: [cluster(Op.DESCRIBE)],
    "Cluster/AlterUserScramCredentials": lambda r, p: [cluster(Op.ALTER)],
    "Cluster/DescribeUserScramCredentials": lambda r, p: [cluster(Op.DESCRIBE)],
    "Cluster/DescribeClientQuotas": lambda r, p: [cluster(Op.DESCRIBE)],
    "Cluster/AlterClientQuotas": lambda r, p: [cluster(Op.ALTER)],
    "Cluster/SaslAuthenticate": lambda r, p: [],  # authentication itself: open to every caller
    "Cluster/DescribeFeatures": lambda r, p: [cluster(Op.DESCRIBE)],
    "Cluster/UpdateFeatures": lambda r, p: [cluster(Op.ALTER)],
    # Partition leader
    "PartitionLeader/Produce": _produce,
    "PartitionLeader/CoordinatorProduce": lambda r, p: [cluster(Op.CLUSTER_ACTION)],
    "PartitionLeader/Fetch": _fetch,
    "PartitionLeader/ListOffsets": lambda r, p: _topics((t.name for t in r.topics), Op.DESCRIBE),
    "PartitionLeader/WriteTxnMarkers": lambda r, p: [cluster(Op.CLUSTER_ACTION)],
    "PartitionLeader/TxnPartitionsAdded": lambda r, p: [cluster(Op.CLUSTER_ACTION)],
    "PartitionLeader/OffsetForLeaderEpoch": _offset_for_leader_epoch,
    "PartitionLeader/DescribeProducers": lambda r, p: _topics((t.topic for t in r.topics), Op.READ),
    "PartitionLeader/DeleteRecords": lambda r, p: _topics((t.name for t in r.topics), Op.DELETE),
    # The tunnel carries the services' calls to each other only (services/common/transport/tunnel.py):
    # a stream is admitted (its `Open` pseudo-call) with ClusterAction on the Cluster.
    "Tunnel/Open": lambda r, p: [cluster(Op.CLUSTER_ACTION)],
    # A ticket for a link: the tunnel's calls on a TCP connection, run as this call's principal.
    "Tunnel/Attach": lambda r, p: [cluster(Op.CLUSTER_ACTION)],
    # An SDK's stream of transaction-path calls (Client/Calls): admitted for every caller
    # that authenticates; each call it carries is authorized by its own rule.
    "Client/Open": lambda r, p: [],
    # A ticket for an SDK's link: Client/Calls on a TCP connection, each call authorized by its own rule.
    "Client/Attach": lambda r, p: [],
    # Transaction coordinator
    "TransactionCoordinator/InitProducerId": _init_producer_id,
    "TransactionCoordinator/AddPartitionsToTxn": _add_partitions,
    "TransactionCoordinator/AddOffsetsToTxn": lambda r, p: [txn(r.transactional_id), group(r.group_id)]
    + _member_of(r.consumer_group_id),
    "TransactionCoordinator/EndTxn": lambda r, p: [txn(r.transactional_id)] + _member_of(r.consumer_group_id),
    "TransactionCoordinator/PrepareTxn": lambda r, p: [txn(r.transactional_id)] + _member_of(r.consumer_group_id),
    "TransactionCoordinator/ListTransactions": lambda r, p: [],  # filtered by the servicer
    "TransactionCoordinator/DescribeTransactions": lambda r, p: [txn(t, Op.DESCRIBE) for t in r.transactional_ids],
    # A partition leader or group coordinator checking a producer id's binding.
    "TransactionCoordinator/VerifyProducerId": lambda r, p: [cluster(Op.CLUSTER_ACTION)],
    # Group coordinator
    "GroupCoordinator/JoinGroup": lambda r, p: [group(r.group_id)],
    "GroupCoordinator/SyncGroup": lambda r, p: [group(r.group_id)],
    "GroupCoordinator/Heartbeat": lambda r, p: [group(r.group_id)],
    "GroupCoordinator/LeaveGroup": lambda r, p: [group(r.group_id)],
    "GroupCoordinator/OffsetCommit": lambda r, p: [group(r.group_id)] + _topics((t.name for t in r.topics), Op.READ),
    "GroupCoordinator/OffsetFetch": lambda r, p: [group(r.group_id, Op.DESCRIBE)]
    + _topics((t.topic for t in r.topics), Op.DESCRIBE),
    "GroupCoordinator/TxnOffsetCommit": lambda r, p: [txn(r.transactional_id), group(r.group_id)]
    + _topics((t.name for t in r.topics), Op.READ),
    "GroupCoordinator/ListGroups": lambda r, p: [],  # filtered by the servicer
    "GroupCoordinator/DescribeGroups": lambda r, p: [group(g, Op.DESCRIBE) for g in r.groups],
    "GroupCoordinator/DeleteGroups": lambda r, p: [group(g, Op.DELETE) for g in r.groups_names],
    "GroupCoordinator/OffsetDelete": lambda r, p: [group(r.group_id, Op.DELETE)]
    + _topics((t.topic for t in r.topics), Op.READ),
}


def method_key(full_method: str) -> str:
    """"/exactly.v1.PartitionLeader/Produce" -> "PartitionLeader/Produce"."""
    service, _, method = full_method.rpartition("/")
    return f"{service.rsplit('.', 1)[-1]}/{method}"


def checks(method: str, request: Any, principal: str) -> list[Check] | None:
    """The checks of an RPC (`method_key` form); None for a method without a rule
    (health checks and the like: not authorized)."""
    rule = _CHECKS.get(method)
    return None if rule is None else rule(request, principal)


def enforce(authorizer: Authorizer, principal: str, method: str, request: Any) -> None:
    """Raise Denied for the first failing check of the call."""
    for c in checks(method, request, principal) or ():
        if c.principal is not None:
            if principal != c.principal:
                raise Denied(c.error, f"{principal} may not act as {c.principal}")
            continue
        if authorizer.authorize(principal, c.operation, c.resource):
            continue
        if any(authorizer.authorize(principal, alt.operation, alt.resource) for alt in c.any_of):
            continue
        what = f"{c.resource.type.value} {c.resource.name!r}" if c.resource.type is not R.CLUSTER else "the Cluster"
        raise Denied(c.error, f"{principal} may not {c.operation.value} {what}")


# The process's authorizer (None: authorization off), for servicers that filter what
# they answer.
active_authorizer: Authorizer | None = None


def visible(op: Op, resource: Resource) -> bool:
    """Whether the caller may `op` on `resource` (always with authorization off)."""
    if active_authorizer is None:
        return True
    return active_authorizer.authorize(current_principal.get(), op, resource)


def has_rule(method: str) -> bool:
    return method in _CHECKS


class AuthorizedServicer:
    """A gRPC servicer as the Kafka listener calls it in-process: every method first
    runs the checks of `<service>/<method>` for the principal of the Kafka connection
    (`auth.current_principal`), so both protocols enforce the same rules. A refused
    call returns the method's response with Kafka's error code in every error field,
    one entry per resource of the request (`denied_response`), so the Kafka client gets
    TOPIC_AUTHORIZATION_FAILED and the like in its answer, as from a Kafka broker."""

    def __init__(self, servicer: Any, service: str):
        self._servicer = servicer
        self._service = service

    def __getattr__(self, name: str):
        method = getattr(self._servicer, name)
        key = f"{self._service}/{name}"

        async def call(request, context):
            try:
                require(key, request)
            except Denied as denied:
                return denied_response(self._service, name, request, denied)
            return await method(request, context)
        setattr(self, name, call)  # built once per method: later lookups find the attribute
        return call


# Identity fields copied from a request entry to its answer (topic and name stand for
# each other: requests and answers do not always use the same one).
_IDENTITY = ("name", "topic", "partition", "resource_name", "group_id", "transactional_id", "user", "producer_id")
_SYNONYM = {"name": "topic", "topic": "name"}


def denied_response(service: str, method: str, request: Any, denied: Denied) -> Any:
    """The response message of `<service>/<method>` answering `request` with
    `denied.error` in each error field: the top-level one, and one entry per entry of
    the request (its topics, partitions, groups, resources...), identified as in the
    request. Built from the protobuf descriptors, so every RPC is covered."""
    from exactly_wire.v1 import exactly_pb2 as pb
    desc = pb.DESCRIPTOR.services_by_name[service].methods_by_name[method].output_type
    response = getattr(pb, desc.name)()
    _mirror(request, response, int(denied.error), str(denied))
    return response


def _mirror(source: Any, target: Any, code: int, message: str) -> None:
    fields = target.DESCRIPTOR.fields_by_name
    if "error_code" in fields:
        target.error_code = code
    if "error_message" in fields:
        target.error_message = message
    src_fields = source.DESCRIPTOR.fields_by_name if source is not None and hasattr(source, "DESCRIPTOR") else {}
    for name in _IDENTITY:
        if name in fields and fields[name].message_type is None and not fields[name].is_repeated:
            for candidate in (name, _SYNONYM.get(name)):
                if candidate and candidate in src_fields and not src_fields[candidate].is_repeated \
                        and src_fields[candidate].message_type is None:
                    setattr(target, name, getattr(source, candidate))
                    break
    src_lists = [f for f in src_fields.values() if f.is_repeated]
    for f in target.DESCRIPTOR.fields:
        if not f.is_repeated or f.message_type is None:
            continue
        match = src_fields.get(f.name) if f.name in src_fields and src_fields[f.name].is_repeated else None
        if match is None and len(src_lists) == 1:
            match = src_lists[0]  # responses/results answer the request's only list
        if match is None:
            continue
        for item in getattr(source, match.name):
            entry = getattr(target, f.name).add()
            if match.message_type is None:  # a name or a partition number
                key = next((k for k in _IDENTITY if k in entry.DESCRIPTOR.fields_by_name
                            and _scalar_type_matches(entry.DESCRIPTOR.fields_by_name[k], item)), None)
                if key is not None:
                    setattr(entry, key, item)
                _mirror(None, entry, code, message)
            else:
                _mirror(item, entry, code, message)


def _scalar_type_matches(field: Any, value: Any) -> bool:
    if field.message_type is not None or field.is_repeated:
        return False
    is_text = field.cpp_type == field.CPPTYPE_STRING
    return isinstance(value, str) == is_text


def require(method: str, request: Any) -> None:
    """Run the checks of `method` for the current principal (no-op with authorization
    off). Raises Denied."""
    if active_authorizer is not None and has_rule(method):
        enforce(active_authorizer, current_principal.get(), method, request)
