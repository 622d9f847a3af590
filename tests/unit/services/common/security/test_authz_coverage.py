"""Every resource a request names is authorized on its own (docs/design.md,
"Security", "Authorization"): for every RPC of every service, a request whose every
string field holds a distinct name is given to `authz.checks`, and each name in a
topic, group or transactional.id field must have a check of its own on exactly that
resource. No resource passes on the strength of another's ACL (CreateTopics once
authorized a whole request on Create for any one of its topics). Fields are read from
the protobuf descriptors, so a new RPC or field fails here until it is classified."""
from __future__ import annotations

import itertools

import pytest

from exactly_wire.v1 import exactly_pb2 as pb
from services.common.security import authz
from services.common.security.acl import Resource, ResourceType as R

TOPIC, GROUP, TXN = R.TOPIC, R.GROUP, R.TRANSACTIONAL_ID

# (message, field) -> the resource type the name stands for.
RESOURCES = {
    ("CreatableTopic", "name"): TOPIC, ("DeleteTopicsRequest", "topic_names"): TOPIC,
    ("CreatePartitionsTopic", "name"): TOPIC, ("DescribeConfigsResource", "resource_name"): TOPIC,
    ("AlterConfigsResource", "resource_name"): TOPIC, ("TopicProduceData", "name"): TOPIC,
    ("FetchTopic", "topic"): TOPIC, ("ListOffsetsTopic", "name"): TOPIC, ("TopicPartitions", "topic"): TOPIC,
    ("OffsetForLeaderTopic", "topic"): TOPIC, ("DeleteRecordsTopic", "name"): TOPIC,
    ("OffsetCommitTopic", "name"): TOPIC,
    ("ProduceRequest", "transactional_id"): TXN, ("InitProducerIdRequest", "transactional_id"): TXN,
    ("AddPartitionsToTxnRequest", "transactional_id"): TXN, ("AddOffsetsToTxnRequest", "transactional_id"): TXN,
    ("EndTxnRequest", "transactional_id"): TXN, ("PrepareTxnRequest", "transactional_id"): TXN,
    ("DescribeTransactionsRequest", "transactional_ids"): TXN, ("TxnOffsetCommitRequest", "transactional_id"): TXN,
    ("ProduceRequest", "consumer_group_id"): GROUP, ("InitProducerIdRequest", "consumer_group_id"): GROUP,
    ("AddPartitionsToTxnRequest", "consumer_group_id"): GROUP, ("AddOffsetsToTxnRequest", "group_id"): GROUP,
    ("AddOffsetsToTxnRequest", "consumer_group_id"): GROUP, ("EndTxnRequest", "consumer_group_id"): GROUP,
    ("PrepareTxnRequest", "consumer_group_id"): GROUP, ("JoinGroupRequest", "group_id"): GROUP,
    ("SyncGroupRequest", "group_id"): GROUP, ("HeartbeatRequest", "group_id"): GROUP,
    ("LeaveGroupRequest", "group_id"): GROUP, ("OffsetCommitRequest", "group_id"): GROUP,
    ("OffsetFetchRequest", "group_id"): GROUP, ("TxnOffsetCommitRequest", "group_id"): GROUP,
    ("DescribeGroupsRequest", "groups"): GROUP, ("DeleteGroupsRequest", "groups_names"): GROUP,
    ("OffsetDeleteRequest", "group_id"): GROUP,
}

# Names that are no resource of their own, with why.
NOT_RESOURCES = {
    ("JoinGroupRequest", "topics"): "the subscription: stored, not read (Fetch and Metadata check the topics)",
    ("MetadataRequest", "topics"): "filtered by the servicer: a named topic it may not Describe is answered "
                                   "TOPIC_AUTHORIZATION_FAILED",
    ("FindCoordinatorRequest", "key"): "checked by key_type (below)",
    ("InitProducerIdRequest", "principal"): "only a ClusterAction holder may set it",
    ("FetchRequest", "replica_id"): "only that replica's own principal, with ClusterAction",
    ("OffsetForLeaderEpochRequest", "replica_id"): "only that replica's own principal, with ClusterAction",
    ("VerifyProducerIdRequest", "principal"): "ClusterAction", ("VerifyProducerIdRequest", "transactional_id"):
        "ClusterAction",
    ("TxnPartitionsAddedRequest", "transactional_id"): "ClusterAction",
    ("TopicPartitionPositions", "topic"): "ClusterAction (TxnPartitionsAdded)",
    ("TunneledCall", "method"): "each tunneled call runs the method's own checks",
    ("DescribeConfigsResource", "configuration_keys"): "config keys", ("AlterableConfig", "name"): "a config key",
    ("AlterableConfig", "value"): "a config value", ("ListTransactionsRequest", "state_filters"): "states",
    ("ListGroupsRequest", "states_filter"): "states", ("SaslAuthenticateRequest", "mechanism"): "authentication",
    ("SaslAuthenticateRequest", "session_id"): "authentication",
    ("OffsetCommitPartition", "metadata"): "the commit's metadata string",
    **{(m, f): "a member of the group" for m in ("JoinGroupRequest", "SyncGroupRequest", "HeartbeatRequest",
                                                 "LeaveGroupRequest", "OffsetCommitRequest", "TxnOffsetCommitRequest")
       for f in ("member_id", "group_instance_id")},
    ("JoinGroupRequest", "protocol_type"): "the group's protocol",
    **{("Acl", f): "ACLs: Alter / Describe on the Cluster" for f in ("principal", "resource_type", "name", "pattern",
                                                                    "operation", "permission")},
    ("ScramUpsertion", "name"): "users: Alter on the Cluster", ("ScramUpsertion", "password"): "a password",
    ("AlterUserScramCredentialsRequest", "deletions"): "users: Alter on the Cluster",
    ("ClientQuotaFilterComponent", "entity_type"): "quotas: Describe on the Cluster",
    ("ClientQuotaFilterComponent", "match"): "quotas: Describe on the Cluster",
    ("ClientQuotaEntityComponent", "entity_type"): "quotas: Alter on the Cluster",
    ("ClientQuotaEntityComponent", "name"): "quotas: Alter on the Cluster",
    ("ClientQuotaValue", "key"): "a quota key",
    ("FeatureUpdate", "name"): "a feature name: Alter on the Cluster",
}

