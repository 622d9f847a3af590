"""AdminClient against an in-process cluster, exactly.testing.MockCluster (docs/design.md, "Decisions")."""
import pytest

from exactly import AdminClient, NewTopic, errors
from exactly.admin import MetadataAt, ProbeLeader, RefreshMetadata, Sleep, wait_serving_flow, wait_unlisted_flow
from exactly.config import AdminSchema
from exactly_wire.clock import SYSTEM_CLOCK
from exactly_wire.config import parse

from exactly.testing import MockCluster


@pytest.fixture
def fc():
    with MockCluster(topics={"existing": 2}) as cluster:
        yield cluster


def test_create_list_describe(fc):
    with AdminClient({"bootstrap.servers": fc.bootstrap_servers}, transport=fc) as admin:
        admin.create_topics([NewTopic("a", 3), NewTopic("b", 1, replication_factor=1, config={"x": "1"})])
        assert admin.list_topics() == {"a": [0, 1, 2], "b": [0], "existing": [0, 1]}
        desc = admin.describe_topics(["a"])["a"]
        assert sorted(desc.partitions) == [0, 1, 2] and desc.partitions[0].leader == fc.address_of("leader-0")
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            admin.describe_topics(["zzz"])


def test_existing_topic_raises_but_others_are_created(fc):
    admin = AdminClient({"bootstrap.servers": fc.bootstrap_servers}, transport=fc)
    with pytest.raises(errors.TopicAlreadyExistsError) as info:
        admin.create_topics([NewTopic("existing", 2), NewTopic("fresh", 2)])
    assert "existing" in str(info.value)
    assert "fresh" in admin.list_topics()
    with pytest.raises(errors.InvalidPartitionsError):
        admin.create_topics([NewTopic("bad", 0)])
    with pytest.raises(TypeError):
        admin.create_topics(["not-a-NewTopic"])
    admin.close()


class _UpAfterOneRefusal(MockCluster):
    """A cluster whose node `node` is down for the first request that reaches it and
    up from then on: a service restarting, or one busy past a call's deadline."""

    def __init__(self, node: str, **kwargs):
        super().__init__(**kwargs)
        self.refused = 0
        self.take_down(node)
        self._node = node

    def _serve(self, request, context, run):
        try:
            return super()._serve(request, context, run)
        finally:
            if self.refused == 0:
                self.refused = 1
                self.bring_up(self._node)


@pytest.mark.parametrize("call", ["list_topics", "describe_topics", "list_transactions"])
def test_a_service_that_refuses_a_metadata_request_is_asked_again(call):
    """Metadata requests of the admin calls are retried as their other requests are
    (Kafka's admin client retries a describe until default.api.timeout.ms): with one
    bootstrap address, the only service refusing once does not fail the call."""
    with _UpAfterOneRefusal("leader-0", topics={"existing": 2}) as cluster, \
            AdminClient({"bootstrap.servers": cluster.address_of("leader-0"), "retry.backoff.ms": 1},
                        transport=cluster) as admin:
        got = getattr(admin, call)()
        assert cluster.refused == 1
        assert [r.rpc for r in cluster.requests][0] == "Metadata"
        if call != "list_transactions":
            assert "existing" in got


def test_the_asyncio_admin_asks_again_too():
    import asyncio
    from exactly.aio import AIOAdminClient

    async def main():
        with _UpAfterOneRefusal("leader-0", topics={"existing": 2}) as cluster:
            admin = AIOAdminClient({"bootstrap.servers": cluster.address_of("leader-0"), "retry.backoff.ms": 1},
                                   transport=cluster)
            try:
                assert "existing" in await admin.describe_topics()
                assert cluster.refused == 1
            finally:
                await admin.close()

    asyncio.run(main())


def _metadata(partitions: int):
    """Two services' metadata listing topic "grow" with `partitions` partitions (0: not listed)."""
    from exactly._client import Metadata
    from exactly_wire.v1 import exactly_pb2 as pb
    resp = pb.MetadataResponse(nodes=[pb.Node(node_id="pl-0", role="partition_leader", host="h", port=1),
                                      pb.Node(node_id="pl-1", role="partition_leader", host="h", port=2)],
                               topics=[pb.TopicMetadata(name="grow", partitions=[
                                   pb.PartitionMetadata(partition=p, leader_id="pl-0") for p in range(partitions)])]
                               if partitions else [])
    return Metadata.from_response(resp, 0)


class _Core:
    """What the wait flows read of the client core: its settings and its clock."""
    settings = parse(AdminSchema, {"bootstrap.servers": "h:1", "retry.backoff.ms": 10, "retry.backoff.max.ms": 40})
    clock = SYSTEM_CLOCK


