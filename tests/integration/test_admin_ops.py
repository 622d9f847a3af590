"""Topic and group administration against real processes (docs/design.md,
"Administration"): DeleteTopics removes the data on every replica (also one that was
down), CreatePartitions, topic configs round trip and take effect, groups list /
describe / delete, and consumer lag under both isolation levels."""
from __future__ import annotations

import pytest

from exactly import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from waiting import wait_for

pytestmark = pytest.mark.integration


def _dirs(cluster, topic: str) -> dict[str, list[str]]:
    """Partition directories of `topic` per partition leader."""
    out = {}
    for name, svc in cluster.services.items():
        if svc.role == "partition_leader":
            logs = cluster.dir / name / "logs"
            out[name] = sorted(d.name for d in logs.glob(f"{topic}-*")) if logs.is_dir() else []
    return out


def _produce(cluster, topic: str, n: int, **kw) -> None:
    with Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 0}) as p:
        for i in range(n):
            p.send(topic, value=f"v{i}".encode(), **kw)
        p.flush()


def test_delete_topic_removes_data_on_every_replica(make_cluster):
    cluster = make_cluster(partition_leaders=3)
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic("doomed", 2, replication_factor=3), NewTopic("kept", 1, replication_factor=3)])
        _produce(cluster, "doomed", 20)
        wait_for(lambda: all(len(d) == 2 for d in _dirs(cluster, "doomed").values()), 30,
                 "every replica of doomed has its directories")
        cluster.kill("pl-2")  # down while the topic is deleted: deletes its copy at start-up
        admin.delete_topics(["doomed"])
        assert "doomed" not in admin.list_topics()
        wait_for(lambda: not any(d for n, d in _dirs(cluster, "doomed").items() if n != "pl-2"), 30,
                 "live replicas deleted their directories")
        assert _dirs(cluster, "doomed")["pl-2"], "the dead replica still has its files"
        cluster.restart("pl-2")
        wait_for(lambda: not _dirs(cluster, "doomed")["pl-2"], 30, "the restarted replica deleted its directories")
        assert all(_dirs(cluster, "kept").values()), "other topics are untouched"
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            admin.delete_topics(["doomed"])
        with pytest.raises(errors.InvalidTopicException):
            admin.delete_topics(["__consumer_offsets"])
        # The name can be used again, starting from an empty log.
        admin.create_topics([NewTopic("doomed", 1, replication_factor=3)])
        assert admin.list_offsets([TopicPartition("doomed", 0)])[TopicPartition("doomed", 0)] == (0, 0)
        _produce(cluster, "doomed", 3)
        assert admin.list_offsets([TopicPartition("doomed", 0)])[TopicPartition("doomed", 0)] == (3, 3)


def test_create_partitions(cluster):
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic("grow", 2, replication_factor=2)])
        admin.create_partitions({"grow": 5})
        desc = admin.describe_topics(["grow"])["grow"]
        assert sorted(desc.partitions) == [0, 1, 2, 3, 4]
        assert all(len(p.replicas) == 2 and p.leader for p in desc.partitions.values())
        _produce(cluster, "grow", 4, partition=4)
        assert admin.list_offsets([TopicPartition("grow", 4)])[TopicPartition("grow", 4)] == (4, 4)
        with pytest.raises(errors.InvalidPartitionsError, match="must be larger"):
            admin.create_partitions({"grow": 3})
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            admin.create_partitions({"nope": 3})
        with pytest.raises(errors.InvalidTopicException):
            admin.create_partitions({"__transaction_state": 64})


