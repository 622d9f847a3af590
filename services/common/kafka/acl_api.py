"""Kafka's ACL APIs on every port: DescribeAcls (29), CreateAcls (30) and DeleteAcls
(31), v1-3 (KIP-140, KIP-290 prefixed ACLs; docs/design.md, "Kafka protocol" and
"Security"), mapped onto Exactly's ACL model (services.common.security.acl) and served through
the Cluster servicer's CreateAcls / DeleteAcls / DescribeAcls, so the rules (Alter on
the Cluster to change, Describe on the Cluster to list) and the ZooKeeper store are the
gRPC admin's.

Kafka's numeric codes map onto Exactly's names:

- resource types: TOPIC (2), GROUP (3), CLUSTER (4), TRANSACTIONAL_ID (5); Kafka's
  DELEGATION_TOKEN (6) and USER (7) resources do not exist in Exactly;
- pattern types: LITERAL (3), PREFIXED (4); filters may also use ANY (1: either
  pattern, the exact name) and MATCH (2: every binding that applies to the name,
  wildcard and prefixes included), as Kafka's ResourcePatternFilter;
- operations: ALL (2) ... CLUSTER_ACTION (9), DESCRIBE_CONFIGS (10), ALTER_CONFIGS
  (11), IDEMPOTENT_WRITE (12); Kafka's CREATE_TOKENS (13) and DESCRIBE_TOKENS (14) are
  not operations of Exactly's authorizer;
- permission types: DENY (2), ALLOW (3); hosts: only "*" (Exactly's bindings apply
  from every host).

A creation outside the model (an unknown or ANY code, an unsupported resource type,
operation or host, a malformed principal or Cluster name) answers INVALID_REQUEST with a
message saying which, and nothing is stored; a filter with an unknown (0) code answers
INVALID_REQUEST. A filter naming a value Exactly has no binding for simply matches
nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from ..security import authz
from ..security.acl import WILDCARD, AclBinding, Operation, PatternType, Permission, ResourceType
from .codec import field

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31

ANY, MATCH = 1, 2  # Kafka's ANY of every enum; MATCH of PatternType

RESOURCE_TYPES = {2: ResourceType.TOPIC, 3: ResourceType.GROUP, 4: ResourceType.CLUSTER,
                  5: ResourceType.TRANSACTIONAL_ID}
KAFKA_ONLY_RESOURCE_TYPES = {6: "DELEGATION_TOKEN", 7: "USER"}
PATTERN_TYPES = {3: PatternType.LITERAL, 4: PatternType.PREFIXED}
OPERATIONS = {2: Operation.ALL, 3: Operation.READ, 4: Operation.WRITE, 5: Operation.CREATE, 6: Operation.DELETE,
              7: Operation.ALTER, 8: Operation.DESCRIBE, 9: Operation.CLUSTER_ACTION,
              10: Operation.DESCRIBE_CONFIGS, 11: Operation.ALTER_CONFIGS, 12: Operation.IDEMPOTENT_WRITE}
KAFKA_ONLY_OPERATIONS = {13: "CREATE_TOKENS", 14: "DESCRIBE_TOKENS"}
PERMISSIONS = {2: Permission.DENY, 3: Permission.ALLOW}


def _code(table: dict, value: Any) -> int:
    return next(k for k, v in table.items() if v is value)


class InvalidAcl(ValueError):
    """A creation or filter outside Exactly's ACL model (answered INVALID_REQUEST)."""


def _one(table: dict, code: int, what: str, kafka_only: dict | None = None) -> Any:
    if code in table:
        return table[code]
    if kafka_only and code in kafka_only:
        raise InvalidAcl(f"{what} {kafka_only[code]} ({code}) is not supported by Exactly's authorizer")
    raise InvalidAcl(f"{what} {code} is not valid in an ACL binding")


def binding_of(creation: Any) -> AclBinding:
    """The AclBinding of a CreateAcls `AclCreation` (kio entity). Raises InvalidAcl."""
    host = field(creation, "host", WILDCARD)
    if host != WILDCARD:
        raise InvalidAcl(f"host {host!r}: Exactly's ACLs apply from every host (only '*' is accepted)")
    rtype = _one(RESOURCE_TYPES, int(creation.resource_type), "resource type", KAFKA_ONLY_RESOURCE_TYPES)
    pattern = _one(PATTERN_TYPES, int(field(creation, "resource_pattern_type", 3)), "pattern type")
    op = _one(OPERATIONS, int(creation.operation), "operation", KAFKA_ONLY_OPERATIONS)
    permission = _one(PERMISSIONS, int(creation.permission_type), "permission type")
    try:
        return AclBinding.from_json({"principal": creation.principal, "resource_type": rtype.value,
                                     "name": creation.resource_name, "pattern": pattern.value,
                                     "operation": op.value, "permission": permission.value})
    except (ValueError, KeyError) as exc:
        raise InvalidAcl(str(exc)) from None


