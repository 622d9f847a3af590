"""ACL authorization, as the KIP-98 design document's "Authorization" section specifies it
and Kafka's AclAuthorizer implements it (docs/design.md, "Security").

An ACL binding allows or denies one principal (`User:alice`, or `User:*` for everyone)
one operation on resources of one type whose name matches a pattern: LITERAL (the
name, or `*` for every resource of the type) or PREFIXED (every name starting with
it). Deciding a request, as Kafka does:

1. a super user (`super.users`) is allowed everything;
2. a DENY binding that matches the principal (or `User:*`), the operation (or All)
   and the resource denies, whatever allows;
3. an ALLOW binding that matches allows; an allowed Read, Write, Delete or Alter
   also allows Describe, an allowed AlterConfigs also DescribeConfigs (Kafka's
   implied operations);
4. with no binding at all on the resource, `allow.everyone.if.no.acl.found` decides
   (false by default when the authorizer is on); otherwise the request is denied.

Pure logic over an in-memory set of bindings; `AclCache` keeps the set a ZooKeeper
watch delivers (services/common/cluster/state.py stores them under /exactly/acls).
"""
from __future__ import annotations

import base64
import enum
import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from typing import Iterable

log = logging.getLogger(__name__)


class ResourceType(enum.Enum):
    TOPIC = "Topic"
    GROUP = "Group"
    TRANSACTIONAL_ID = "TransactionalId"
    CLUSTER = "Cluster"


class Operation(enum.Enum):
    ALL = "All"
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DELETE = "Delete"
    ALTER = "Alter"
    DESCRIBE = "Describe"
    CLUSTER_ACTION = "ClusterAction"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    ALTER_CONFIGS = "AlterConfigs"
    IDEMPOTENT_WRITE = "IdempotentWrite"


class PatternType(enum.Enum):
    LITERAL = "Literal"
    PREFIXED = "Prefixed"


