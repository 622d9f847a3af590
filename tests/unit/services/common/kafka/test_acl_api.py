"""Kafka's ACL codes mapped onto Exactly's ACL model (services.common.kafka.acl_api):
creations outside the model are refused with a message, and filters match as Kafka's
AclBindingFilter (ANY, MATCH, LITERAL, PREFIXED; null fields match anything)."""
from __future__ import annotations

import asyncio

import pytest

from exactly_wire.v1 import exactly_pb2 as pb
from services.common.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from services.common.kafka import codec
from services.common.kafka.acl_api import ANY, MATCH, AclApis, InvalidAcl, binding_of, filter_of, kafka_fields

TOPIC, GROUP, CLUSTER, USER = 2, 3, 4, 7
LITERAL, PREFIXED = 3, 4
READ, WRITE, ALTER_CONFIGS, CREATE_TOKENS = 3, 4, 11, 13
DENY, ALLOW = 2, 3


def creation(**over):
    value = {"resource_type": TOPIC, "resource_name": "orders", "resource_pattern_type": LITERAL,
             "principal": "User:alice", "host": "*", "operation": WRITE, "permission_type": ALLOW, **over}
    return codec.build(codec.request_class(30, 3), {"creations": [value]}).creations[0]


def flt(**over):
    value = {"resource_type_filter": ANY, "resource_name_filter": None, "pattern_type_filter": ANY,
             "principal_filter": None, "host_filter": None, "operation": ANY, "permission_type": ANY, **over}
    return filter_of(codec.build(codec.request_class(29, 3), value))


def b(name: str, pattern=PatternType.LITERAL, principal="User:alice", op=Operation.WRITE,
      rtype=ResourceType.TOPIC, permission=Permission.ALLOW) -> AclBinding:
    return AclBinding(principal, rtype, name, pattern, op, permission)


def test_a_creation_maps_onto_a_binding_and_back():
    binding = binding_of(creation(resource_pattern_type=PREFIXED, permission_type=DENY))
    assert binding == b("orders", PatternType.PREFIXED, permission=Permission.DENY)
    assert kafka_fields(binding) == {"resource_type": TOPIC, "resource_name": "orders", "pattern_type": PREFIXED,
                                     "principal": "User:alice", "host": "*", "operation": WRITE,
                                     "permission_type": DENY}


def test_config_operations_map_onto_the_authorizer_s():
    """DescribeConfigs (10) and AlterConfigs (11) are operations of Exactly's authorizer
    (the config APIs check them), so ACLs granting them are stored."""
    assert binding_of(creation(operation=ALTER_CONFIGS)) == b("orders", op=Operation.ALTER_CONFIGS)
    assert binding_of(creation(operation=10)).operation is Operation.DESCRIBE_CONFIGS
    assert kafka_fields(b("orders", op=Operation.ALTER_CONFIGS))["operation"] == ALTER_CONFIGS


@pytest.mark.parametrize("over, message", [
    ({"resource_type": USER}, r"resource type USER \(7\) is not supported"),
    ({"resource_type": ANY}, "resource type 1 is not valid"),
    ({"resource_pattern_type": MATCH}, "pattern type 2 is not valid"),
    ({"operation": CREATE_TOKENS}, r"operation CREATE_TOKENS \(13\) is not supported"),
    ({"operation": 0}, "operation 0 is not valid"),
    ({"permission_type": ANY}, "permission type 1 is not valid"),
    ({"host": "10.0.0.1"}, "only '\\*' is accepted"),
    ({"principal": "alice"}, "must be User:<name>"),
    ({"resource_type": CLUSTER, "resource_name": "other"}, "kafka-cluster"),
])
def test_creations_outside_the_model_are_refused_with_a_message(over, message):
    with pytest.raises(InvalidAcl, match=message):
        binding_of(creation(**over))