def _drive(flow, metadata: int, views: dict[str, list[int]]) -> tuple[list[str], int]:
    """Run a wait flow to its end: RefreshMetadata answers `_metadata(metadata)`, a
    leader probe answers, MetadataAt(address) answers `_metadata(views[address][round])`.
    Returns (the effects' type names in order, rounds slept)."""
    effects, answer, rounds = [], None, 0
    try:
        while True:
            effect = flow.send(answer)
            effects.append(type(effect).__name__)
            if isinstance(effect, RefreshMetadata):
                answer = _metadata(metadata)
            elif isinstance(effect, ProbeLeader):
                answer = True
            elif isinstance(effect, MetadataAt):
                answer = _metadata(views[effect.address][rounds])
            elif isinstance(effect, Sleep):
                rounds += 1
                answer = None
    except StopIteration:
        return effects, rounds


def test_wait_serving_waits_until_every_service_lists_the_new_partitions():
    """A service whose ZooKeeper cache has not seen the new partitions yet keeps the
    flow waiting, so the next call sees them whichever service it asks."""
    views = {"h:1": [5, 5], "h:2": [2, 5]}  # what each service lists, round by round
    effects, rounds = _drive(wait_serving_flow(_Core(), ["grow"], SYSTEM_CLOCK.now_s() + 60), 5, views)
    assert rounds == 1 and effects.count("Sleep") == 1
    assert effects.count("MetadataAt") == 4  # both services asked in each of the two rounds


def test_wait_unlisted_waits_until_no_service_lists_the_deleted_topic():
    """delete_topics returns only when every service that answers has dropped the
    topic from its ZooKeeper cache, so list_topics right after does not list it
    whichever service it asks; a service that does not answer is not waited for."""
    # What each service lists, round by round: h:2's cache drops the topic a round later.
    views = {"h:1": [0, 0], "h:2": [5, 0]}
    effects, rounds = _drive(wait_unlisted_flow(_Core(), {"grow"}, SYSTEM_CLOCK.now_s() + 60), 0, views)
    assert rounds == 1 and effects.count("MetadataAt") == 4

    flow = wait_unlisted_flow(_Core(), {"grow"}, SYSTEM_CLOCK.now_s() + 60)
    assert isinstance(flow.send(None), RefreshMetadata)
    assert isinstance(flow.send(_metadata(0)), MetadataAt)
    assert isinstance(flow.send(None), MetadataAt)  # h:1 does not answer: not waited for
    with pytest.raises(StopIteration):
        flow.send(_metadata(0))


def test_wait_unlisted_times_out_naming_the_topic():
    flow = wait_unlisted_flow(_Core(), {"grow"}, SYSTEM_CLOCK.now_s() - 1)
    assert isinstance(flow.send(None), RefreshMetadata)
    with pytest.raises(errors.KafkaTimeoutError, match="grow"):
        flow.send(_metadata(3))


def test_find_hanging_rows_of_prepared_transactions_waiting_past_their_timeout():
    """A prepared transaction (KIP-939) waiting longer than its transaction.timeout.ms
    gets a row per scanned partition, with its state string and how to decide it; one
    not yet that old, none; one without partitions, one row when everything is scanned."""
    from exactly import PreparedTxnState, TopicPartition
    from exactly.admin import ProducerState, TransactionDescription, _prepared_rows

    def prepared(tid: str, at: int, partitions=(("t", 0), ("t", 1))) -> TransactionDescription:
        return TransactionDescription(tid, "PrepareTxn", 9, 5, 1000, at - 10, partitions, at,
                                      PreparedTxnState(tid, 9, 4))
    producers = {TopicPartition("t", 0): [ProducerState(8, 0, 3, 1, 2, -1), ProducerState(9, 4, 7, 900, 3, 42)]}
    old, young, empty = prepared("old", 1000), prepared("young", 2500), prepared("empty", 1000, ())
    rows = _prepared_rows({"old": old, "young": young, "empty": empty}, producers, True, 3000)
    assert [(r.transactional_id, r.topic, r.partition, r.producer_id, r.producer_epoch, r.start_offset,
             r.coordinator_epoch, r.duration_ms, r.prepared_state) for r in rows] == [
        ("old", "t", 0, 9, 4, 42, 3, 2000, "9:4:old"), ("empty", "", -1, 9, 4, -1, -1, 2000, "9:4:empty")]
    assert "commit-prepared" in rows[0].reason and "abort-prepared" in rows[0].reason
    assert [r.transactional_id for r in _prepared_rows({"old": old, "empty": empty}, producers, False, 3000)] == \
        ["old"]
