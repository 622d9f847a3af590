"""Authorization on real processes (KIP-98 design document, "Authorization";
docs/design.md, "Security"): a secured dev cluster (TLS with client certificates,
authorizer=acl). For every RPC of every service (a matrix checked against the protobuf
descriptors), a principal with the ACL succeeds and
one without gets Kafka's specific error; a client's WriteTxnMarkers and a spoofed
replica fetch are refused; ACL changes apply within a second; SASL users are checked
against their SCRAM credentials."""
from __future__ import annotations

import time
import uuid

import grpc
import pytest

from exactly import AclBinding, AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from exactly._link import Connector
from exactly_tools.certs import CertificateAuthority
from exactly_wire import client_calls, records
from exactly_wire.error_codes import RETRIABLE
from exactly_wire.links import HEADER
from exactly_wire.security import TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from clusters import admin_client, certificate_conf, chrooted_cluster, zookeeper_client
from services.common.transport.tunnel import TunnelError
from waiting import wait_for


pytestmark = pytest.mark.integration

FAST = {"request.timeout.ms": 5000, "retry.backoff.ms": 50, "retry.backoff.max.ms": 200}


@pytest.fixture(scope="module")
def sec(zk, tmp_path_factory):
    c = chrooted_cluster(zk, tmp_path_factory.mktemp("authz-cluster"), "authz", security=True)
    ca = CertificateAuthority.load(c.dir / "certs")
    for name in ("alice", "bob", "carol"):
        ca.issue(name, client=True)
    yield c
    c.down()


def conf(sec, name: str, **extra) -> dict:
    return certificate_conf(sec, name, **FAST, **extra)


def admin(sec) -> AdminClient:
    return admin_client(sec)


def stub(sec, name: str, address: str, kind=pbg.PartitionLeaderStub):
    security = TransportSecurity.from_conf(conf(sec, name))
    return kind(secure_channel(address, security, []))


@pytest.fixture(scope="module")
def world(sec):
    """A topic, a group and a transactional.id alice may use and bob may not."""
    topic, grp, tid = (f"{p}-{uuid.uuid4().hex[:6]}" for p in ("t", "g", "tx"))
    with admin(sec) as a:
        a.create_topics([NewTopic(topic, 1, 1)])
        a.create_acls([AclBinding("User:alice", "Topic", topic, "All"),
                       AclBinding("User:alice", "Group", grp, "All"),
                       AclBinding("User:alice", "TransactionalId", tid, "All"),
                       AclBinding("User:alice", "Cluster", "kafka-cluster", "IdempotentWrite")])
    wait_for(lambda: _can_describe(sec, "alice", topic), 10, "alice's ACLs applied")
    # The transaction coordinator applies its ACLs from a ZooKeeper watch of its own, which may
    # run after the leaders' (a fresh-clone run failed test_topic_rpcs's first idempotent
    # InitProducerId with CLUSTER_AUTHORIZATION_FAILED).
    wait_for(lambda: _may_write_idempotently(sec, "alice"), 30, "alice's IdempotentWrite on the coordinator")
    return topic, grp, tid


def _can_describe(sec, who: str, topic: str) -> bool:
    with AdminClient(conf(sec, who)) as a:
        return topic in a.list_topics()


def _may_write_idempotently(sec, who: str) -> bool:
    """Whether the transaction coordinator gives `who` an idempotent producer id."""
    coordinator = stub(sec, who, sec.services["txn-0"].address, pbg.TransactionCoordinatorStub)
    try:
        resp = coordinator.InitProducerId(pb.InitProducerIdRequest(transaction_timeout_ms=60000), timeout=20)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            return False
        raise
    return resp.error_code == 0


def test_topic_rpcs(sec, world):
    topic, grp, tid = world
    tp = TopicPartition(topic, 0)
    # Metadata lists only what the principal may Describe.
    assert _can_describe(sec, "alice", topic) and not _can_describe(sec, "bob", topic)
    # Produce: Write on the topic.
    with Producer(conf(sec, "alice", **{"enable.idempotence": True})) as p:
        p.send(topic, b"by-alice").result(10)
    with Producer(conf(sec, "bob", **{"enable.idempotence": False, "acks": "1"})) as p:
        with pytest.raises(errors.ExactlyError) as info:
            p.send(topic, b"by-bob", partition=0).result(10)
    assert isinstance(info.value, (errors.TopicAuthorizationFailedError, errors.KafkaTimeoutError)), info.value
    leader = stub(sec, "bob", sec.services["pl-0"].address)
    for address in (s.address for s in sec.services.values() if s.role == "partition_leader"):
        leader = stub(sec, "bob", address)
        try:
            leader.Produce(pb.ProduceRequest(acks=1, topics=[pb.TopicProduceData(name=topic, partitions=[
                pb.PartitionProduceData(partition=0, records=records.encode_batch([(None, b"x", (), 1)]))])]),
                timeout=10)
            raise AssertionError("bob's Produce was accepted")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
            assert exc.details().startswith("TOPIC_AUTHORIZATION_FAILED")
    # Fetch and ListOffsets: Read / Describe on the topic.
    with Consumer(conf(sec, "alice")) as c:
        c.assign([tp])
        c.seek_to_beginning([tp])
        got = []
        wait_for(lambda: got.extend(c.poll(0.3)) or got, 20, "alice reads")
        assert got[0].value == b"by-alice"
    with Consumer(conf(sec, "bob")) as c:
        with pytest.raises(errors.TopicAuthorizationFailedError):
            c.get_watermark_offsets(tp, timeout=5)
    # CreateTopics: Create on the Cluster (or the topic); DeleteTopics: Delete.
    with AdminClient(conf(sec, "bob")) as a:
        with pytest.raises(errors.TopicAuthorizationFailedError):
            a.create_topics([NewTopic(f"bobs-{topic}", 1)])
        with pytest.raises(errors.TopicAuthorizationFailedError):
            a.delete_topics([topic])
        with pytest.raises(errors.ClusterAuthorizationFailedError):
            a.create_acls([AclBinding("User:bob", "Topic", "*", "All")])


