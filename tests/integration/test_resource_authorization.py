"""Each resource a request names is authorized on its own, on both ports (docs/design.md,
"Security", "Authorization"): a secured dev cluster (TLS with client certificates,
authorizer=acl) where User:mallory holds every operation on the `mallory-` prefix of
topics, groups and transactional.ids, and alice's topic, group and transaction belong to
others. Mallory sends every RPC that names resources (the gRPC RPCs from the protobuf
descriptors, the Kafka API keys from the listener's surface: a new one fails the sweep
until it has a row) naming one resource of hers and one of alice's. Each answer may
refuse the call or answer per resource, but every entry naming alice's resources must
carry an authorization error; afterwards alice's topic, its configs, records, partitions,
her group's offsets and her transaction are as they were, and no topic beside hers was
created (a `.`/`_` twin blocks her from creating its twin).

Describing (docs/design.md, "Security"): DescribeTransactions lists only the topics of a
transaction the caller may Describe, and OffsetFetch of all a group's partitions only
those of topics it may Describe, on both ports, as Kafka's answers do."""
from __future__ import annotations

import dataclasses
import uuid

import grpc
import pytest

from exactly import AclBinding, NewTopic
from exactly_tools.certs import CertificateAuthority
from exactly_wire import records
from exactly_wire.clock import wall_clock_ms
from exactly_wire.error_codes import RETRIABLE, ErrorCode
from exactly_wire.security import TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
import kafka_requests
from clusters import admin_client, certificate_conf, chrooted_cluster
from services.common.kafka import codec, surface
from waiting import wait_for

pytestmark = pytest.mark.integration

AUTH = {ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
TAG = uuid.uuid4().hex[:6]
M_TOPIC, M_GROUP, M_TID = f"mallory-t-{TAG}", f"mallory-g-{TAG}", f"mallory-tx-{TAG}"
A_TOPIC, A_GROUP, A_TID = f"alice-orders-{TAG}", f"alice-g-{TAG}", f"alice-tx-{TAG}"
A_TWIN = f"alice.orders.{TAG}"  # would block the admin's alice_orders_<TAG>
ALICE = {A_TOPIC, A_GROUP, A_TID, A_TWIN}
IDENTITY = ("name", "topic", "group_id", "transactional_id", "resource_name", "key")
STUBS = {"Cluster": pbg.ClusterStub, "PartitionLeader": pbg.PartitionLeaderStub,
         "TransactionCoordinator": pbg.TransactionCoordinatorStub, "GroupCoordinator": pbg.GroupCoordinatorStub}
COMMITTED = 2  # alice's group's offset on her topic


@pytest.fixture(scope="module")
def sec(zk, tmp_path_factory):
    c = chrooted_cluster(zk, tmp_path_factory.mktemp("resource-authz"), "resauthz", security=True, leaders=1)
    ca = CertificateAuthority.load(c.dir / "certs")
    for name in ("mallory", "carol"):
        ca.issue(name, client=True)
    with admin_client(c) as a:
        a.create_topics([NewTopic(A_TOPIC, 1, 1), NewTopic(M_TOPIC, 1, 1)])
        a.create_acls([AclBinding("User:mallory", kind, "mallory-", "All", pattern="Prefixed")
                       for kind in ("Topic", "Group", "TransactionalId")] +
                      [AclBinding("User:carol", "TransactionalId", A_TID, "Describe"),
                       AclBinding("User:carol", "Group", A_GROUP, "Describe"),
                       AclBinding("User:carol", "Topic", M_TOPIC, "Describe")])
    admin = lambda kind, role: stub(c, "admin", kind, role)  # noqa: E731
    # Alice's state: 3 records, her group's offset, an open transaction on her topic and mallory's.
    for _ in range(3):
        wait_for(lambda: _ok(admin(pbg.PartitionLeaderStub, "pl-0").Produce(produce(A_TOPIC), timeout=20)),
                        30, "a record of alice's topic appended")
    wait_for(lambda: _ok(admin(pbg.GroupCoordinatorStub, "group-0").OffsetCommit(pb.OffsetCommitRequest(
        group_id=A_GROUP, generation_id=-1, topics=commit_topics(A_TOPIC, M_TOPIC)), timeout=20)),
        30, "alice's group offsets committed")
    for tid in (A_TID, M_TID):
        txn = admin(pbg.TransactionCoordinatorStub, "txn-0")
        init = wait_for(lambda: (r := txn.InitProducerId(pb.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=900000), timeout=20)).error_code not in RETRIABLE and r,
            30, "InitProducerId answered")
        assert init.error_code == 0, init
        added = txn.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(
            transactional_id=tid, producer_id=init.producer_id, producer_epoch=init.producer_epoch,
            topics=[pb.TopicPartitions(topic=A_TOPIC if tid == A_TID else M_TOPIC, partitions=[0])]
            + ([pb.TopicPartitions(topic=M_TOPIC, partitions=[0])] if tid == A_TID else [])), timeout=20)
        assert _ok(added), added
    wait_for(lambda: _mallory_sees(c), 20, "mallory's ACLs applied")
    yield c
    c.down()


