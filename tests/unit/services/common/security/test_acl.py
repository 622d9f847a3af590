"""The ACL authorizer's decisions (KIP-98 design document, "Authorization"; Kafka's
AclAuthorizer): deny wins, implied Describe, literal, wildcard and prefixed patterns,
super users, allow.everyone.if.no.acl.found, and malformed bindings refused."""
from __future__ import annotations

import json

import pytest

from services.common.security.acl import (AclBinding, AclCache, Authorizer, Operation as Op, PatternType as P,
                                          Permission, Resource, ResourceType as R, parse_super_users)

ALLOW, DENY = Permission.ALLOW, Permission.DENY


def b(principal, rtype, name, op, perm=ALLOW, pattern=P.LITERAL):
    return AclBinding(principal, rtype, name, pattern, op, perm)


def test_allow_deny_and_implied_describe():
    a = Authorizer([b("User:alice", R.TOPIC, "orders", Op.WRITE),
                    b("User:alice", R.TOPIC, "orders", Op.READ, DENY)])
    orders = Resource(R.TOPIC, "orders")
    assert a.authorize("User:alice", Op.WRITE, orders)
    assert a.authorize("User:alice", Op.DESCRIBE, orders)  # Write implies Describe
    assert not a.authorize("User:alice", Op.READ, orders)  # denied explicitly
    assert not a.authorize("User:bob", Op.WRITE, orders)  # ACLs exist: nobody else
    assert not a.authorize("User:alice", Op.DELETE, orders)


def test_deny_wins_over_allow_including_all_and_wildcard_principal():
    a = Authorizer([b("User:*", R.GROUP, "g", Op.ALL), b("User:mallory", R.GROUP, "g", Op.ALL, DENY)])
    g = Resource(R.GROUP, "g")
    assert a.authorize("User:anyone", Op.READ, g)
    assert not a.authorize("User:mallory", Op.READ, g)


def test_literal_wildcard_and_prefixed_patterns():
    a = Authorizer([b("User:etl", R.TRANSACTIONAL_ID, "etl-", Op.WRITE, pattern=P.PREFIXED),
                    b("User:ops", R.TOPIC, "*", Op.DESCRIBE)])
    assert a.authorize("User:etl", Op.WRITE, Resource(R.TRANSACTIONAL_ID, "etl-worker-1"))
    assert not a.authorize("User:etl", Op.WRITE, Resource(R.TRANSACTIONAL_ID, "other"))
    assert a.authorize("User:ops", Op.DESCRIBE, Resource(R.TOPIC, "anything"))
    assert not a.authorize("User:ops", Op.READ, Resource(R.TOPIC, "anything"))


def test_super_users_and_no_acl_found():
    supers = parse_super_users("User:admin; User:pl-0")
    assert supers == {"User:admin", "User:pl-0"}
    closed = Authorizer([], supers)
    t = Resource(R.TOPIC, "t")
    assert closed.authorize("User:admin", Op.DELETE, t)
    assert not closed.authorize("User:bob", Op.READ, t)
    opened = Authorizer([], supers, allow_if_no_acl=True)
    assert opened.authorize("User:bob", Op.READ, t)
    # A resource with any ACL is closed to those the ACLs do not name, even then.
    opened.set_bindings([b("User:alice", R.TOPIC, "t", Op.READ)])
    assert not opened.authorize("User:bob", Op.READ, t)


def test_cache_applies_good_bindings_and_reports_bad_ones():
    a = Authorizer()
    cache = AclCache(a)
    good = b("User:alice", R.CLUSTER, "kafka-cluster", Op.IDEMPOTENT_WRITE)
    bad = cache.update([json.dumps(good.to_json()).encode(), b"{not json",
                        json.dumps({**good.to_json(), "principal": "alice"}).encode(),
                        json.dumps({**good.to_json(), "name": "other-cluster"}).encode(),
                        json.dumps({**good.to_json(), "operation": "Fly"}).encode()])
    assert a.bindings == (good,) and len(bad) == 4 and cache.version == 1
    assert AclBinding.from_json(good.to_json()) == good and len(good.key()) == 32


@pytest.mark.parametrize("op", list(Op))
def test_all_allows_every_operation(op):
    a = Authorizer([b("User:x", R.TOPIC, "t", Op.ALL)])
    assert a.authorize("User:x", op, Resource(R.TOPIC, "t"))