def test_transaction_and_group_rpcs(sec, world):
    topic, grp, tid = world
    tp = TopicPartition(topic, 0)
    p = Producer(conf(sec, "alice", **{"transactional.id": tid}))
    p.init_transactions()
    p.begin_transaction()
    p.send(topic, b"txn", partition=0)
    p.send_offsets_to_transaction({tp: 1}, grp)
    p.commit_transaction()
    p.close()
    with pytest.raises(errors.TransactionalIdAuthorizationFailedError):
        Producer(conf(sec, "bob", **{"transactional.id": tid})).init_transactions()
    with Consumer(conf(sec, "bob", **{"group.id": grp})) as c:
        with pytest.raises(errors.GroupAuthorizationFailedError):
            c.committed([tp], timeout=5)
    with Consumer(conf(sec, "alice", **{"group.id": grp, "isolation.level": "read_committed"})) as c:
        assert c.committed([tp], timeout=10)[tp].offset == 1
    # Listings show only what the principal may Describe.
    with AdminClient(conf(sec, "bob")) as a:
        assert a.list_transactions() == []
        with pytest.raises(errors.TransactionalIdAuthorizationFailedError):
            a.describe_transactions([tid])
    with AdminClient(conf(sec, "alice")) as a:
        assert [t.transactional_id for t in a.list_transactions()] == [tid]