def _ok(response) -> bool:
    codes = _codes(response)
    return not codes - {0}


def _codes(message) -> set[int]:
    out = set()
    for f, value in message.ListFields():
        for item in (value if f.is_repeated else [value]):
            if f.message_type is not None:
                out |= _codes(item)
            elif f.name == "error_code":
                out.add(item)
    return out


def _mallory_sees(c) -> bool:
    resp = stub(c, "mallory", pbg.ClusterStub, "pl-0").Metadata(pb.MetadataRequest(), timeout=20)
    return M_TOPIC in {t.name for t in resp.topics}


def stub(c, who: str, kind, service: str):
    security = TransportSecurity.from_conf(certificate_conf(c, who))
    return kind(secure_channel(c.services[service].address, security, []))


def produce(topic: str) -> pb.ProduceRequest:
    return pb.ProduceRequest(acks=1, timeout_ms=10000, topics=[pb.TopicProduceData(name=topic, partitions=[
        pb.PartitionProduceData(partition=0, records=records.encode_batch([(None, b"r", (), wall_clock_ms())]))])])


def commit_topics(*topics: str) -> list[pb.OffsetCommitTopic]:
    return [pb.OffsetCommitTopic(name=t, partitions=[pb.OffsetCommitPartition(partition=0, committed_offset=COMMITTED)])
            for t in topics]


def tps(*topics: str) -> list[pb.TopicPartitions]:
    return [pb.TopicPartitions(topic=t, partitions=[0]) for t in topics]


