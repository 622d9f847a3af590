"""exactly.testing.MockCluster: the SDK's clients (sync and asyncio) run a
transactional loop against it without ZooKeeper or services, and its answers are the
services' own domain logic (services.partition_leader.producer_state, the transaction
coordinator's TransactionMetadata, the group coordinator's GroupMetadata and
OffsetStore): duplicates and fencing on a partition, the last stable offset and the
aborted transactions of read_committed, a join that waits for the group's other member."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import grpc
import pytest

from exactly import AdminClient, Consumer, OffsetAndMetadata, Producer, TopicPartition, errors
from exactly.aio import AIOConsumer, AIOProducer
from exactly.testing import MockCluster, MockTime
from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from sdk_producer.clocked import on_clock

TP = TopicPartition("t", 0)


@pytest.fixture
def cluster():
    with MockCluster(topics={"t": 1, "in": 1}) as cluster:
        yield cluster


def conf(cluster, **more):
    return {"bootstrap.servers": cluster.bootstrap_servers, **more}


def _produce(stub, batch: bytes, **request) -> pb.PartitionProduceResponse:
    resp = stub.Produce(pb.ProduceRequest(acks=-1, timeout_ms=1000, topics=[pb.TopicProduceData(
        name="t", partitions=[pb.PartitionProduceData(partition=0, records=batch)])], **request))
    return resp.topics[0].partitions[0]


def _batch(seq: int, epoch: int = 0, pid: int = 7, transactional: bool = False, value: bytes = b"v") -> bytes:
    return records.encode_batch([(None, value, (), 1000)], producer_id=pid, producer_epoch=epoch,
                                base_sequence=seq, transactional=transactional)


def test_a_partition_checks_sequences_and_epochs_as_the_partition_leader_does(cluster):
    leader = pbg.PartitionLeaderStub(cluster.channel("any:1"))
    assert _produce(leader, _batch(0)).base_offset == 0
    duplicate = _produce(leader, _batch(0))
    assert (duplicate.error_code, duplicate.base_offset) == (ErrorCode.DUPLICATE_SEQUENCE_NUMBER, 0)
    assert _produce(leader, _batch(5)).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert _produce(leader, _batch(0, epoch=1)).error_code == ErrorCode.NONE  # a new epoch starts at 0
    assert _produce(leader, _batch(1, epoch=0)).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    # A transactional batch no coordinator holds in a transaction is refused (KIP-890).
    refused = _produce(leader, _batch(0, pid=9, transactional=True), transactional_id="nobody")
    assert refused.error_code == ErrorCode.INVALID_TXN_STATE
    assert [r.value for r in cluster.records("t")] == [b"v", b"v"]


def test_an_open_transaction_holds_the_last_stable_offset_and_an_abort_is_listed(cluster):
    producer = Producer(conf(cluster, **{"transactional.id": "tx"}), transport=cluster)
    with producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", b"aborted")
        producer.flush()
        fetch = pbg.PartitionLeaderStub(cluster.channel("any:1")).Fetch(pb.FetchRequest(
            isolation_level=1, max_bytes=1 << 20, topics=[pb.FetchTopic(topic="t", partitions=[
                pb.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])]))
        part = fetch.responses[0].partitions[0]
        assert (part.high_watermark, part.last_stable_offset, part.records) == (1, 0, b"")
        producer.abort_transaction()
        with producer.transaction():
            producer.send("t", b"committed")
    assert [r.value for r in cluster.records("t", isolation_level="read_uncommitted")] == [b"aborted", b"committed"]
    assert [r.value for r in cluster.records("t")] == [b"committed"]
    assert cluster.transaction_state("tx") == "CompleteCommit"


def test_a_second_producer_of_a_transactional_id_fences_the_first(cluster):
    first = Producer(conf(cluster, **{"transactional.id": "tx"}), transport=cluster)
    second = Producer(conf(cluster, **{"transactional.id": "tx"}), transport=cluster)
    try:
        first.init_transactions()
        first.begin_transaction()
        first.send("t", b"zombie").result(5)  # written, in the first's open transaction
        second.init_transactions()  # aborts it with a bumped epoch: the first is fenced
        with pytest.raises(errors.ProducerFencedError):
            first.commit_transaction()
        with second.transaction():
            second.send("t", b"new")
    finally:
        first.close()
        second.close()
    assert [r.value for r in cluster.records("t")] == [b"new"]


def test_transactional_offsets_are_pending_until_the_commit(cluster):
    group = "g"
    with Consumer(conf(cluster, **{"group.id": group, "enable.auto.commit": False}), transport=cluster) as consumer, \
            Producer(conf(cluster, **{"transactional.id": "tx"}), transport=cluster) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({TopicPartition("in", 0): OffsetAndMetadata(3)}, group)
        fetch = pbg.GroupCoordinatorStub(cluster.channel("any:1")).OffsetFetch(pb.OffsetFetchRequest(
            group_id=group, topics=[pb.TopicPartitions(topic="in", partitions=[0])], require_stable=True))
        assert fetch.topics[0].partitions[0].error_code == ErrorCode.UNSTABLE_OFFSET_COMMIT  # KIP-447
        assert consumer.committed([TopicPartition("in", 0)])[TopicPartition("in", 0)] is None
        producer.commit_transaction()
        assert consumer.committed([TopicPartition("in", 0)])[TopicPartition("in", 0)].offset == 3


def test_a_join_waits_for_the_other_member_of_the_group(cluster):
    group = pbg.GroupCoordinatorStub(cluster.channel("any:1"))
    join = dict(group_id="g", session_timeout_ms=10000, rebalance_timeout_ms=10000, protocol_type="consumer",
                topics=["t", "in"])
    a = group.JoinGroup(pb.JoinGroupRequest(**join))
    assert (a.error_code, a.generation_id) == (ErrorCode.NONE, 1)
    assert group.SyncGroup(pb.SyncGroupRequest(group_id="g", generation_id=1, member_id=a.member_id)).error_code == 0
    b = group.JoinGroup.future(pb.JoinGroupRequest(**join))
    assert not b.done()  # waits until a rejoins (or the rebalance timeout passes)
    beat = group.Heartbeat(pb.HeartbeatRequest(group_id="g", generation_id=1, member_id=a.member_id))
    assert beat.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    a2 = group.JoinGroup(pb.JoinGroupRequest(member_id=a.member_id, **join))
    assert b.done() and (a2.generation_id, b.result().generation_id) == (2, 2)
    assigned = [group.SyncGroup(pb.SyncGroupRequest(group_id="g", generation_id=2, member_id=m)).assignment
                for m in (a2.member_id, b.result().member_id)]
    assert sorted((t.topic, p) for a in assigned for t in a for p in t.partitions) == [("in", 0), ("t", 0)]


def test_a_fetch_waits_for_records(cluster):
    leader = pbg.PartitionLeaderStub(cluster.channel("any:1"))
    waiting = leader.Fetch.future(pb.FetchRequest(max_wait_ms=60000, min_bytes=1, max_bytes=1 << 20, topics=[
        pb.FetchTopic(topic="t", partitions=[pb.FetchPartition(partition=0, fetch_offset=0,
                                                               partition_max_bytes=1 << 20)])]))
    assert not waiting.done()
    _produce(leader, records.encode_batch([(None, b"x", (), 1000)]))
    assert waiting.done() and waiting.result().responses[0].partitions[0].records


def test_the_asyncio_clients_run_a_transactional_copy(cluster):
    with Producer(conf(cluster), transport=cluster) as p:
        for i in range(3):
            p.send("in", f"p{i}")

    async def copy() -> None:
        async with AIOConsumer(conf(cluster, **{"isolation.level": "read_committed",
                                                "auto.offset.reset": "earliest"}), transport=cluster) as consumer, \
                AIOProducer(conf(cluster, **{"transactional.id": "copy"}), transport=cluster) as producer:
            await consumer.assign([TopicPartition("in", 0)])
            await producer.init_transactions()
            got = []
            while len(got) < 3:
                got += await consumer.poll(1.0)
            async with producer.transaction():
                for r in got:
                    await producer.send("t", r.value)
                await producer.send_offsets_to_transaction({TopicPartition("in", 0): OffsetAndMetadata(3)}, "g")

    asyncio.run(copy())
    assert [r.value for r in cluster.records("t")] == [b"p0", b"p1", b"p2"]
    with Consumer(conf(cluster, **{"group.id": "g"}), transport=cluster) as consumer:
        assert consumer.committed([TopicPartition("in", 0)])[TopicPartition("in", 0)].offset == 3


def test_the_mock_cluster_runs_without_the_server_dependencies(tmp_path):
    """An SDK-only install (pip install exactly-log) has none of the [server] extras:
    exactly.testing imports only what the SDK needs."""
    program = textwrap.dedent("""
        import importlib.abc, sys
        SERVER = {"kazoo", "rocksdict", "prometheus_client", "grpc_health", "cryptography", "kio", "uvloop"}
        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in SERVER:
                    raise ImportError(f"{name} is a server dependency")
        sys.meta_path.insert(0, Refuse())
        from exactly import Producer
        from exactly.testing import MockCluster, MockTime
        with MockCluster(topics={"t": 1}) as cluster:
            with Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": "a"},
                          transport=cluster) as p:
                p.init_transactions()
                with p.transaction():
                    p.send("t", b"v")
            print([r.value for r in cluster.records("t")])
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[b'v']"