def test_markers_and_replica_fetches_need_the_cluster_principal(sec, world):
    """A client's WriteTxnMarkers (which could commit or abort someone else's open
    transaction, or fence the coordinator with epoch 2^31-1) and a fetch claiming to
    be a follower are refused; the victim's transaction stays invisible and then
    commits normally."""
    topic, grp, tid = world
    tp = TopicPartition(topic, 0)
    victim = Producer(conf(sec, "alice", **{"transactional.id": tid}))
    victim.init_transactions()
    victim.begin_transaction()
    victim.send(topic, b"victim-open", partition=0).result(10)
    with admin(sec) as a:
        pid = next(s for s in a.describe_producers([tp])[tp] if s.current_transaction_start_offset >= 0).producer_id
        leader_id = a.describe_topics([topic])[topic].partitions[0].leader_id
    address = sec.services[leader_id].address
    for attempt in (True, False):
        with pytest.raises(grpc.RpcError) as info:
            stub(sec, "alice", address).WriteTxnMarkers(pb.WriteTxnMarkersRequest(markers=[pb.WritableTxnMarker(
                producer_id=pid, producer_epoch=32000, committed=attempt, coordinator_epoch=2 ** 31 - 1,
                topics=[pb.TopicPartitions(topic=topic, partitions=[0])])]), timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert info.value.details().startswith("CLUSTER_AUTHORIZATION_FAILED")
    with AdminClient(conf(sec, "alice")) as a:
        hw, lso = a.list_offsets([tp])[tp]
        assert lso < hw  # still open, still invisible to read_committed
    # A replica fetch claiming another node: refused even for a service principal.
    other = next(n for n, s in sec.services.items() if s.role == "partition_leader" and n != leader_id)
    impostor = next(n for n, s in sec.services.items() if s.role == "partition_leader" and n not in (leader_id, other))
    for who in ("alice", impostor):
        with pytest.raises(grpc.RpcError) as info:
            stub(sec, who, address).Fetch(pb.FetchRequest(replica_id=other, max_wait_ms=0, topics=[pb.FetchTopic(
                topic=topic, partitions=[pb.FetchPartition(partition=0, fetch_offset=10 ** 9)])]), timeout=10)
        assert info.value.details().startswith("CLUSTER_AUTHORIZATION_FAILED")
    victim.commit_transaction()
    victim.close()
    with AdminClient(conf(sec, "alice")) as a:
        wait_for(lambda: (lambda hw_lso: hw_lso[0] == hw_lso[1])(a.list_offsets([tp])[tp]), 10, "the LSO caught up")


def test_a_batch_under_another_principals_producer_id_is_refused(sec, world):
    """Beyond the seed: bob, allowed to write the topic and his own transactional.id,
    sends batches under alice's producer id (into her open transaction, with a higher
    epoch to fence her, without a transactional.id, and a TxnOffsetCommit). Each is
    refused before the partition's producer state moves; alice's transaction stays
    invisible, then commits; read_committed sees her records and none of bob's."""
    from exactly_wire.clock import wall_clock_ms
    _topic, grp, tid = world
    topic = f"hijack-{uuid.uuid4().hex[:6]}"  # bob may write here (not the shared topic)
    tp = TopicPartition(topic, 0)
    bob_tid, bob_grp = f"bob-{uuid.uuid4().hex[:6]}", f"bobg-{uuid.uuid4().hex[:6]}"
    with admin(sec) as a:
        a.create_topics([NewTopic(topic, 1, 1)])
        a.create_acls([AclBinding("User:alice", "Topic", topic, "All"),
                       AclBinding("User:bob", "Topic", topic, "Write"),
                       AclBinding("User:bob", "Topic", topic, "Read"),
                       AclBinding("User:bob", "TransactionalId", bob_tid, "Write"),
                       AclBinding("User:bob", "Group", bob_grp, "Read")])
    wait_for(lambda: _can_describe(sec, "bob", topic) and _can_describe(sec, "alice", topic), 10,
             "the ACLs applied")
    victim = Producer(conf(sec, "alice", **{"transactional.id": tid}))
    victim.init_transactions()
    victim.begin_transaction()
    victim.send(topic, b"alice-1", partition=0).result(10)
    with admin(sec) as a:
        state = next(s for s in a.describe_producers([tp])[tp] if s.current_transaction_start_offset >= 0)
        leader_id = a.describe_topics([topic])[topic].partitions[0].leader_id
    pid, epoch, seq = state.producer_id, state.producer_epoch, state.last_sequence + 1
    leader = stub(sec, "bob", sec.services[leader_id].address)
    group = stub(sec, "bob", sec.services["group-0"].address, pbg.GroupCoordinatorStub)

    def produce(transactional: bool, producer_epoch: int, transactional_id: str):
        batch = records.encode_batch([(None, b"bob-forged", (), wall_clock_ms())], producer_id=pid,
                                     producer_epoch=producer_epoch, base_sequence=seq, transactional=transactional)
        resp = leader.Produce(pb.ProduceRequest(acks=-1, timeout_ms=10000, transactional_id=transactional_id,
                                                topics=[pb.TopicProduceData(name=topic, partitions=[
                                                    pb.PartitionProduceData(partition=0, records=batch)])]),
                              timeout=15)
        return resp.topics[0].partitions[0]

    attempts = {
        "into her transaction": (produce(True, epoch, bob_tid), "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
        "fencing her epoch": (produce(True, epoch + 1, bob_tid), "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
        "idempotent, higher epoch": (produce(False, epoch + 1, ""), "CLUSTER_AUTHORIZATION_FAILED"),
    }
    for what, (part, expected) in attempts.items():
        assert errors.ErrorCode(part.error_code).name == expected, (what, part)
        assert "issued to another principal" in part.error_message, (what, part.error_message)
    commit = group.TxnOffsetCommit(pb.TxnOffsetCommitRequest(
        transactional_id=bob_tid, group_id=bob_grp, producer_id=pid, producer_epoch=epoch,
        generation_id=-1, topics=[pb.OffsetCommitTopic(name=topic, partitions=[
            pb.OffsetCommitPartition(partition=0, committed_offset=1)])]), timeout=15)
    assert commit.topics[0].partitions[0].error_code == errors.ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    with admin(sec) as a:
        after = next(s for s in a.describe_producers([tp])[tp] if s.producer_id == pid)
        hw, lso = a.list_offsets([tp])[tp]
    assert (after.producer_epoch, after.last_sequence) == (epoch, seq - 1)  # not bumped, not advanced
    assert lso < hw  # her transaction is still open and invisible
    victim.send(topic, b"alice-2", partition=0).result(10)
    victim.commit_transaction()
    victim.close()
    with AdminClient(conf(sec, "alice")) as a:
        wait_for(lambda: (lambda hw_lso: hw_lso[0] == hw_lso[1])(a.list_offsets([tp])[tp]), 10, "the LSO caught up")
    reader = Consumer(conf(sec, "alice", **{"isolation.level": "read_committed", "group.id": grp,
                                            "enable.auto.commit": False}))
    reader.assign([tp])
    reader.seek_to_beginning([tp])
    seen: list[bytes] = []
    deadline = time.monotonic() + 20
    while b"alice-2" not in seen and time.monotonic() < deadline:
        seen += [r.value for r in reader.poll(0.5)]
    reader.close()
    assert b"alice-1" in seen and b"alice-2" in seen and b"bob-forged" not in seen, seen


def test_acl_changes_apply_within_a_second(sec, world):
    topic, _grp, _tid = world
    acl = AclBinding("User:bob", "Topic", topic, "Describe")
    with admin(sec) as a:
        a.create_acls([acl])
        started = time.monotonic()
        wait_for(lambda: _can_describe(sec, "bob", topic), 5, "bob's new ACL")
        granted = time.monotonic() - started
        assert acl in a.describe_acls()
        a.delete_acls([acl])
        started = time.monotonic()
        wait_for(lambda: not _can_describe(sec, "bob", topic), 5, "bob's ACL removed")
        revoked = time.monotonic() - started
    assert granted < 1.0 and revoked < 1.0, (granted, revoked)


def test_sasl_users_are_checked_against_their_scram_credentials(sec, world):
    topic, _grp, _tid = world
    with admin(sec) as a:
        a.alter_user_scram_credentials({"dave": "correct horse"})
        a.create_acls([AclBinding("User:dave", "Topic", topic, "Describe")])
        assert "dave" in a.describe_user_scram_credentials()
    # dave authenticates with SASL over TLS (the listener also wants a certificate: bob's).
    good = conf(sec, "bob", **{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                               "sasl.username": "dave", "sasl.password": "correct horse"})
    wait_for(lambda: _can_describe_conf(good, topic), 10, "dave sees the topic")
    bad = {**good, "sasl.password": "wrong"}
    with pytest.raises(errors.SaslAuthenticationFailedError):
        with AdminClient(bad) as a:
            a.list_topics()
    with admin(sec) as a:
        a.alter_user_scram_credentials(deletions=["dave"])
    wait_for(lambda: _sasl_fails(good), 10, "dave deleted")


def _can_describe_conf(c: dict, topic: str) -> bool:
    with AdminClient(c) as a:
        return topic in a.list_topics()


def _sasl_fails(c: dict) -> bool:
    try:
        with AdminClient(c) as a:
            a.list_topics()
        return False
    except errors.SaslAuthenticationFailedError:
        return True


def test_acls_and_users_commands(sec, world, tmp_path):
    """`exactly acls` and `exactly users` through the installed entry point, with the
    admin's TLS settings in --command-config; a principal without Alter on the
    Cluster gets one clear error line."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    exe = str(Path(sys.executable).parent / "exactly")
    topic, _grp, _tid = world

    def props(c: dict) -> str:
        path = tmp_path / f"{abs(hash(tuple(sorted(c.items()))))}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in c.items() if k != "bootstrap.servers"))
        return str(path)

    admin_props = props(sec.client_config)

    def run(*args, config=admin_props, ok=True):
        res = subprocess.run([exe, *args, "--bootstrap-server", sec.bootstrap_servers, "--command-config", config],
                             capture_output=True, text=True, timeout=120)
        if ok:
            assert res.returncode == 0, res
        return res

    out = run("acls", "add", "--principal", "User:erin", "--resource-type", "Topic", "--name", topic,
              "--operation", "Read", "--operation", "Describe").stdout
    assert "Added Allow User:erin Read on Topic" in out
    listed = json.loads(run("acls", "list", "--principal", "User:erin", "--json").stdout)
    assert sorted(a["operation"] for a in listed) == ["Describe", "Read"]
    assert "PRINCIPAL" in run("acls", "list").stdout
    run("acls", "remove", "--principal", "User:erin", "--resource-type", "Topic", "--name", topic,
        "--operation", "Read", "--operation", "Describe")
    assert json.loads(run("acls", "list", "--principal", "User:erin", "--json").stdout) == []
    assert "User erin set" in run("users", "add", "erin", "--password", "pw-erin").stdout
    assert "erin" in json.loads(run("users", "list", "--json").stdout)
    assert "User erin removed." in run("users", "remove", "erin").stdout
    denied = run("acls", "add", "--principal", "User:bob", "--resource-type", "Cluster", "--name", "kafka-cluster",
                 "--operation", "All", config=props({k: v for k, v in conf(sec, "bob").items()
                                                      if k.startswith(("ssl.", "security."))}), ok=False)
    assert denied.returncode == 1 and "Traceback" not in denied.stderr
    assert denied.stderr.strip().startswith("exactly: error:") and "ClusterAuthorizationFailedError" in denied.stderr
    bad = run("acls", "add", "--principal", "User:x", "--resource-type", "Planet", "--name", "n",
              "--operation", "Read", ok=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_purchases_pipeline_secured(tmp_path, capsys):
    """`make demo DEMO_ARGS="--security"`: the whole pipeline over TLS with client
    certificates and ACLs, the worker holding only the ACLs it needs (it may not read
    what it writes), with the same exactly-once summary."""
    from demo.purchases import run
    assert run(tmp_path / "demo", keep=False, security=True) == 0
    out = capsys.readouterr().out
    assert "refused (TopicAuthorizationFailedError), as its ACLs say" in out
    assert "invoices out (read_committed):     9,998   duplicates 0   missing 0" in out
    assert "RESULT: exactly once" in out


def test_zookeeper_is_not_a_back_door(sec, world):
    """Without the services' digest credentials a ZooKeeper client may neither read nor
    change partition state, coordinator ownership, the producer-id block, ACLs or users,
    may not read the SCRAM credentials or the ACL list, and may not create znodes under
    the root (the chroot's) (zookeeper.set.acl). Producer-id bindings are not in
    ZooKeeper at all."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError
    from kazoo.security import OPEN_ACL_UNSAFE
    topic, _grp, _tid = world
    state = f"/exactly/topics/{topic}/0/state"
    intruder = KazooClient(hosts=sec.zookeeper)
    intruder.start(timeout=30)
    services = zookeeper_client(sec)
    try:
        before, _ = services.get(state)
        assert b"leader" in before
        attempts = {
            "read partition state": lambda: intruder.get(state),
            "partition state": lambda: intruder.set(state, b'{"leader": "intruder"}'),
            "new topic": lambda: intruder.create("/exactly/topics/intruder", b"{}"),
            "coordinator ownership": lambda: intruder.create("/exactly/coordinators/txn/99", b"{}"),
            "producer-id block": lambda: intruder.set("/exactly/producer_id_block", b'{"next": 0}'),
            "ACL": lambda: intruder.create("/exactly/acls/intruder", b""),
            "user": lambda: intruder.create("/exactly/config/users/intruder", b"{}"),
            "read SCRAM credentials": lambda: intruder.get_children("/exactly/config/users"),
            "read the ACL list": lambda: intruder.get_children("/exactly/acls"),
            "create beside /exactly (the chroot's root)": lambda: intruder.create("/intruder", b""),
            "change the root's ACL": lambda: intruder.set_acls("/", OPEN_ACL_UNSAFE),
            "read the SASL session-token key": lambda: intruder.get("/exactly/config/sasl-token-key"),
            "replace the SASL session-token key": lambda: intruder.set("/exactly/config/sasl-token-key", b"k" * 32),
            "delete a live service": lambda: intruder.delete(f"/exactly/services/{sec.services['pl-0'].name}"),
        }
        refused = {}
        for what, attempt in attempts.items():
            try:
                attempt()
                refused[what] = False
            except NoAuthError:
                refused[what] = True
        assert all(refused.values()), refused
        assert services.get(state)[0] == before
        assert services.exists("/exactly/producer_ids") is None  # bindings live in __transaction_state
    finally:
        for client in (intruder, services):
            client.stop()
            client.close()
    with admin(sec) as a:  # the cluster still works for its own principals
        assert topic in a.list_topics()


# ---------------------------------------------------------------- the matrix
# One row per RPC of every service: who may call it, who may not and the error the
# latter gets. A new RPC fails test_every_rpc_is_in_the_matrix until it has a row.
AUTH_CODES = {errors.ErrorCode.TOPIC_AUTHORIZATION_FAILED, errors.ErrorCode.GROUP_AUTHORIZATION_FAILED,
              errors.ErrorCode.CLUSTER_AUTHORIZATION_FAILED, errors.ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
STUBS = {"Cluster": pbg.ClusterStub, "PartitionLeader": pbg.PartitionLeaderStub, "Tunnel": pbg.TunnelStub,
         "TransactionCoordinator": pbg.TransactionCoordinatorStub, "GroupCoordinator": pbg.GroupCoordinatorStub}
TOPIC_DENIED, GROUP_DENIED = "TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED"
CLUSTER_DENIED, TXN_DENIED = "CLUSTER_AUTHORIZATION_FAILED", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
LISTED = "listed"  # a listing: the principal without ACLs sees none of the resources


def _tps(topic: str) -> list:
    return [pb.TopicPartitions(topic=topic, partitions=[0])]


def _commit(topic: str) -> list:
    return [pb.OffsetCommitTopic(name=topic, partitions=[pb.OffsetCommitPartition(partition=0, committed_offset=0)])]


def _matrix_rows():
    """(RPC, allowed principal, denied principal, expected denial or LISTED, request(ctx))."""
    from exactly_wire.clock import wall_clock_ms
    S = "Cluster"
    return [
        (f"{S}/Metadata", "alice", "bob", LISTED, lambda c: pb.MetadataRequest()),
        (f"{S}/CreateTopics", "admin", "bob", TOPIC_DENIED, lambda c: pb.CreateTopicsRequest(
            topics=[pb.CreatableTopic(name=f"{c['topic']}-new", num_partitions=1, replication_factor=1)])),
        (f"{S}/FindCoordinator", "alice", "bob", GROUP_DENIED, lambda c: pb.FindCoordinatorRequest(key=c["group"])),
        (f"{S}/CreatePartitions", "alice", "bob", TOPIC_DENIED, lambda c: pb.CreatePartitionsRequest(
            topics=[pb.CreatePartitionsTopic(name=c["topic"], count=2)], validate_only=True)),
        (f"{S}/DescribeConfigs", "alice", "bob", TOPIC_DENIED, lambda c: pb.DescribeConfigsRequest(
            resources=[pb.DescribeConfigsResource(resource_name=c["topic"])])),
        (f"{S}/IncrementalAlterConfigs", "alice", "bob", TOPIC_DENIED, lambda c: pb.IncrementalAlterConfigsRequest(
            resources=[pb.AlterConfigsResource(resource_name=c["topic"], configs=[
                pb.AlterableConfig(name="retention.ms", value="604800000")])], validate_only=True)),
        (f"{S}/CreateAcls", "admin", "alice", CLUSTER_DENIED, lambda c: pb.CreateAclsRequest(creations=[c["acl"]])),
        (f"{S}/DescribeAcls", "admin", "alice", CLUSTER_DENIED, lambda c: pb.DescribeAclsRequest()),
        (f"{S}/DeleteAcls", "admin", "alice", CLUSTER_DENIED, lambda c: pb.DeleteAclsRequest(deletions=[c["acl"]])),
        (f"{S}/AlterUserScramCredentials", "admin", "alice", CLUSTER_DENIED,
         lambda c: pb.AlterUserScramCredentialsRequest(upsertions=[pb.ScramUpsertion(name="matrix-user",
                                                                                     password="pw-1")])),
        (f"{S}/DescribeUserScramCredentials", "admin", "alice", CLUSTER_DENIED,
         lambda c: pb.DescribeUserScramCredentialsRequest()),
        (f"{S}/DescribeClientQuotas", "admin", "alice", CLUSTER_DENIED, lambda c: pb.DescribeClientQuotasRequest()),
        (f"{S}/AlterClientQuotas", "admin", "alice", CLUSTER_DENIED, lambda c: pb.AlterClientQuotasRequest(
            validate_only=True, entries=[pb.ClientQuotaEntry(
                entity=[pb.ClientQuotaEntityComponent(entity_type="user", name="matrix-user")],
                values=[pb.ClientQuotaValue(key="producer_byte_rate", value=1024)])])),
        (f"{S}/DescribeFeatures", "admin", "alice", CLUSTER_DENIED, lambda c: pb.DescribeFeaturesRequest()),
        (f"{S}/UpdateFeatures", "admin", "alice", CLUSTER_DENIED, lambda c: pb.UpdateFeaturesRequest(
            validate_only=True, updates=[pb.FeatureUpdate(name="metadata.version", level=2, upgrade_type=1)])),
        ("PartitionLeader/Produce", "alice", "bob", TOPIC_DENIED, lambda c: pb.ProduceRequest(
            acks=1, timeout_ms=10000, topics=[pb.TopicProduceData(name=c["topic"], partitions=[pb.PartitionProduceData(
                partition=0, records=records.encode_batch([(None, b"matrix", (), wall_clock_ms())]))])])),
        # An SDK's stream admits any principal; each call it carries is authorized by its own rule.
        ("Client/Calls (PartitionLeader/Produce)", "alice", "bob", TOPIC_DENIED, lambda c: pb.ProduceRequest(
            acks=1, timeout_ms=10000, topics=[pb.TopicProduceData(name=c["topic"], partitions=[pb.PartitionProduceData(
                partition=0, records=records.encode_batch([(None, b"matrix", (), wall_clock_ms())]))])])),
        # An SDK's link (a Client/Attach ticket, TLS with the caller's certificate): the same.
        ("Client/Attach (PartitionLeader/Produce)", "alice", "bob", TOPIC_DENIED, lambda c: pb.ProduceRequest(
            acks=1, timeout_ms=10000, topics=[pb.TopicProduceData(name=c["topic"], partitions=[pb.PartitionProduceData(
                partition=0, records=records.encode_batch([(None, b"matrix", (), wall_clock_ms())]))])])),
        ("PartitionLeader/CoordinatorProduce", "txn-0", "alice", CLUSTER_DENIED, lambda c: pb.ProduceRequest(
            acks=1, topics=[pb.TopicProduceData(name="__consumer_offsets", partitions=[])])),
        ("Tunnel/Calls (PartitionLeader/CoordinatorProduce)", "txn-0", "alice", CLUSTER_DENIED,
         lambda c: pb.ProduceRequest(acks=1, topics=[pb.TopicProduceData(name="__consumer_offsets", partitions=[])])),
        ("Tunnel/Batches (PartitionLeader/CoordinatorProduce)", "txn-0", "alice", CLUSTER_DENIED,
         lambda c: pb.ProduceRequest(acks=1, topics=[pb.TopicProduceData(name="__consumer_offsets", partitions=[])])),
        # A ticket for a link: the tunnel's calls on a TCP connection, as the caller.
        ("Tunnel/Attach", "txn-0", "alice", CLUSTER_DENIED, lambda c: pb.TunnelAttachRequest()),
        ("PartitionLeader/Fetch", "alice", "bob", TOPIC_DENIED, lambda c: pb.FetchRequest(
            max_wait_ms=0, topics=[pb.FetchTopic(topic=c["topic"], partitions=[pb.FetchPartition(partition=0)])])),
        ("PartitionLeader/ListOffsets", "alice", "bob", TOPIC_DENIED, lambda c: pb.ListOffsetsRequest(
            topics=[pb.ListOffsetsTopic(name=c["topic"], partitions=[pb.ListOffsetsPartition(partition=0,
                                                                                           timestamp=-1)])])),
        ("PartitionLeader/WriteTxnMarkers", "txn-0", "alice", CLUSTER_DENIED,
         lambda c: pb.WriteTxnMarkersRequest(markers=[])),
        ("PartitionLeader/TxnPartitionsAdded", "txn-0", "alice", CLUSTER_DENIED,
         lambda c: pb.TxnPartitionsAddedRequest(transactional_id="t", producer_id=1, producer_epoch=0, topics=[
             pb.TopicPartitionPositions(topic=c["topic"], partitions=[pb.PartitionPosition(partition=0)])])),
        ("PartitionLeader/OffsetForLeaderEpoch", "alice", "bob", TOPIC_DENIED, lambda c: pb.OffsetForLeaderEpochRequest(
            topics=[pb.OffsetForLeaderTopic(topic=c["topic"], partitions=[pb.OffsetForLeaderPartition(
                partition=0, current_leader_epoch=-1, leader_epoch=0)])])),
        ("PartitionLeader/DescribeProducers", "alice", "bob", TOPIC_DENIED,
         lambda c: pb.DescribeProducersRequest(topics=_tps(c["topic"]))),
        ("PartitionLeader/DeleteRecords", "alice", "bob", TOPIC_DENIED, lambda c: pb.DeleteRecordsRequest(
            topics=[pb.DeleteRecordsTopic(name=c["topic"], partitions=[pb.DeleteRecordsPartition(partition=0,
                                                                                                 offset=0)])])),
        ("TransactionCoordinator/InitProducerId", "alice", "bob", TXN_DENIED, lambda c: pb.InitProducerIdRequest(
            transactional_id=c["tid"], transaction_timeout_ms=60000)),
        ("TransactionCoordinator/AddPartitionsToTxn", "alice", "bob", TXN_DENIED, lambda c: pb.AddPartitionsToTxnRequest(
            transactional_id=c["tid"], producer_id=c["pid"], producer_epoch=c["epoch"], topics=_tps(c["topic"]))),
        # KIP-890 part 2: a partition leader's implicit add needs ClusterAction, which
        # the producer (holding All on its transactional.id) does not have.
        ("TransactionCoordinator/AddPartitionsToTxn (implicit)", "pl-0", "alice", CLUSTER_DENIED,
         lambda c: pb.AddPartitionsToTxnRequest(transactional_id=c["tid"], producer_id=c["pid"],
                                                producer_epoch=c["epoch"], topics=_tps(c["topic"]), implicit=True)),
        # A partition leader or group coordinator checking a producer-id binding.
        ("TransactionCoordinator/VerifyProducerId", "pl-0", "alice", CLUSTER_DENIED,
         lambda c: pb.VerifyProducerIdRequest(producer_id=c["pid"], principal="User:alice",
                                              transactional_id=c["tid"], transactional=True)),
        ("TransactionCoordinator/AddOffsetsToTxn", "alice", "bob", TXN_DENIED, lambda c: pb.AddOffsetsToTxnRequest(
            transactional_id=c["tid"], producer_id=c["pid"], producer_epoch=c["epoch"], group_id=c["group"])),
        ("GroupCoordinator/TxnOffsetCommit", "alice", "bob", TXN_DENIED, lambda c: pb.TxnOffsetCommitRequest(
            transactional_id=c["tid"], group_id=c["group"], producer_id=c["pid"], producer_epoch=c["epoch"],
            generation_id=-1, topics=_commit(c["topic"]))),
        ("TransactionCoordinator/ListTransactions", "alice", "bob", LISTED, lambda c: pb.ListTransactionsRequest()),
        ("TransactionCoordinator/DescribeTransactions", "alice", "bob", TXN_DENIED,
         lambda c: pb.DescribeTransactionsRequest(transactional_ids=[c["tid"]])),
        ("TransactionCoordinator/EndTxn", "alice", "bob", TXN_DENIED, lambda c: pb.EndTxnRequest(
            transactional_id=c["tid"], producer_id=c["pid"], producer_epoch=c["epoch"], committed=True)),
        ("TransactionCoordinator/PrepareTxn", "alice", "bob", TXN_DENIED, lambda c: pb.PrepareTxnRequest(
            transactional_id=c["tid"], producer_id=c["pid"], producer_epoch=c["epoch"])),
        ("GroupCoordinator/JoinGroup", "alice", "bob", GROUP_DENIED, lambda c: pb.JoinGroupRequest(
            group_id=c["group"], session_timeout_ms=10000, rebalance_timeout_ms=10000, protocol_type="consumer",
            topics=[c["topic"]])),
        ("GroupCoordinator/SyncGroup", "alice", "bob", GROUP_DENIED, lambda c: pb.SyncGroupRequest(
            group_id=c["group"], generation_id=1, member_id="nobody")),
        ("GroupCoordinator/Heartbeat", "alice", "bob", GROUP_DENIED, lambda c: pb.HeartbeatRequest(
            group_id=c["group"], generation_id=1, member_id="nobody")),
        ("GroupCoordinator/LeaveGroup", "alice", "bob", GROUP_DENIED, lambda c: pb.LeaveGroupRequest(
            group_id=c["group"], member_id="nobody")),
        ("GroupCoordinator/OffsetCommit", "alice", "bob", GROUP_DENIED, lambda c: pb.OffsetCommitRequest(
            group_id=c["group"], generation_id=-1, topics=_commit(c["topic"]))),
        ("GroupCoordinator/OffsetFetch", "alice", "bob", GROUP_DENIED, lambda c: pb.OffsetFetchRequest(
            group_id=c["group"], topics=_tps(c["topic"]))),
        ("GroupCoordinator/ListGroups", "alice", "bob", LISTED, lambda c: pb.ListGroupsRequest()),
        ("GroupCoordinator/DescribeGroups", "alice", "bob", GROUP_DENIED,
         lambda c: pb.DescribeGroupsRequest(groups=[c["group"]])),
        ("GroupCoordinator/OffsetDelete", "alice", "bob", GROUP_DENIED,
         lambda c: pb.OffsetDeleteRequest(group_id=c["group"], topics=_tps(c["topic"]))),
        ("GroupCoordinator/DeleteGroups", "alice", "bob", GROUP_DENIED,
         lambda c: pb.DeleteGroupsRequest(groups_names=[c["group"]])),
        (f"{S}/DeleteTopics", "alice", "bob", TOPIC_DENIED,
         lambda c: pb.DeleteTopicsRequest(topic_names=[c["topic"]])),
    ]


def _auth_codes(message) -> set[int]:
    """Every authorization error code anywhere in a response."""
    found = set()
    for field, value in message.ListFields():
        items = value if field.is_repeated else [value]
        for item in items:
            if field.message_type is not None:
                found |= _auth_codes(item)
            elif field.name == "error_code" and item in AUTH_CODES:
                found.add(item)
    return found


def _tunneled(tunnel, service: str, method: str, request, batches: bool = False):
    """One call of `service`/`method` through Tunnel/Calls (Tunnel/Batches with
    `batches`; Client/Calls with a ClientStub); raises TunnelError (a grpc.RpcError)
    with the method's status, as a direct call raises."""
    call = pb.TunneledCall(correlation_id=1, method=f"/{pb.DESCRIPTOR.package}.{service}/{method}",
                           request=request.SerializeToString())
    if isinstance(tunnel, pbg.ClientStub):
        [reply] = next(iter(tunnel.Calls(iter([pb.TunneledCalls(calls=[call])]), timeout=20))).replies
    elif batches:
        [reply] = next(iter(tunnel.Batches(iter([pb.TunneledCalls(calls=[call])]), timeout=20))).replies
    else:
        reply = next(iter(tunnel.Calls(iter([call]), timeout=20)))
    if reply.status_code:
        raise TunnelError(client_calls.status(reply.status_code), reply.status_details)
    output = pb.DESCRIPTOR.services_by_name[service].methods_by_name[method].output_type
    return getattr(pb, output.name).FromString(reply.response)


def _on_a_link(sec, who: str, address: str, service: str, method: str, request):
    """One call of `service`/`method` on an SDK link set up as the SDK sets one up
    (exactly._link.Connector: Client/Attach as `who`, TLS with its certificate, the
    ticket); raises TunnelError with the method's status, as a direct call raises."""
    security = TransportSecurity.from_conf(conf(sec, who))
    channel = secure_channel(address, security, [])
    wire = Connector(channel, address, security).connect()
    try:
        call = pb.TunneledCall(correlation_id=1, method=f"/{pb.DESCRIPTOR.package}.{service}/{method}",
                               request=request.SerializeToString())
        body = pb.TunneledCalls(calls=[call]).SerializeToString()
        wire.send(HEADER.pack(len(body)) + body, 20)
        data = b""
        while len(data) < HEADER.size or len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
            more = wire.recv(20)
            assert more, "the link closed or did not answer"
            data += more
        [reply] = pb.TunneledReplies.FromString(data[HEADER.size:]).replies
    finally:
        wire.close()
        channel.close()
    if reply.status_code:
        raise TunnelError(client_calls.status(reply.status_code), reply.status_details)
    output = pb.DESCRIPTOR.services_by_name[service].methods_by_name[method].output_type
    return getattr(pb, output.name).FromString(reply.response)


def _listed(kind: str, response, c) -> bool:
    if kind == "Cluster/Metadata":
        return c["topic"] in {t.name for t in response.topics}
    if kind.endswith("ListTransactions"):
        return c["tid"] in {t.transactional_id for t in response.transaction_states}
    return c["group"] in {g.group_id for g in response.groups}


# Open to every caller, so not in the matrix: authentication itself (tests/integration/test_sasl.py).
OPEN_RPCS = {"Cluster/SaslAuthenticate"}


def test_every_rpc_is_in_the_matrix():
    rpcs = {f"{s.name}/{m.name}" for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods}
    rows = [row[0] for row in _matrix_rows()]  # "Service/Method" or "Service/Method (variant)"
    covered = {row.split(" ")[0] for row in rows}
    assert len(rows) == len(set(rows)) and covered | OPEN_RPCS == rpcs, (covered | OPEN_RPCS) ^ rpcs


def test_authorization_matrix(sec):
    """For every RPC: the principal holding the ACL (or a super user / the service
    principal where the RPC is the cluster's) gets through authorization, the one
    without gets Kafka's specific error; listings show the latter nothing."""
    c = {"topic": f"mx-{uuid.uuid4().hex[:6]}", "group": f"mxg-{uuid.uuid4().hex[:6]}",
         "tid": f"mxt-{uuid.uuid4().hex[:6]}", "pid": -1, "epoch": -1,
         "acl": pb.Acl(principal="User:nobody", resource_type="Topic", name="nothing", pattern="Literal",
                       operation="Read", permission="Allow")}
    with admin(sec) as a:
        a.create_topics([NewTopic(c["topic"], 1, 1)])
        a.create_acls([AclBinding("User:alice", "Topic", c["topic"], "All"),
                       AclBinding("User:alice", "Group", c["group"], "All"),
                       AclBinding("User:alice", "TransactionalId", c["tid"], "All")])
        leader = sec.services[a.describe_topics([c["topic"]])[c["topic"]].partitions[0].leader_id].address
    wait_for(lambda: _can_describe(sec, "alice", c["topic"]), 10, "alice's ACLs applied")
    address = {"Cluster": sec.services["pl-0"].address, "PartitionLeader": leader, "Tunnel": leader,
               "TransactionCoordinator": sec.services["txn-0"].address,
               "GroupCoordinator": sec.services["group-0"].address}
    tally = {}
    for rpc, allowed, denied, expected, build in _matrix_rows():
        service, method = rpc.split(" ")[0].split("/")
        if rpc.startswith("Client/Attach ("):  # the method in parentheses, carried on an SDK link
            service, method = rpc.split("(")[1].rstrip(")").split("/")

            def call(who, service=service, method=method, build=build):
                return _on_a_link(sec, who, address[service], service, method, build(c))
        elif service in ("Tunnel", "Client") and "(" in rpc:  # the method named in parentheses, carried by the stream
            batches, stream_stub = method == "Batches", pbg.TunnelStub if service == "Tunnel" else pbg.ClientStub
            service, method = rpc.split("(")[1].rstrip(")").split("/")

            def call(who, service=service, method=method, build=build, batches=batches, stream_stub=stream_stub):
                return _tunneled(stub(sec, who, address[service], stream_stub), service, method, build(c),
                                 batches)
        else:
            def call(who, service=service, method=method, build=build):
                stub_ = stub(sec, who, address[service], STUBS[service])
                return getattr(stub_, method)(build(c), timeout=20)

        if expected == LISTED:
            assert not _listed(rpc, call(denied), c), f"{rpc}: {denied} sees the resource"
        else:
            with pytest.raises(grpc.RpcError) as info:
                call(denied)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, (rpc, info.value)
            assert info.value.details().startswith(expected), (rpc, info.value.details())
        response = call(allowed)
        assert not _auth_codes(response), (rpc, response)
        if rpc == "Tunnel/Attach":
            assert response.port > 0 and len(response.ticket) == 32, response
        if expected == LISTED:
            assert _listed(rpc, response, c), f"{rpc}: {allowed} does not see the resource"
        if rpc.endswith("InitProducerId"):
            if response.error_code in RETRIABLE:
                # The transaction log partition still loading, or the binding record's
                # write timing out (on a busy machine): a client retries; authorization
                # already passed above.
                response = wait_for(lambda: (r := call(allowed)).error_code not in RETRIABLE and r,
                                    30, "InitProducerId answered without a retriable error")
            assert response.error_code == 0, response
            c["pid"], c["epoch"] = response.producer_id, response.producer_epoch
        tally[rpc] = "ok"
    assert len(tally) == len(_matrix_rows())


def test_user_names_are_checked_before_they_reach_zookeeper(sec):
    """AlterUserScramCredentials: a name that is empty, '.', '..' or holds a '/' is
    refused with INVALID_REQUEST for upsertions and deletions alike; the users stay."""
    cluster = stub(sec, "admin", sec.services["pl-0"].address, pbg.ClusterStub)
    cluster.AlterUserScramCredentials(pb.AlterUserScramCredentialsRequest(upsertions=[
        pb.ScramUpsertion(name="kept-user", password="pw")]), timeout=20)
    hostile = ["", ".", "..", "a/b", "../acls", "x" * 256, "nul\x00"]
    resp = cluster.AlterUserScramCredentials(pb.AlterUserScramCredentialsRequest(
        upsertions=[pb.ScramUpsertion(name=n, password="pw") for n in hostile], deletions=hostile), timeout=20)
    assert len(resp.results) == 2 * len(hostile)
    assert all(r.error_code == errors.ErrorCode.INVALID_REQUEST and "invalid user name" in r.error_message
               for r in resp.results), resp
    assert "kept-user" in cluster.DescribeUserScramCredentials(pb.DescribeUserScramCredentialsRequest(),
                                                              timeout=20).users