def test_topic_configs_round_trip_and_apply(cluster):
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic("conf", 1, replication_factor=1, config={"segment.bytes": "1048576"})])
        entries = admin.describe_configs(["conf"])["conf"]
        assert entries["segment.bytes"].value == "1048576" and entries["segment.bytes"].source == "TOPIC_CONFIG"
        assert entries["min.insync.replicas"].source == "DEFAULT_CONFIG"
        admin.incremental_alter_configs({"conf": {"segment.bytes": "1024", "min.insync.replicas": "1"}})
        entries = admin.describe_configs(["conf"])["conf"]
        assert (entries["segment.bytes"].value, entries["min.insync.replicas"].source) == ("1024", "TOPIC_CONFIG")
        admin.incremental_alter_configs({"conf": {"min.insync.replicas": None}})
        assert admin.describe_configs(["conf"])["conf"]["min.insync.replicas"].source == "DEFAULT_CONFIG"
        with pytest.raises(errors.InvalidConfigError, match="unknown topic config 'segment.byte'"):
            admin.incremental_alter_configs({"conf": {"segment.byte": "1024"}})
        with pytest.raises(errors.InvalidConfigError, match="not an integer"):
            admin.incremental_alter_configs({"conf": {"retention.ms": "soon"}})
        with pytest.raises(errors.InvalidConfigError, match="unknown topic config"):
            admin.create_topics([NewTopic("conf2", 1, config={"colour": "red"})])
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            admin.describe_configs(["nope"])
        # The leader applies the new segment.bytes: 40 records of ~200 bytes roll segments.
        leader = admin.describe_topics(["conf"])["conf"].partitions[0].leader_id
        with Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 0}) as p:
            for i in range(40):
                p.send("conf", value=b"x" * 200).result(timeout=10)
        segments = list((cluster.dir / leader / "logs" / "conf-0").glob("*.log"))
        assert len(segments) > 2, segments


def test_groups_list_describe_delete_and_lag(cluster):
    bs = cluster.bootstrap_servers
    with AdminClient({"bootstrap.servers": bs}) as admin:
        admin.create_topics([NewTopic("lagging", 1, replication_factor=1)])
        _produce(cluster, "lagging", 10)
        tp = TopicPartition("lagging", 0)
        consumer = Consumer({"bootstrap.servers": bs, "group.id": "g-lag", "auto.offset.reset": "earliest",
                             "enable.auto.commit": False})
        consumer.subscribe(["lagging"])
        got = []
        wait_for(lambda: got.extend(consumer.poll(0.2, max_records=6 - len(got))) or len(got) >= 6, 30,
                 "six records consumed")
        consumer.commit({tp: 6})
        listed = {g.group_id: g for g in admin.list_groups()}
        assert listed["g-lag"].state == "Stable" and listed["g-lag"].protocol_type == "consumer"
        desc = admin.describe_groups(["g-lag"])["g-lag"]
        assert desc.state == "Stable" and len(desc.members) == 1 and desc.members[0].assignment == (tp,)
        assert desc.members[0].subscription == ("lagging",)
        # An open transaction: the high watermark moves, the LSO stays.
        txp = Producer({"bootstrap.servers": bs, "transactional.id": "lag-txn", "linger.ms": 0})
        txp.init_transactions()
        txp.begin_transaction()
        for i in range(3):
            txp.send("lagging", value=b"t")
        txp.flush()
        lag = admin.list_consumer_group_offsets("g-lag")[tp]
        assert (lag.committed_offset, lag.high_watermark, lag.last_stable_offset, lag.lag) == (6, 13, 10, 7)
        assert admin.list_consumer_group_offsets("g-lag", isolation_level="read_committed")[tp].lag == 4
        txp.commit_transaction()
        txp.close()
        # EndTxn answers once the commit is decided; the marker that moves the LSO follows.
        wait_for(lambda: admin.list_consumer_group_offsets("g-lag", isolation_level="read_committed")[tp].lag == 8,
                 30, "the LSO past the committed transaction")
        with pytest.raises(errors.NonEmptyGroupError):
            admin.delete_groups(["g-lag"])
        consumer.close()
        wait_for(lambda: admin.describe_groups(["g-lag"])["g-lag"].state == "Empty", 30, "the group is empty")
        admin.delete_groups(["g-lag"])
        assert "g-lag" not in {g.group_id for g in admin.list_groups()}
        assert admin.describe_groups(["g-lag"])["g-lag"].state == "Dead"
        assert admin.list_consumer_group_offsets("g-lag") == {}
        with pytest.raises(errors.GroupIdNotFoundError):
            admin.delete_groups(["g-lag"])
        # A group with only offsets (committed outside group management) is listed Empty.
        admin.alter_consumer_group_offsets("g-simple", {tp: 2})
        assert {g.group_id: g.state for g in admin.list_groups(["Empty"])}["g-simple"] == "Empty"
        assert admin.list_consumer_group_offsets("g-simple")[tp].lag == 12  # 10 + 3 + the COMMIT marker - 2
