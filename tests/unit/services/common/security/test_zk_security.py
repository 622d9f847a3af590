"""zookeeper.set.acl: credentials and znode ACLs (services/common/security/zk_security.py)."""
from __future__ import annotations

import pytest
from kazoo.security import OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, Permissions

from exactly_wire.config import ConfigurationError
from services.common.security.zk_security import ZkSecurity


def test_off_by_default_means_open_znodes_and_no_credentials():
    z = ZkSecurity({})
    assert z.auth_data == [] and z.default_acl is None and z.sensitive_acl is None


def test_on_gives_the_cluster_identity_everything_and_others_nothing():
    z = ZkSecurity({"zookeeper.set.acl": "true", "zookeeper.digest.username": "exactly",
                    "zookeeper.digest.password": "s3cret"})
    assert z.auth_data == [("digest", "exactly:s3cret")]
    [digest] = z.default_acl
    assert digest.id.scheme == "digest" and digest.id.id.startswith("exactly:") and "s3cret" not in digest.id.id
    assert digest.perms == Permissions.ALL
    assert [a.id.scheme for a in z.sensitive_acl] == ["digest"]
    assert not z.open_to_world(z.default_acl)
    assert z.open_to_world(OPEN_ACL_UNSAFE) and z.open_to_world(READ_ACL_UNSAFE)


def test_credentials_without_acls_only_authenticate():
    z = ZkSecurity({"zookeeper.digest.username": "exactly", "zookeeper.digest.password": "p"})
    assert z.auth_data and z.default_acl is None


@pytest.mark.parametrize("props, message", [
    ({"zookeeper.set.acl": "true"}, "needs zookeeper.digest.username"),
    ({"zookeeper.digest.username": "exactly"}, "go together"),
    ({"zookeeper.digest.password": "p"}, "go together"),
    ({"zookeeper.digest.username": "a:b", "zookeeper.digest.password": "p"}, "must not contain"),
])
def test_incomplete_settings_are_refused(props, message):
    with pytest.raises(ConfigurationError, match=message):
        ZkSecurity(props)