METHODS = [(s.name, m) for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods]


def _filled(descriptor, names: dict[str, tuple[str, str]], counter) -> object:
    """A message of `descriptor` whose string fields hold fresh names (two entries per
    repeated field), recorded in `names` (name -> (message, field))."""
    msg = getattr(pb, descriptor.name)()
    for f in descriptor.fields:
        if f.message_type is not None:
            if f.message_type.GetOptions().map_entry:
                continue
            for _ in range(2 if f.is_repeated else 1):
                sub = _filled(f.message_type, names, counter)
                if f.is_repeated:
                    getattr(msg, f.name).append(sub)
                else:
                    getattr(msg, f.name).CopyFrom(sub)
        elif f.type == f.TYPE_STRING:
            for _ in range(2 if f.is_repeated else 1):
                name = f"n{next(counter)}"
                names[name] = (descriptor.name, f.name)
                if f.is_repeated:
                    getattr(msg, f.name).append(name)
                else:
                    setattr(msg, f.name, name)
    return msg


@pytest.mark.parametrize("service, method", [(s, m.name) for s, m in METHODS], ids=lambda x: x)
def test_every_named_resource_has_its_own_check(service, method):
    desc = pb.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    names: dict[str, tuple[str, str]] = {}
    request = _filled(desc.input_type, names, itertools.count())
    unclassified = {where for where in names.values() if where not in RESOURCES and where not in NOT_RESOURCES}
    assert not unclassified, f"{service}/{method}: classify {sorted(unclassified)} in RESOURCES or NOT_RESOURCES"
    key = f"{service}/{method}"
    if key in ("Tunnel/Calls", "Tunnel/Batches", "Client/Calls"):  # a stream is admitted by its Open pseudo-call
        key = key.split("/")[0] + "/Open"
    # The request holds every optional field at once (a replica id beside a consumer's
    # topics, say): the consumer's form, without the replica id, is checked too.
    forms = [request] + [_without(request, f) for f in ("replica_id",) if f in desc.input_type.fields_by_name]
    for form in forms:
        checks = authz.checks(key, form, "User:someone")
        assert checks is not None, f"{key} has no rule in authz._CHECKS"
        for alt in (a for c in checks for a in c.any_of):
            assert alt.resource == authz.CLUSTER, f"{key}: an alternative on {alt.resource} stands in for another"
        if any(c.resource == authz.CLUSTER and not c.any_of for c in checks):
            continue  # an operation on the Cluster covers every resource the request names
        own = {c.resource for c in checks}
        sent = form.SerializeToString()
        for name, where in names.items():
            rtype = RESOURCES.get(where)
            if rtype is not None and name.encode() in sent:
                assert Resource(rtype, name) in own, f"{key}: {where[0]}.{where[1]} {name!r} is not checked"


def _without(request, field: str):
    copy = type(request)()
    copy.CopyFrom(request)
    copy.ClearField(field)
    return copy


def test_create_topics_is_authorized_per_topic():
    """Create on one topic (or a prefix) does not let a request create another."""
    request = pb.CreateTopicsRequest(topics=[pb.CreatableTopic(name="mallory-a"), pb.CreatableTopic(name="alice-b")])
    resources = [c.resource for c in authz.checks("Cluster/CreateTopics", request, "User:mallory")]
    assert resources == [Resource(TOPIC, "mallory-a"), Resource(TOPIC, "alice-b")]
