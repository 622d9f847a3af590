"""ZooKeeper is not a back door: digest authentication and znode ACLs.

With `zookeeper.set.acl=true` every service authenticates to ZooKeeper with the
cluster's digest credentials (`zookeeper.digest.username`,
`zookeeper.digest.password`) and creates every znode with an ACL that gives that
identity all permissions and nobody else anything: not even read, since topic znodes
name the principal that created them and the topics themselves (which Metadata hides
from whoever may not Describe them). The root znode of the services' view (the
chroot's root node, or "/") gets the same ACL (ClusterState.start), and without a
chroot so do ZooKeeper's own `/zookeeper` and `/zookeeper/quota`, which ZooKeeper
creates world-writable: nobody without the credentials creates znodes anywhere.
Producer-id bindings are not in ZooKeeper (they live in `TRANSACTION_STATE_TOPIC`,
pid_binding.py). So a client that reaches ZooKeeper can neither read nor change
partition state, leadership, coordinator ownership, producer-id blocks, ACLs or users
(ZooKeeper answers NoAuth). This follows Kafka's `zookeeper.set.acl` (creator all,
sensitive paths closed) without its world read; docs/design.md, "Security".

A cluster whose znodes were created without ACLs keeps them: turning the setting on
applies to znodes created afterwards (start a new cluster, or set the ACLs of the
existing znodes with ZooKeeper's `setAcl`).
"""
from __future__ import annotations

from typing import Mapping

from kazoo.security import ACL, make_digest_acl

from exactly_wire.config import ConfigurationError

from ..settings import ServiceSchema, key_of, service_settings

SET_ACL = key_of(ServiceSchema, "zookeeper_set_acl")
USERNAME = key_of(ServiceSchema, "zookeeper_digest_username")
PASSWORD = key_of(ServiceSchema, "zookeeper_digest_password")


class ZkSecurity:
    """The ZooKeeper credentials and znode ACLs of one process.

    settings: the service's parsed settings (a mapping of Kafka keys is parsed first;
    the keys of other settings are ignored). Raises ConfigurationError when
    `zookeeper.set.acl` is on without both credentials, or when only one of username
    and password is given.
    """

    def __init__(self, settings: ServiceSchema | Mapping[str, object]):
        s = settings if isinstance(settings, ServiceSchema) else service_settings(settings)
        set_acl = s.zookeeper_set_acl
        user = str(s.zookeeper_digest_username or "")
        password = str(s.zookeeper_digest_password or "")
        if bool(user) != bool(password):
            raise ConfigurationError(f"{USERNAME} and {PASSWORD} go together; give both or neither")
        if set_acl and not user:
            raise ConfigurationError(f"{SET_ACL}=true needs {USERNAME} and {PASSWORD}: the identity the "
                                     "znode ACLs grant every permission to")
        if ":" in user:
            raise ConfigurationError(f"{USERNAME} must not contain ':'")
        self.set_acl = set_acl
        self._user = user
        self._password = password

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        """kazoo `auth_data`: [("digest", "user:password")] or []."""
        return [("digest", f"{self._user}:{self._password}")] if self._user else []

    @property
    def default_acl(self) -> list[ACL] | None:
        """ACL of every znode the process creates: the cluster identity all, nobody
        else anything; None (ZooKeeper's open ACL) when `zookeeper.set.acl` is off."""
        if not self.set_acl:
            return None
        return [make_digest_acl(self._user, self._password, all=True)]

    @property
    def sensitive_acl(self) -> list[ACL] | None:
        """ACL of the sensitive znodes (SCRAM credentials, the ACL list, the session-token
        key): the cluster identity only, as every znode now (default_acl); kept apart so
        these stay closed whatever default_acl becomes."""
        return self.default_acl

    @staticmethod
    def open_to_world(acls: list[ACL]) -> bool:
        """Whether `acls` give the world (world:anyone) any permission."""
        return any(a.id.scheme == "world" for a in acls)
