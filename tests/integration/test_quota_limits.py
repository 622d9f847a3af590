"""Quotas hold whatever the client does, on real processes of the default secured dev
cluster (`exactly-dev up --security`: 3 partition leaders, a transaction and a group
coordinator, TLS with client certificates, authorizer=acl; docs/design.md, "Quotas"):

- max_partitions is reserved with the topic: 16 CreateTopics at once, spread over
  every process, under a quota of 4 partitions create 4 partitions, not 16;
"""
from __future__ import annotations

import threading
import uuid

import grpc
import pytest

from exactly import AclBinding
from exactly_tools.certs import CertificateAuthority
from exactly_wire.error_codes import ErrorCode
from exactly_wire.security import TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from clusters import admin_client, certificate_conf, chrooted_cluster
from waiting import wait_for

pytestmark = pytest.mark.integration

USERS = ("alice", "mallory")


@pytest.fixture(scope="module")
def sec(zk, tmp_path_factory):
    c = chrooted_cluster(zk, tmp_path_factory.mktemp("quota-limits"), "quotalimits", security=True)
    ca = CertificateAuthority.load(c.dir / "certs")
    for name in USERS:
        ca.issue(name, client=True)
    with admin_client(c) as a:
        a.create_acls([AclBinding(f"User:{who}", kind, f"{who}-", "All", pattern="Prefixed")
                       for who in USERS for kind in ("Topic", "Group", "TransactionalId")])
    yield c
    c.down()


def channel(c, who: str, service: str, user_agent: str | None = None) -> grpc.Channel:
    options = [("grpc.primary_user_agent", user_agent)] if user_agent else []
    return secure_channel(c.services[service].address, TransportSecurity.from_settings(certificate_conf(c, who)),
                          options)


def set_quota(c, user: str, **values: float) -> None:
    with admin_client(c) as a:
        a.alter_client_quotas({"user": user}, values)


# ---------------------------------------------------------------- max_partitions
def test_concurrent_create_topics_reserve_the_partition_quota(sec):
    """16 CreateTopics of one partition each, sent at once by 16 threads to the five
    processes in turn, under max_partitions=4: 4 are created, 12 refused with
    POLICY_VIOLATION naming the quota, and the principal's topics hold 4 partitions."""
    prefix = f"mallory-pq-{uuid.uuid4().hex[:6]}"
    set_quota(sec, "mallory", max_partitions=4)
    probe = pbg.ClusterStub(channel(sec, "mallory", "pl-0"))

    def create(stub, name: str, partitions: int = 1) -> pb.CreatableTopicResult:
        return stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=1)]), timeout=60).topics[0]
    # Applied by every process's watch: 5 partitions at once are refused everywhere (a
    # probe created before is deleted again, which gives its partitions back).
    services = sorted(sec.services)
    for service in services:
        stub = pbg.ClusterStub(channel(sec, "mallory", service))

        def refused() -> bool:
            name = f"{prefix}-probe-{uuid.uuid4().hex[:4]}"
            code = create(stub, name, 5).error_code
            if code == ErrorCode.NONE:
                with admin_client(sec) as a:
                    a.delete_topics([name])
            return code == ErrorCode.POLICY_VIOLATION
        wait_for(refused, 20, f"the quota applied at {service}")
    stubs = [pbg.ClusterStub(channel(sec, "mallory", services[i % len(services)])) for i in range(16)]
    barrier = threading.Barrier(16)
    results: dict[int, pb.CreatableTopicResult] = {}

    def run(i: int) -> None:
        barrier.wait(30)
        results[i] = create(stubs[i], f"{prefix}-{i}")
    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    codes = sorted(ErrorCode(r.error_code).name for r in results.values())

    def listed() -> dict[str, int]:  # the topics created, once the metadata lists every one answered NONE
        with admin_client(sec) as a:
            found = {n: len(d.partitions) for n, d in a.describe_topics(
                [n for n in a.list_topics() if n.startswith(f"{prefix}-") and "probe" not in n]).items()}
        return found if len(found) >= codes.count("NONE") else {}
    created = wait_for(listed, 30, "the created topics listed")
    print(f"16 concurrent CreateTopics under max_partitions=4: {codes.count('NONE')} created, "
          f"{sum(created.values())} partitions; answers {codes}")
    assert len(results) == 16
    assert sum(created.values()) == 4, created
    assert codes.count("NONE") == 4 and codes.count("POLICY_VIOLATION") == 12, codes
    refused = next(r for r in results.values() if r.error_code)
    assert "partition quota of 4" in refused.error_message and "max_partitions" in refused.error_message
    assert create(probe, f"{prefix}-more").error_code == ErrorCode.POLICY_VIOLATION