# ---------------------------------------------------------------- gRPC
# RPC -> (service process, request naming mallory's and alice's resources).
GRPC_MIXED = {
    "Cluster/Metadata": ("pl-0", lambda: pb.MetadataRequest(topics=[M_TOPIC, A_TOPIC])),
    "Cluster/CreateTopics": ("pl-0", lambda: pb.CreateTopicsRequest(topics=[
        pb.CreatableTopic(name=f"mallory-new-{TAG}", num_partitions=1, replication_factor=1),
        pb.CreatableTopic(name=A_TWIN, num_partitions=1, replication_factor=1, configs={"retention.ms": "1000"})])),
    "Cluster/DeleteTopics": ("pl-0", lambda: pb.DeleteTopicsRequest(topic_names=[f"mallory-absent-{TAG}", A_TOPIC])),
    "Cluster/CreatePartitions": ("pl-0", lambda: pb.CreatePartitionsRequest(topics=[
        pb.CreatePartitionsTopic(name=M_TOPIC, count=1), pb.CreatePartitionsTopic(name=A_TOPIC, count=3)])),
    "Cluster/DescribeConfigs": ("pl-0", lambda: pb.DescribeConfigsRequest(resources=[
        pb.DescribeConfigsResource(resource_name=M_TOPIC), pb.DescribeConfigsResource(resource_name=A_TOPIC)])),
    "Cluster/IncrementalAlterConfigs": ("pl-0", lambda: pb.IncrementalAlterConfigsRequest(resources=[
        pb.AlterConfigsResource(resource_name=n, configs=[pb.AlterableConfig(name="retention.ms", value="1000")])
        for n in (M_TOPIC, A_TOPIC)])),
    "PartitionLeader/Produce": ("pl-0", lambda: pb.ProduceRequest(acks=1, timeout_ms=10000, topics=[
        t for n in (M_TOPIC, A_TOPIC) for t in produce(n).topics])),
    "PartitionLeader/Fetch": ("pl-0", lambda: pb.FetchRequest(max_wait_ms=0, topics=[
        pb.FetchTopic(topic=n, partitions=[pb.FetchPartition(partition=0)]) for n in (M_TOPIC, A_TOPIC)])),
    "PartitionLeader/ListOffsets": ("pl-0", lambda: pb.ListOffsetsRequest(topics=[
        pb.ListOffsetsTopic(name=n, partitions=[pb.ListOffsetsPartition(partition=0, timestamp=-1)])
        for n in (M_TOPIC, A_TOPIC)])),
    "PartitionLeader/OffsetForLeaderEpoch": ("pl-0", lambda: pb.OffsetForLeaderEpochRequest(topics=[
        pb.OffsetForLeaderTopic(topic=n, partitions=[pb.OffsetForLeaderPartition(
            partition=0, current_leader_epoch=-1, leader_epoch=0)]) for n in (M_TOPIC, A_TOPIC)])),
    "PartitionLeader/DescribeProducers": ("pl-0", lambda: pb.DescribeProducersRequest(topics=tps(M_TOPIC, A_TOPIC))),
    "PartitionLeader/DeleteRecords": ("pl-0", lambda: pb.DeleteRecordsRequest(timeout_ms=10000, topics=[
        pb.DeleteRecordsTopic(name=n, partitions=[pb.DeleteRecordsPartition(partition=0, offset=1)])
        for n in (M_TOPIC, A_TOPIC)])),
    "TransactionCoordinator/InitProducerId": ("txn-0", lambda: pb.InitProducerIdRequest(
        transactional_id=M_TID, transaction_timeout_ms=60000, consumer_group_id=A_GROUP, generation_id=1,
        assigned_partitions=tps(A_TOPIC))),
    "TransactionCoordinator/AddPartitionsToTxn": ("txn-0", lambda: pb.AddPartitionsToTxnRequest(
        transactional_id=M_TID, producer_id=-1, producer_epoch=-1, topics=tps(M_TOPIC, A_TOPIC))),
    "TransactionCoordinator/AddOffsetsToTxn": ("txn-0", lambda: pb.AddOffsetsToTxnRequest(
        transactional_id=M_TID, producer_id=-1, producer_epoch=-1, group_id=A_GROUP)),
    "TransactionCoordinator/EndTxn": ("txn-0", lambda: pb.EndTxnRequest(
        transactional_id=M_TID, producer_id=-1, producer_epoch=-1, committed=False, consumer_group_id=A_GROUP)),
    "TransactionCoordinator/PrepareTxn": ("txn-0", lambda: pb.PrepareTxnRequest(
        transactional_id=M_TID, producer_id=-1, producer_epoch=-1, consumer_group_id=A_GROUP)),
    "TransactionCoordinator/ListTransactions": ("txn-0", lambda: pb.ListTransactionsRequest()),
    "TransactionCoordinator/DescribeTransactions": ("txn-0", lambda: pb.DescribeTransactionsRequest(
        transactional_ids=[M_TID, A_TID])),
    "GroupCoordinator/OffsetCommit": ("group-0", lambda: pb.OffsetCommitRequest(
        group_id=M_GROUP, generation_id=-1, topics=commit_topics(M_TOPIC, A_TOPIC))),
    "GroupCoordinator/OffsetFetch": ("group-0", lambda: pb.OffsetFetchRequest(group_id=A_GROUP)),
    "GroupCoordinator/TxnOffsetCommit": ("group-0", lambda: pb.TxnOffsetCommitRequest(
        transactional_id=M_TID, group_id=A_GROUP, producer_id=-1, producer_epoch=-1, generation_id=-1,
        topics=commit_topics(M_TOPIC))),
    "GroupCoordinator/ListGroups": ("group-0", lambda: pb.ListGroupsRequest()),
    "GroupCoordinator/DescribeGroups": ("group-0", lambda: pb.DescribeGroupsRequest(groups=[M_GROUP, A_GROUP])),
    "GroupCoordinator/DeleteGroups": ("group-0", lambda: pb.DeleteGroupsRequest(groups_names=[M_GROUP, A_GROUP])),
    "GroupCoordinator/OffsetDelete": ("group-0", lambda: pb.OffsetDeleteRequest(group_id=A_GROUP,
                                                                                 topics=tps(M_TOPIC))),
}
# Requests of these name one resource, or only the Cluster (which nobody but the
# services and the admin holds here): the authorization matrix of
# tests/integration/test_authorization.py covers them.
GRPC_SINGLE = {
    "Cluster/FindCoordinator", "Cluster/CreateAcls", "Cluster/DeleteAcls", "Cluster/DescribeAcls",
    "Cluster/AlterUserScramCredentials", "Cluster/DescribeUserScramCredentials", "Cluster/DescribeClientQuotas",
    "Cluster/AlterClientQuotas", "Cluster/SaslAuthenticate", "Cluster/DescribeFeatures", "Cluster/UpdateFeatures",
    "PartitionLeader/CoordinatorProduce",
    "PartitionLeader/WriteTxnMarkers", "PartitionLeader/TxnPartitionsAdded", "TransactionCoordinator/VerifyProducerId", "GroupCoordinator/JoinGroup",
    "GroupCoordinator/SyncGroup", "GroupCoordinator/Heartbeat", "GroupCoordinator/LeaveGroup", "Tunnel/Calls",
    "Tunnel/Batches", "Tunnel/Attach", "Client/Calls", "Client/Attach",
}


