"""AdminClient against the in-process stand-in (docs/design.md, "Decisions")."""
import pytest

from exactly import AdminClient, NewTopic, errors

from .fake_cluster import FakeCluster


@pytest.fixture
def fc():
    cluster = FakeCluster({"existing": 2})
    yield cluster
    cluster.stop()


def test_create_list_describe(fc):
    with AdminClient({"bootstrap.servers": fc.address}) as admin:
        admin.create_topics([NewTopic("a", 3), NewTopic("b", 1, replication_factor=1, config={"x": "1"})])
        assert admin.list_topics() == {"a": [0, 1, 2], "b": [0], "existing": [0, 1]}
        desc = admin.describe_topics(["a"])["a"]
        assert sorted(desc.partitions) == [0, 1, 2] and desc.partitions[0].leader == fc.address
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            admin.describe_topics(["zzz"])


def test_existing_topic_raises_but_others_are_created(fc):
    admin = AdminClient({"bootstrap.servers": fc.address})
    with pytest.raises(errors.TopicAlreadyExistsError) as info:
        admin.create_topics([NewTopic("existing", 2), NewTopic("fresh", 2)])
    assert "existing" in str(info.value)
    assert "fresh" in admin.list_topics()
    with pytest.raises(errors.InvalidPartitionsError):
        admin.create_topics([NewTopic("bad", 0)])
    with pytest.raises(TypeError):
        admin.create_topics(["not-a-NewTopic"])
    admin.close()
