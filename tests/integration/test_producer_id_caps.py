"""Per-principal caps on what producer ids make a transaction coordinator keep, on real
processes of the default secured dev cluster (`exactly-dev up --security`) with the caps
lowered to make them quick to reach (docs/design.md, "Security", "Producer-id bindings";
KIP-936's intent): mallory's idempotent InitProducerIds beyond
`exactly.producer.ids.max.per.principal` and her transactional ids beyond
`exactly.transactional.ids.max.per.principal` are refused with POLICY_VIOLATION naming
the setting, on the gRPC port and on the Kafka port; a transactional id she holds is
still served, and alice, under the same caps, is not affected. Before, only
exactly.producer.ids.rate bounded them: 100/s for a day is 8.6 million bindings per
principal. The coordinator's memory per entry is measured by
tests/unit/services/txn_coordinator/test_pid_bindings.py::test_memory_per_binding_and_per_transactional_id."""
from __future__ import annotations

import grpc
import pytest

import kafka_requests
from exactly import AclBinding
from exactly_tools.certs import CertificateAuthority
from exactly_wire.error_codes import RETRIABLE, ErrorCode
from exactly_wire.security import TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from clusters import admin_client, certificate_conf, new_chroot
from exactly_tools.devcluster import DevCluster
from services.common.kafka import surface
from waiting import wait_for

pytestmark = pytest.mark.integration

IDEMPOTENT_CAP, TRANSACTIONAL_CAP = 40, 15


@pytest.fixture(scope="module")
def sec(zk, tmp_path_factory):
    c = DevCluster(tmp_path_factory.mktemp("pid-caps"), security=True, props={
        "exactly.producer.ids.max.per.principal": str(IDEMPOTENT_CAP),
        "exactly.transactional.ids.max.per.principal": str(TRANSACTIONAL_CAP)})
    c.up(3, 1, 1, zookeeper=new_chroot(zk, "pidcaps"))
    ca = CertificateAuthority.load(c.dir / "certs")
    for name in ("alice", "mallory"):
        ca.issue(name, client=True)
    with admin_client(c) as a:
        a.create_acls([AclBinding(f"User:{n}", "Cluster", "kafka-cluster", "IdempotentWrite") for n in ("alice", "mallory")]
                      + [AclBinding(f"User:{n}", "TransactionalId", f"{n}-", "All", pattern="Prefixed")
                         for n in ("alice", "mallory")])
    # The coordinator learns of the ACLs from its ZooKeeper watch, after create_acls
    # returned. Mallory's TransactionalId binding is the last one created, so once the
    # coordinator lets her describe an id of hers, it holds all four (a check that
    # allocates no producer id, which the test counts).
    wait_for(lambda: _may_describe(c, "mallory", "mallory-acl-probe"), 30, "the ACLs applied on the coordinator")
    yield c
    c.down()


def _may_describe(c, who: str, transactional_id: str) -> bool:
    """Whether the coordinator, loaded, lets `who` describe `transactional_id`."""
    try:
        r = _coordinator(c, who).DescribeTransactions(
            pb.DescribeTransactionsRequest(transactional_ids=[transactional_id]), timeout=10)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            return False
        raise
    code = r.transaction_states[0].error_code
    return code != ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and code not in RETRIABLE


def _coordinator(c, who: str) -> pbg.TransactionCoordinatorStub:
    return pbg.TransactionCoordinatorStub(secure_channel(c.services["txn-0"].address,
                                                         TransportSecurity.from_conf(certificate_conf(c, who)), []))


def _init(stub, transactional_id: str = "") -> pb.InitProducerIdResponse:
    """InitProducerId, retried while the coordinator loads or the rate throttles."""
    def answered():
        r = stub.InitProducerId(pb.InitProducerIdRequest(transactional_id=transactional_id,
                                                         transaction_timeout_ms=60000), timeout=30)
        return r if r.error_code not in RETRIABLE else None
    return wait_for(answered, 60, "InitProducerId answered", interval_s=0.05)


def test_a_principal_holds_at_most_its_caps_of_producer_ids_and_transactional_ids(sec):
    mallory, alice = _coordinator(sec, "mallory"), _coordinator(sec, "alice")
    idempotent = [_init(mallory) for _ in range(IDEMPOTENT_CAP + 10)]
    codes = [ErrorCode(r.error_code).name for r in idempotent]
    refused = idempotent[-1]
    print(f"{len(codes)} idempotent InitProducerIds of mallory under a cap of {IDEMPOTENT_CAP}: "
          f"{codes.count('NONE')} bound, {codes.count('POLICY_VIOLATION')} refused ({refused.error_message!r})")
    assert codes == ["NONE"] * IDEMPOTENT_CAP + ["POLICY_VIOLATION"] * 10, codes
    assert refused.producer_id == -1 and "exactly.producer.ids.max.per.principal" in refused.error_message
    # The Kafka port (an idempotent producer's InitProducerId forwarded to the coordinator).
    kafka = kafka_requests.call(sec.services["pl-0"].kafka_address, surface.INIT_PRODUCER_ID, 4,
                                {"transactional_id": None, "transaction_timeout": 60000, "producer_id": -1,
                                 "producer_epoch": -1},
                                kafka_requests.tls_context(sec.dir / "certs", "mallory"))
    assert kafka.error_code.value == ErrorCode.POLICY_VIOLATION and kafka.producer_id == -1, kafka

    tids = [_init(mallory, f"mallory-{i}") for i in range(TRANSACTIONAL_CAP + 5)]
    codes = [ErrorCode(r.error_code).name for r in tids]
    print(f"{len(codes)} transactional ids of mallory under a cap of {TRANSACTIONAL_CAP}: "
          f"{codes.count('NONE')} served, {codes.count('POLICY_VIOLATION')} refused ({tids[-1].error_message!r})")
    assert codes == ["NONE"] * TRANSACTIONAL_CAP + ["POLICY_VIOLATION"] * 5, codes
    assert "exactly.transactional.ids.max.per.principal" in tids[-1].error_message
    held = _init(mallory, "mallory-3")  # one she holds: a new epoch, as ever
    assert held.error_code == ErrorCode.NONE and held.producer_epoch == tids[3].producer_epoch + 1
    # alice, under the same caps, holds her own.
    assert _init(alice).error_code == ErrorCode.NONE
    assert _init(alice, "alice-0").error_code == ErrorCode.NONE
