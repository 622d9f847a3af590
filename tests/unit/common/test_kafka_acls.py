"""Kafka's ACL codes mapped onto Exactly's ACL model (services.common.kafka.acl_api):
creations outside the model are refused with a message, and filters match as Kafka's
AclBindingFilter (ANY, MATCH, LITERAL, PREFIXED; null fields match anything)."""
from __future__ import annotations

import pytest

from services.common.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from services.common.kafka import codec
from services.common.kafka.acl_api import ANY, MATCH, InvalidAcl, binding_of, filter_of, kafka_fields

TOPIC, GROUP, CLUSTER, USER = 2, 3, 4, 7
LITERAL, PREFIXED = 3, 4
READ, WRITE, ALTER_CONFIGS = 3, 4, 11
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


@pytest.mark.parametrize("over, message", [
    ({"resource_type": USER}, r"resource type USER \(7\) is not supported"),
    ({"resource_type": ANY}, "resource type 1 is not valid"),
    ({"resource_pattern_type": MATCH}, "pattern type 2 is not valid"),
    ({"operation": ALTER_CONFIGS}, r"operation ALTER_CONFIGS \(11\) is not supported"),
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
    assert [x for x in everything if flt(operation=ALTER_CONFIGS).matches(x)] == []


@pytest.mark.parametrize("over", [{"resource_type_filter": 0}, {"pattern_type_filter": 0}, {"operation": 0},
                                  {"permission_type": 0}, {"pattern_type_filter": 9}])
def test_unknown_filter_codes_are_refused(over):
    with pytest.raises(InvalidAcl):
        flt(**over)