@dataclass(frozen=True)
class AclFilter:
    """Kafka's AclBindingFilter: None in a field matches anything (ANY / null)."""

    resource_type: ResourceType | None
    name: str | None
    pattern: int  # ANY, MATCH, or a PATTERN_TYPES code
    principal: str | None
    host: str | None
    operation: Operation | None
    permission: Permission | None
    empty: bool = False  # names a value no Exactly binding can have: matches nothing

    def matches(self, b: AclBinding) -> bool:
        """Kafka's AclBindingFilter.matches (ResourcePatternFilter and
        AccessControlEntryFilter) over an Exactly binding."""
        if self.empty:
            return False
        if self.resource_type is not None and b.resource_type is not self.resource_type:
            return False
        if self.pattern not in (ANY, MATCH) and PATTERN_TYPES[self.pattern] is not b.pattern:
            return False
        if self.name is not None:
            if self.pattern == MATCH:
                ok = (b.name == self.name or b.name == WILDCARD) if b.pattern is PatternType.LITERAL \
                    else self.name.startswith(b.name)
            else:
                ok = b.name == self.name
            if not ok:
                return False
        return ((self.principal is None or self.principal == b.principal)
                and (self.host is None or self.host == b.host)
                and (self.operation is None or self.operation is b.operation)
                and (self.permission is None or self.permission is b.permission))


def filter_of(req: Any) -> AclFilter:
    """The AclFilter of a DescribeAcls request or a DeleteAcls `DeleteAclsFilter`.
    Raises InvalidAcl for an UNKNOWN (0) or out-of-range code."""
    empty = False

    def pick(table: dict, code: int, what: str, kafka_only: dict | None = None):
        nonlocal empty
        if code == ANY:
            return None
        if code in table:
            return table[code]
        if kafka_only and code in kafka_only:
            empty = True  # a Kafka value Exactly never stores
            return None
        raise InvalidAcl(f"{what} {code} is not valid in an ACL filter")

    rtype = pick(RESOURCE_TYPES, int(req.resource_type_filter), "resource type", KAFKA_ONLY_RESOURCE_TYPES)
    pattern = int(field(req, "pattern_type_filter", 3))
    if pattern not in (ANY, MATCH) and pattern not in PATTERN_TYPES:
        raise InvalidAcl(f"pattern type {pattern} is not valid in an ACL filter")
    op = pick(OPERATIONS, int(req.operation), "operation", KAFKA_ONLY_OPERATIONS)
    permission = pick(PERMISSIONS, int(req.permission_type), "permission type")
    return AclFilter(rtype, req.resource_name_filter, pattern, req.principal_filter, req.host_filter, op,
                     permission, empty)


def acl_message(b: AclBinding) -> pb.Acl:
    return pb.Acl(principal=b.principal, resource_type=b.resource_type.value, name=b.name, pattern=b.pattern.value,
                  operation=b.operation.value, permission=b.permission.value)


def binding_of_message(m: pb.Acl) -> AclBinding:
    return AclBinding.from_json({"principal": m.principal, "resource_type": m.resource_type, "name": m.name,
                                 "pattern": m.pattern or "Literal", "operation": m.operation,
                                 "permission": m.permission or "Allow"})


def kafka_fields(b: AclBinding) -> dict:
    """A binding as the fields of Kafka's responses (codes, not names)."""
    return {"resource_type": _code(RESOURCE_TYPES, b.resource_type), "resource_name": b.name,
            "pattern_type": _code(PATTERN_TYPES, b.pattern), "principal": b.principal, "host": b.host,
            "operation": _code(OPERATIONS, b.operation), "permission_type": _code(PERMISSIONS, b.permission)}