def test_filters_match_as_kafka():
    lit, pre, star = b("orders"), b("ord", PatternType.PREFIXED), b("*")
    other = b("orders", principal="User:bob", op=Operation.READ, permission=Permission.DENY)
    everything = [lit, pre, star, other]
    assert [x for x in everything if flt().matches(x)] == everything
    # ANY with a name: that exact name, either pattern.
    assert [x for x in everything if flt(resource_name_filter="ord").matches(x)] == [pre]
    # MATCH: every binding that applies to the name (wildcard and prefixes too).
    assert [x for x in everything if flt(resource_name_filter="orders", pattern_type_filter=MATCH).matches(x)] \
        == everything
    assert [x for x in everything if flt(pattern_type_filter=PREFIXED).matches(x)] == [pre]
    assert [x for x in everything if flt(principal_filter="User:bob").matches(x)] == [other]
    assert [x for x in everything if flt(operation=READ, permission_type=DENY).matches(x)] == [other]
    assert [x for x in everything if flt(resource_type_filter=GROUP).matches(x)] == []
    # A Kafka value Exactly never stores matches nothing (it is not an error).
    assert [x for x in everything if flt(operation=CREATE_TOKENS).matches(x)] == []
    assert [x for x in everything if flt(operation=ALTER_CONFIGS).matches(x)] == []


@pytest.mark.parametrize("over", [{"resource_type_filter": 0}, {"pattern_type_filter": 0}, {"operation": 0},
                                  {"permission_type": 0}, {"pattern_type_filter": 9}])
def test_unknown_filter_codes_are_refused(over):
    with pytest.raises(InvalidAcl):
        flt(**over)


class _Servicer:
    """The Cluster servicer's ACL calls over a list (as SecurityAdmin over ZooKeeper)."""

    def __init__(self):
        self.pb, self.acls = pb, []

    async def CreateAcls(self, request, context):
        self.acls += [a for a in request.creations if a not in self.acls]
        return self.pb.AclsResponse(results=[self.pb.AclResult() for _ in request.creations])

    async def DeleteAcls(self, request, context):
        self.acls = [a for a in self.acls if a not in request.deletions]
        return self.pb.AclsResponse(results=[self.pb.AclResult() for _ in request.deletions])

    async def DescribeAcls(self, request, context):
        return self.pb.DescribeAclsResponse(acls=self.acls)


def test_create_describe_delete_answer_in_request_order():
    """A refused creation answers in its place among stored ones; DeleteAcls lists
    what each filter removed, and a bad filter answers INVALID_REQUEST alone."""
    servicer = _Servicer()
    apis = AclApis(servicer)
    good = {"resource_type": TOPIC, "resource_name": "orders", "resource_pattern_type": LITERAL,
            "principal": "User:alice", "host": "*", "operation": WRITE, "permission_type": ALLOW}
    req = codec.build(codec.request_class(30, 3), {"creations": [
        good, {**good, "host": "10.1.1.1"}, {**good, "resource_pattern_type": PREFIXED, "resource_name": "ord"}]})
    created = asyncio.run(apis.create_acls(req, 3, None))
    assert [r["error_code"] for r in created["results"]] == [0, 42, 0] and len(servicer.acls) == 2
    described = asyncio.run(apis.describe_acls(codec.build(codec.request_class(29, 3), {
        "resource_type_filter": TOPIC, "resource_name_filter": "orders", "pattern_type_filter": MATCH,
        "principal_filter": None, "host_filter": None, "operation": ANY, "permission_type": ANY}), 3, None))
    assert described["error_code"] == 0 and sorted((r["resource_name"], r["pattern_type"]) for r in
                                                   described["resources"]) == [("ord", PREFIXED), ("orders", LITERAL)]
    any_ = {"resource_type_filter": ANY, "resource_name_filter": None, "pattern_type_filter": PREFIXED,
            "principal_filter": None, "host_filter": None, "operation": ANY, "permission_type": ANY}
    deleted = asyncio.run(apis.delete_acls(codec.build(codec.request_class(31, 3), {"filters": [
        any_, {**any_, "operation": 0}]}), 3, None))
    first, bad = deleted["filter_results"]
    assert [m["resource_name"] for m in first["matching_acls"]] == ["ord"] and bad["error_code"] == 42
    assert [a.name for a in servicer.acls] == ["orders"]