def test_every_grpc_rpc_is_swept():
    rpcs = {f"{s.name}/{m.name}" for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert set(GRPC_MIXED) | GRPC_SINGLE == rpcs and not set(GRPC_MIXED) & GRPC_SINGLE, \
        (set(GRPC_MIXED) | GRPC_SINGLE) ^ rpcs


def _grpc_leaks(message, named: bool = False) -> list[str]:
    """Entries of a gRPC answer naming alice's resources (or inside one) whose error code
    is not an authorization failure."""
    fields = message.DESCRIPTOR.fields_by_name
    named = named or any(getattr(message, k) in ALICE for k in IDENTITY
                         if k in fields and not fields[k].is_repeated and fields[k].message_type is None)
    out = []
    if named and "error_code" in fields and message.error_code not in AUTH:
        out.append(f"{message.DESCRIPTOR.name} {str(message)[:200]!r}")
    for f, value in message.ListFields():
        if f.message_type is not None:
            for item in (value if f.is_repeated else [value]):
                out += _grpc_leaks(item, named)
        elif f.is_repeated and f.cpp_type == f.CPPTYPE_STRING and ALICE & set(value):
            out.append(f"{message.DESCRIPTOR.name}.{f.name} lists {sorted(ALICE & set(value))}")
    return out


def test_grpc_rpcs_naming_several_resources(sec):
    refused, answered = [], []
    for rpc, (service, build) in GRPC_MIXED.items():
        kind, method = rpc.split("/")
        try:
            response = getattr(stub(sec, "mallory", STUBS[kind], service), method)(build(), timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.PERMISSION_DENIED, (rpc, exc)
            assert exc.details().split(":")[0] in {e.name for e in AUTH}, (rpc, exc.details())
            refused.append(rpc)
            continue
        leaks = _grpc_leaks(response)
        assert not leaks, f"{rpc} answered alice's resources: {leaks}"
        answered.append(rpc)
    print(f"gRPC: {len(refused)} refused whole, {len(answered)} answered per resource ({', '.join(answered)})")
    _alice_is_untouched(sec)


# ---------------------------------------------------------------- Kafka
def _kafka_call(c, who: str, service: str, key: int, version: int, fields: dict):
    """One Kafka request over TLS with `who`'s certificate; the decoded response."""
    return kafka_requests.call(c.services[service].kafka_address, key, version, fields,
                               kafka_requests.tls_context(c.dir / "certs", who), client_id="sweep")


def _kbatch(topic: str) -> dict:
    return {"name": topic, "partition_data": [{"index": 0, "records": records.encode_batch(
        [(None, b"k", (), wall_clock_ms())])}]}


def _kcommit(*topics: str) -> list[dict]:
    return [{"name": t, "partitions": [{"partition_index": 0, "committed_offset": COMMITTED,
                                        "committed_metadata": ""}]} for t in topics]


KAFKA_BOTH = (M_TOPIC, A_TOPIC)
# API key -> (service process, version, request fields naming mallory's and alice's resources).
KAFKA_MIXED = {
    surface.METADATA: ("pl-0", 12, {"topics": [{"name": n} for n in KAFKA_BOTH]}),
    surface.CREATE_TOPICS: ("pl-0", 7, {"timeout": 10000, "topics": [
        {"name": f"mallory-knew-{TAG}", "num_partitions": 1, "replication_factor": 1},
        {"name": A_TWIN, "num_partitions": 1, "replication_factor": 1,
         "configs": [{"name": "retention.ms", "value": "1000"}]}]}),
    surface.DELETE_TOPICS: ("pl-0", 5, {"timeout": 10000, "topic_names": [f"mallory-kabsent-{TAG}", A_TOPIC]}),
    surface.CREATE_PARTITIONS: ("pl-0", 3, {"timeout": 10000, "topics": [
        {"name": M_TOPIC, "count": 1, "assignments": None}, {"name": A_TOPIC, "count": 3, "assignments": None}]}),
    surface.DESCRIBE_CONFIGS: ("pl-0", 4, {"resources": [
        {"resource_type": 2, "resource_name": n, "configuration_keys": None} for n in KAFKA_BOTH]}),
    surface.ALTER_CONFIGS: ("pl-0", 2, {"resources": [
        {"resource_type": 2, "resource_name": n, "configs": [{"name": "retention.ms", "value": "1000"}]}
        for n in KAFKA_BOTH]}),
    surface.INCREMENTAL_ALTER_CONFIGS: ("pl-0", 1, {"resources": [
        {"resource_type": 2, "resource_name": n, "configs": [
            {"name": "retention.ms", "config_operation": 0, "value": "1000"}]} for n in KAFKA_BOTH]}),
    surface.FIND_COORDINATOR: ("pl-0", 4, {"key_type": 0, "coordinator_keys": [M_GROUP, A_GROUP]}),
    surface.PRODUCE: ("pl-0", 9, {"acks": 1, "timeout": 10000, "topic_data": [_kbatch(n) for n in KAFKA_BOTH]}),
    surface.FETCH: ("pl-0", 12, {"replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "topics": [
        {"topic": n, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                                     "current_leader_epoch": -1, "log_start_offset": -1}]} for n in KAFKA_BOTH]}),
    surface.LIST_OFFSETS: ("pl-0", 7, {"replica_id": -1, "topics": [
        {"name": n, "partitions": [{"partition_index": 0, "timestamp": -1, "current_leader_epoch": -1}]}
        for n in KAFKA_BOTH]}),
    surface.OFFSET_FOR_LEADER_EPOCH: ("pl-0", 4, {"replica_id": -1, "topics": [
        {"topic": n, "partitions": [{"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}
        for n in KAFKA_BOTH]}),
    surface.DELETE_RECORDS: ("pl-0", 2, {"timeout": 10000, "topics": [
        {"name": n, "partitions": [{"partition_index": 0, "offset": 1}]} for n in KAFKA_BOTH]}),
    surface.DESCRIBE_PRODUCERS: ("pl-0", 0, {"topics": [{"name": n, "partition_indexes": [0]} for n in KAFKA_BOTH]}),
    surface.ADD_PARTITIONS_TO_TXN: ("txn-0", 3, {
        "v3_and_below_transactional_id": M_TID, "v3_and_below_producer_id": -1, "v3_and_below_producer_epoch": -1,
        "v3_and_below_topics": [{"name": n, "partitions": [0]} for n in KAFKA_BOTH]}),
    surface.ADD_OFFSETS_TO_TXN: ("txn-0", 3, {"transactional_id": M_TID, "producer_id": -1, "producer_epoch": -1,
                                              "group_id": A_GROUP}),
    surface.DESCRIBE_TRANSACTIONS: ("txn-0", 0, {"transactional_ids": [M_TID, A_TID]}),
    surface.LIST_TRANSACTIONS: ("txn-0", 0, {"state_filters": [], "producer_id_filters": []}),
    surface.LIST_GROUPS: ("pl-0", 4, {"states_filter": []}),
    surface.OFFSET_COMMIT: ("group-0", 8, {"group_id": M_GROUP, "generation_id_or_member_epoch": -1, "member_id": "",
                                           "group_instance_id": None, "topics": _kcommit(*KAFKA_BOTH)}),
    surface.OFFSET_FETCH: ("group-0", 7, {"group_id": A_GROUP, "topics": None}),
    surface.TXN_OFFSET_COMMIT: ("group-0", 3, {"transactional_id": M_TID, "group_id": A_GROUP, "producer_id": -1,
                                               "producer_epoch": -1, "generation_id": -1, "member_id": "",
                                               "group_instance_id": None, "topics": _kcommit(M_TOPIC)}),
    surface.DESCRIBE_GROUPS: ("group-0", 5, {"groups": [M_GROUP, A_GROUP]}),
    surface.DELETE_GROUPS: ("group-0", 2, {"groups_names": [M_GROUP, A_GROUP]}),
    surface.OFFSET_DELETE: ("group-0", 0, {"group_id": A_GROUP, "topics": [
        {"name": M_TOPIC, "partitions": [{"partition_index": 0}]}]}),
}
# Keys naming one resource (the matrix covers them) or only the Cluster (Alter or
# Describe on it, which mallory lacks; ElectLeaders names partitions but needs Alter on
# the Cluster for all of them).
KAFKA_SINGLE = {surface.INIT_PRODUCER_ID, surface.END_TXN, surface.JOIN_GROUP, surface.SYNC_GROUP,
                surface.HEARTBEAT, surface.LEAVE_GROUP, surface.DESCRIBE_ACLS, surface.CREATE_ACLS,
                surface.DELETE_ACLS, surface.DESCRIBE_CLIENT_QUOTAS, surface.ALTER_CLIENT_QUOTAS,
                surface.DESCRIBE_CLUSTER, surface.ELECT_LEADERS, surface.DESCRIBE_LOG_DIRS}


def test_every_kafka_api_key_is_swept():
    assert set(KAFKA_MIXED) | KAFKA_SINGLE == set(surface.SURFACE) and not set(KAFKA_MIXED) & KAFKA_SINGLE, \
        (set(KAFKA_MIXED) | KAFKA_SINGLE) ^ set(surface.SURFACE)


def _value(v):
    return getattr(v, "value", v)


def _kafka_leaks(entity, named: bool = False) -> list[str]:
    """As _grpc_leaks, over a kio response entity."""
    names = {f.name: getattr(entity, f.name) for f in dataclasses.fields(entity)}
    named = named or any(isinstance(names.get(k), str) and names[k] in ALICE for k in IDENTITY)
    out = []
    if named and "error_code" in names and _value(names["error_code"]) not in AUTH:
        out.append(f"{type(entity).__name__} {str(entity)[:200]!r}")
    for name, value in names.items():
        for item in (value if isinstance(value, tuple) else [value]):
            if dataclasses.is_dataclass(item):
                out += _kafka_leaks(item, named)
            elif isinstance(item, str) and item in ALICE and name not in IDENTITY:
                out.append(f"{type(entity).__name__}.{name} = {item!r}")
    return out


def test_kafka_requests_naming_several_resources(sec):
    for key, (service, version, fields) in KAFKA_MIXED.items():
        response = _kafka_call(sec, "mallory", service, key, version, fields)
        leaks = _kafka_leaks(response)
        assert not leaks, f"{codec.api_name(key)} answered alice's resources: {leaks}"
    _alice_is_untouched(sec)


def _alice_is_untouched(c):
    admin = lambda kind, service: stub(c, "admin", kind, service)  # noqa: E731
    meta = admin(pbg.ClusterStub, "pl-0").Metadata(pb.MetadataRequest(), timeout=20)
    topics = {t.name: len(t.partitions) for t in meta.topics}
    assert A_TWIN not in topics, f"{A_TWIN} was created"
    assert topics[A_TOPIC] == 1, topics
    configs = admin(pbg.ClusterStub, "pl-0").DescribeConfigs(pb.DescribeConfigsRequest(resources=[
        pb.DescribeConfigsResource(resource_name=A_TOPIC, configuration_keys=["retention.ms"])]), timeout=20)
    [entry] = configs.results[0].configs
    assert entry.source == "DEFAULT_CONFIG", entry
    offsets = admin(pbg.PartitionLeaderStub, "pl-0").ListOffsets(pb.ListOffsetsRequest(topics=[
        pb.ListOffsetsTopic(name=A_TOPIC, partitions=[pb.ListOffsetsPartition(partition=0, timestamp=t)])
        for t in (-2, -1)]), timeout=20)
    assert [t.partitions[0].offset for t in offsets.topics] == [0, 3], offsets
    fetched = admin(pbg.GroupCoordinatorStub, "group-0").OffsetFetch(pb.OffsetFetchRequest(group_id=A_GROUP),
                                                                     timeout=20)
    assert {(t.name, p.committed_offset) for t in fetched.topics for p in t.partitions} == \
        {(A_TOPIC, COMMITTED), (M_TOPIC, COMMITTED)}, fetched
    [desc] = admin(pbg.TransactionCoordinatorStub, "txn-0").DescribeTransactions(
        pb.DescribeTransactionsRequest(transactional_ids=[A_TID]), timeout=20).transaction_states
    assert desc.state == "Ongoing" and {t.topic for t in desc.topics} == {A_TOPIC, M_TOPIC}, desc


# ---------------------------------------------------------------- describing
def test_described_transactions_and_group_offsets_show_only_describable_topics(sec):
    """carol may Describe alice's transactional.id and group, and mallory's topic, not
    alice's topic: her transaction's description and her group's offsets of all
    partitions show mallory's topic only, on both ports; the admin sees both."""
    txn = stub(sec, "carol", pbg.TransactionCoordinatorStub, "txn-0")
    [desc] = txn.DescribeTransactions(pb.DescribeTransactionsRequest(transactional_ids=[A_TID]),
                                      timeout=20).transaction_states
    assert desc.error_code == 0 and desc.state == "Ongoing", desc
    assert [t.topic for t in desc.topics] == [M_TOPIC], desc
    fetched = stub(sec, "carol", pbg.GroupCoordinatorStub, "group-0").OffsetFetch(
        pb.OffsetFetchRequest(group_id=A_GROUP), timeout=20)
    assert fetched.error_code == 0 and [t.name for t in fetched.topics] == [M_TOPIC], fetched

    kdesc = _kafka_call(sec, "carol", "txn-0", surface.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [A_TID]})
    [state] = kdesc.transaction_states
    assert _value(state.error_code) == 0 and [t.topic for t in state.topics] == [M_TOPIC], kdesc
    kfetch = _kafka_call(sec, "carol", "group-0", surface.OFFSET_FETCH, 7, {"group_id": A_GROUP, "topics": None})
    assert _value(kfetch.error_code) == 0 and [t.name for t in kfetch.topics] == [M_TOPIC], kfetch
    _alice_is_untouched(sec)