class AclApis:
    """DescribeAcls, CreateAcls, DeleteAcls over `servicer` (the Cluster servicer as
    the Kafka listener calls it: services.common.security.authz.AuthorizedServicer, so a caller
    without Alter / Describe on the Cluster gets CLUSTER_AUTHORIZATION_FAILED)."""

    def __init__(self, servicer: Any):
        self.servicer = servicer

    def handlers(self) -> dict:
        return {DESCRIBE_ACLS: self.describe_acls, CREATE_ACLS: self.create_acls, DELETE_ACLS: self.delete_acls}

    async def _bindings(self) -> tuple[int, str | None, list[AclBinding]]:
        resp = await self.servicer.DescribeAcls(pb.DescribeAclsRequest(), None)
        if resp.error_code:
            return resp.error_code, getattr(resp, "error_message", "") or None, []
        out = []
        for m in resp.acls:
            try:
                out.append(binding_of_message(m))
            except (ValueError, KeyError):
                continue
        return 0, None, out

    async def describe_acls(self, req: Any, version: int, ctx: Any) -> dict:
        """DescribeAcls v1-3: the bindings matching the filter, grouped by resource
        pattern. Errors (top level): INVALID_REQUEST for a bad filter,
        CLUSTER_AUTHORIZATION_FAILED without Describe on the Cluster."""
        fail = {"throttle_time": 0, "resources": []}
        try:
            flt = filter_of(req)
        except InvalidAcl as exc:
            return {**fail, "error_code": ErrorCode.INVALID_REQUEST, "error_message": str(exc)}
        code, message, bindings = await self._bindings()
        if code:
            return {**fail, "error_code": code, "error_message": message}
        groups: dict[tuple, list[dict]] = {}
        for b in bindings:
            if flt.matches(b):
                f = kafka_fields(b)
                groups.setdefault((f["resource_type"], f["resource_name"], f["pattern_type"]), []).append(
                    {"principal": f["principal"], "host": f["host"], "operation": f["operation"],
                     "permission_type": f["permission_type"]})
        return {"throttle_time": 0, "error_code": 0, "error_message": None, "resources": [
            {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
            for (t, n, p), acls in groups.items()]}

    async def create_acls(self, req: Any, version: int, ctx: Any) -> dict:
        """CreateAcls v1-3: one result per creation, in order (INVALID_REQUEST for one
        outside Exactly's model; the others are stored)."""
        results: list[dict | None] = []
        valid: list[pb.Acl] = []
        for c in req.creations:
            try:
                valid.append(acl_message(binding_of(c)))
                results.append(None)
            except InvalidAcl as exc:
                results.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(exc)})
        stored = iter(())
        if valid:
            stored = iter((await self.servicer.CreateAcls(pb.CreateAclsRequest(creations=valid), None)).results)
        out = []
        for r in results:
            if r is None:
                s = next(stored, None)
                r = {"error_code": s.error_code if s else ErrorCode.UNKNOWN_SERVER_ERROR,
                     "error_message": (s.error_message or None) if s else "no result"}
            out.append(r)
        return {"throttle_time": 0, "results": out}

    async def delete_acls(self, req: Any, version: int, ctx: Any) -> dict:
        """DeleteAcls v1-3: for each filter, the bindings it matched and removed.
        Errors per filter: INVALID_REQUEST for a bad filter,
        CLUSTER_AUTHORIZATION_FAILED without Alter on the Cluster."""
        filters: list[AclFilter | str] = []
        for f in req.filters:
            try:
                filters.append(filter_of(f))
            except InvalidAcl as exc:
                filters.append(str(exc))
        code, message, bindings = 0, None, []
        if any(isinstance(f, AclFilter) for f in filters):
            try:
                authz.require("Cluster/DeleteAcls", pb.DeleteAclsRequest())
                code, message, bindings = await self._bindings()
            except authz.Denied as denied:
                code, message = denied.error, str(denied)
        out = []
        for flt in filters:
            if isinstance(flt, str):
                out.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": flt, "matching_acls": []})
                continue
            if code:
                out.append({"error_code": code, "error_message": message, "matching_acls": []})
                continue
            matched = [b for b in bindings if flt.matches(b)]
            matching = []
            if matched:
                resp = await self.servicer.DeleteAcls(pb.DeleteAclsRequest(
                    deletions=[acl_message(b) for b in matched]), None)
                for b, r in zip(matched, resp.results):
                    matching.append({"error_code": r.error_code, "error_message": r.error_message or None,
                                     **kafka_fields(b)})
            out.append({"error_code": 0, "error_message": None, "matching_acls": matching})
        return {"throttle_time": 0, "filter_results": out}