class Permission(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"


CLUSTER_NAME = "kafka-cluster"  # Kafka's name of the single Cluster resource
WILDCARD = "*"
ANY_PRINCIPAL = "User:*"

# Operations that also grant Describe (Kafka's AclAuthorizer: "implicit describe").
_IMPLIES_DESCRIBE = {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}


@dataclass(frozen=True)
class Resource:
    type: ResourceType
    name: str


@dataclass(frozen=True)
class AclBinding:
    """One ACL: `principal` ("User:name" or "User:*") is allowed or denied `operation`
    on resources of `resource_type` matching `name` by `pattern`."""

    principal: str
    resource_type: ResourceType
    name: str
    pattern: PatternType
    operation: Operation
    permission: Permission
    host: str = WILDCARD

    def matches_resource(self, resource: Resource) -> bool:
        if self.resource_type is not resource.type:
            return False
        if self.pattern is PatternType.PREFIXED:
            return resource.name.startswith(self.name)
        return self.name == WILDCARD or self.name == resource.name

    def matches_principal(self, principal: str) -> bool:
        return self.principal == ANY_PRINCIPAL or self.principal == principal

    def to_json(self) -> dict:
        return {"principal": self.principal, "resource_type": self.resource_type.value, "name": self.name,
                "pattern": self.pattern.value, "operation": self.operation.value,
                "permission": self.permission.value, "host": self.host}

    @classmethod
    def from_json(cls, d: dict) -> "AclBinding":
        """Raises ValueError (or KeyError) for a malformed binding."""
        principal = str(d["principal"])
        if not principal.startswith("User:") or len(principal) <= len("User:"):
            raise ValueError(f"principal {principal!r} must be User:<name> or User:*")
        binding = cls(principal, ResourceType(d["resource_type"]), str(d["name"]), PatternType(d["pattern"]),
                      Operation(d["operation"]), Permission(d["permission"]), str(d.get("host", WILDCARD)))
        if not binding.name:
            raise ValueError("an ACL needs a resource name (or * for every resource)")
        if binding.resource_type is ResourceType.CLUSTER and binding.name not in (CLUSTER_NAME, WILDCARD):
            raise ValueError(f"the Cluster resource is named {CLUSTER_NAME!r}")
        return binding

    def key(self) -> str:
        """A stable identity (the znode name under /exactly/acls)."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:32]


class Authorizer:
    """Decides (principal, operation, resource) over `bindings` (see the module).

    super_users: principals allowed everything (`super.users`, "User:a;User:b");
    allow_if_no_acl: `allow.everyone.if.no.acl.found`."""

    def __init__(self, bindings: Iterable[AclBinding] = (), super_users: Iterable[str] = (),
                 allow_if_no_acl: bool = False):
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self._bindings: tuple[AclBinding, ...] = tuple(bindings)

    def set_bindings(self, bindings: Iterable[AclBinding]) -> None:
        self._bindings = tuple(bindings)

    @property
    def bindings(self) -> tuple[AclBinding, ...]:
        return self._bindings

    def authorize(self, principal: str, operation: Operation, resource: Resource) -> bool:
        if principal in self.super_users:
            return True
        on_resource = [b for b in self._bindings if b.matches_resource(resource)]
        mine = [b for b in on_resource if b.matches_principal(principal)]
        for b in mine:
            if b.permission is Permission.DENY and b.operation in (operation, Operation.ALL):
                return False
        for b in mine:
            if b.permission is not Permission.ALLOW:
                continue
            if b.operation in (operation, Operation.ALL):
                return True
            if operation is Operation.DESCRIBE and b.operation in _IMPLIES_DESCRIBE:
                return True
            if operation is Operation.DESCRIBE_CONFIGS and b.operation is Operation.ALTER_CONFIGS:
                return True
        return not on_resource and self.allow_if_no_acl


def parse_super_users(value: str | None) -> frozenset[str]:
    """`super.users`: principals separated by ';' (Kafka's format)."""
    return frozenset(p.strip() for p in (value or "").split(";") if p.strip())


class AclCache:
    """The bindings a ZooKeeper watch delivers, swapped in atomically; readers take
    the current Authorizer without locking."""

    def __init__(self, authorizer: Authorizer):
        self.authorizer = authorizer
        self._lock = threading.Lock()
        self.version = 0

    def update(self, raw: Iterable[bytes]) -> list[str]:
        """Replace the bindings with the JSON values `raw`; returns the problems of the
        values that did not parse (they are left out, never half-applied)."""
        good, bad = [], []
        for data in raw:
            try:
                good.append(AclBinding.from_json(json.loads(data)))
            except (ValueError, KeyError, TypeError) as exc:
                bad.append(str(exc))
        with self._lock:
            self.authorizer.set_bindings(good)
            self.version += 1
        return bad


ACLS = "/exactly/acls"


def encode_name(binding: AclBinding) -> str:
    """The znode name of a binding: its JSON, base64url (a watch on the parent then
    delivers every binding without reading any znode)."""
    return base64.urlsafe_b64encode(json.dumps(binding.to_json(), sort_keys=True).encode()).decode()


def decode_name(name: str) -> bytes:
    return base64.urlsafe_b64decode(name.encode())


class AclStore:
    """The bindings under /exactly/acls, one znode per binding named by its encoded
    JSON (`encode_name`), fed into `cache` by a ZooKeeper children watch: an ACL added
    or removed applies as soon as the watch fires, without a restart."""

    def __init__(self, zk, cache: AclCache | None = None, acl: list | None = None):
        """acl: the znode ACL of /exactly/acls and every binding under it (with
        zookeeper.set.acl the sensitive one: the cluster identity only, so the ACL
        list is not readable without the digest, zk_security.py); None: the
        client's default."""
        self.zk = zk
        self.cache = cache
        self.acl = acl
        from kazoo.exceptions import NodeExistsError
        zk.ensure_path(ACLS.rsplit("/", 1)[0])
        try:
            zk.create(ACLS, b"", acl=acl)
        except NodeExistsError:
            if acl is not None:
                zk.set_acls(ACLS, acl)  # created world-readable by an earlier version
        if cache is not None:  # without a cache: only add, remove and list
            zk.ChildrenWatch(ACLS, self._on_children)

    def _on_children(self, children: list[str]) -> None:
        raw = []
        for name in children:
            try:
                raw.append(decode_name(name))
            except ValueError as exc:
                log.warning("ignoring an undecodable ACL znode %r: %s", name, exc)
        for problem in self.cache.update(raw):
            log.warning("ignoring a malformed ACL in ZooKeeper: %s", problem)
        log.info("ACLs: %d bindings", len(self.cache.authorizer.bindings))

    def add(self, binding: AclBinding) -> bool:
        """Store `binding`; False when it was there already."""
        from kazoo.exceptions import NodeExistsError
        try:
            self.zk.create(f"{ACLS}/{encode_name(binding)}", b"", acl=self.acl)
            return True
        except NodeExistsError:
            return False

    def remove(self, binding: AclBinding) -> bool:
        from kazoo.exceptions import NoNodeError
        try:
            self.zk.delete(f"{ACLS}/{encode_name(binding)}")
            return True
        except NoNodeError:
            return False

    def list(self) -> list[AclBinding]:
        out = []
        for name in self.zk.get_children(ACLS):
            try:
                out.append(AclBinding.from_json(json.loads(decode_name(name))))
            except (ValueError, KeyError, TypeError):
                continue
        return sorted(out, key=lambda b: (b.resource_type.value, b.name, b.principal, b.operation.value))