# ---------------------------------------------------------------- faults a test injects

def test_the_next_answers_of_an_rpc_are_the_errors_a_test_names(cluster):
    with Producer(conf(cluster, **{"transactional.id": "tx", "retry.backoff.ms": 1}), transport=cluster) as p:
        p.init_transactions()
        cluster.fail_next("EndTxn", ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        with p.transaction():
            p.send("t", b"v")
        assert len(cluster.requests_of("EndTxn")) == 3  # two answered errors, retried; the third ended it
        cluster.fail_next("EndTxn", ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        p.begin_transaction()
        p.send("t", b"w")
        with pytest.raises(errors.TransactionalIdAuthorizationFailedError):
            p.commit_transaction()
    with pytest.raises(ValueError, match="unknown RPC 'Commit'"):
        cluster.fail_next("Commit", ErrorCode.NOT_COORDINATOR)
    with pytest.raises(ValueError, match="Metadata answers no error of its own"):
        cluster.fail_next("Metadata", ErrorCode.NOT_COORDINATOR)


def test_an_answer_lost_after_the_work_was_done_is_retried_and_found_done(cluster):
    with Producer(conf(cluster, **{"retry.backoff.ms": 1}), transport=cluster) as p:
        p.send("t", b"first").result(5)
        cluster.fail_next("Produce", ErrorCode.REQUEST_TIMED_OUT, applied=True, topic="t", partition=0)
        assert p.send("t", b"second").result(5).offset == 1  # the retry is a duplicate: success
    assert [r.value for r in cluster.records("t")] == [b"first", b"second"]
    assert len(cluster.requests_of("Produce")) == 3


def test_a_held_request_is_answered_when_the_test_releases_it(cluster):
    leader = pbg.PartitionLeaderStub(cluster.channel(cluster.address_of("leader-0")))
    held = cluster.hold_next("Produce")
    answer = leader.Produce.future(pb.ProduceRequest(acks=-1, timeout_ms=1000, topics=[pb.TopicProduceData(
        name="t", partitions=[pb.PartitionProduceData(partition=0, records=_batch(0))])]))
    assert held.arrived.is_set() and not answer.done() and cluster.records("t") == []
    held.release()
    assert answer.result(5).topics[0].partitions[0].base_offset == 0 and len(cluster.records("t")) == 1


def test_a_node_down_is_unreachable_and_a_moved_leader_refuses_its_old_partition(cluster):
    cluster.create_topic("two", 2)
    leader = pbg.PartitionLeaderStub(cluster.channel(cluster.address_of("leader-0")))
    cluster.take_down("leader-0")
    with pytest.raises(grpc.RpcError) as info:
        leader.ListOffsets(pb.ListOffsetsRequest(topics=[pb.ListOffsetsTopic(name="t", partitions=[
            pb.ListOffsetsPartition(partition=0, timestamp=-1)])]))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    md = pbg.ClusterStub(cluster.channel(cluster.bootstrap_servers)).Metadata(pb.MetadataRequest(topics=["t"]))
    assert "leader-0" not in {n.node_id for n in md.nodes}
    assert (md.topics[0].partitions[0].leader_id, md.topics[0].partitions[0].error_code) == \
        ("", ErrorCode.LEADER_NOT_AVAILABLE)
    cluster.bring_up("leader-0")
    cluster.move_leader("t", 0, "leader-0")  # the only leader: nothing moves
    with pytest.raises(ValueError):
        cluster.move_leader("t", 0, "txn-coordinator")
    with pytest.raises(KeyError):
        cluster.take_down("leader-9")


def test_partitions_spread_over_the_leaders_and_follow_a_move(tmp_path):
    with MockCluster(topics={"t": 2}, partition_leaders=2) as cluster:
        assert [cluster.leader_of("t", p) for p in (0, 1)] == ["leader-0", "leader-1"]
        with Producer(conf(cluster, **{"retry.backoff.ms": 1}), transport=cluster) as p:
            p.send("t", b"a", partition=0).result(5)
            cluster.move_leader("t", 0, "leader-1")
            cluster.take_down("leader-0")
            assert p.send("t", b"b", partition=0).result(5).offset == 1  # after a metadata refresh
        produced = [r.address for r in cluster.requests if r.rpc == "Produce"]
        assert produced[0] == cluster.address_of("leader-0") and produced[-1] == cluster.address_of("leader-1")


def test_a_coordinator_down_is_not_found(cluster):
    cluster.take_down("txn-coordinator")
    clock = MockTime()  # the producer's: its retries' backoff takes no real time
    p = on_clock(Producer, clock)(conf(cluster, **{"transactional.id": "tx", "max.block.ms": 200}),
                                  transport=cluster)
    try:
        with pytest.raises(errors.KafkaTimeoutError):
            p.init_transactions()
        cluster.bring_up("txn-coordinator")
        p.init_transactions()
    finally:
        p.close()
    assert {r.message.key_type for r in cluster.requests if r.rpc == "FindCoordinator"} == {1}


def test_transactions_listed_described_and_aborted_at_their_timeout():
    clock = MockTime()
    with MockCluster(topics={"t": 1}, clock=clock) as cluster, \
            AdminClient(conf(cluster), transport=cluster) as admin, \
            Producer(conf(cluster, **{"transactional.id": "slow", "transaction.timeout.ms": 5000}),
                     transport=cluster) as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("t", b"never committed").result(5)
        assert [(t.transactional_id, t.state) for t in admin.list_transactions()] == [("slow", "Ongoing")]
        described = admin.describe_transactions(["slow"])["slow"]
        assert (described.state, described.transaction_timeout_ms, described.partitions) == \
            ("Ongoing", 5000, (("t", 0),))
        with pytest.raises(errors.TransactionalIdNotFoundError):
            admin.describe_transactions(["nobody"])
        clock.advance(5001)  # ms, on the cluster's clock: past transaction.timeout.ms
        assert admin.list_transactions(states=["Ongoing"]) == []
        assert cluster.transaction_state("slow") == "CompleteAbort"
        with pytest.raises(errors.ProducerFencedError):
            p.commit_transaction()  # aborted with a bumped epoch: the producer is fenced
    assert cluster.records("t") == [] and cluster.completed_transactions[-1].committed is False


def test_groups_listed_described_and_deleted(cluster):
    with Consumer(conf(cluster, **{"group.id": "live", "enable.auto.commit": False}), transport=cluster) as member, \
            AdminClient(conf(cluster), transport=cluster) as admin:
        member.subscribe(["t"])
        while not member.assignment():
            member.poll(0.01)
        with Consumer(conf(cluster, **{"group.id": "done"}), transport=cluster) as other:
            other.commit({TopicPartition("t", 0): OffsetAndMetadata(2)})  # a group with offsets only
        assert [(g.group_id, g.state) for g in admin.list_groups()] == [("done", "Empty"), ("live", "Stable")]
        assert [g.group_id for g in admin.list_groups(states=["stable"])] == ["live"]
        described = admin.describe_groups(["live", "nobody"])
        assert (described["live"].state, len(described["live"].members), described["nobody"].state) == \
            ("Stable", 1, "Dead")
        with pytest.raises(errors.NonEmptyGroupError):
            admin.delete_groups(["live"])
        admin.delete_groups(["done"])
        assert cluster.committed_offsets("done") == {}
        with pytest.raises(errors.GroupIdNotFoundError):
            admin.delete_groups(["done"])


def test_a_cluster_of_transaction_version_1_takes_added_partitions():
    with MockCluster(topics={"t": 1}, transaction_version=1) as cluster, \
            Producer(conf(cluster, **{"transactional.id": "v1"}), transport=cluster) as p:
        p.init_transactions()
        for _ in range(2):
            with p.transaction():
                p.send("t", b"v")
        assert len(cluster.requests_of("AddPartitionsToTxn")) == 2
        assert {c.producer_epoch for c in cluster.completed_transactions} == {0}  # no bump at the end
