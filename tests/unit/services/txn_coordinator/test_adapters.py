"""Batching across transactions in the coordinator's adapters: markers per partition
leader (ClusterMarkerWriter) and transaction-log appends (ClusterTxnLog,
group commit per leader): one request in flight; what is queued meanwhile goes together next."""
from __future__ import annotations

import asyncio

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.cluster.state import NodeInfo
from services.txn_coordinator.adapters import ClusterMarkerWriter, ClusterTxnLog, Linger, merge_per_partition
from services.txn_coordinator.ports import TxnMarker

LEADERS = {("a", 0): NodeInfo("pl-0", "partition_leader", "127.0.0.1", 1),
           ("a", 1): NodeInfo("pl-1", "partition_leader", "127.0.0.1", 2),
           ("b", 0): NodeInfo("pl-0", "partition_leader", "127.0.0.1", 1)}


class Cluster:
    def leader_of(self, topic, partition):
        return LEADERS.get((topic, partition))


class Client:
    """Records each WriteTxnMarkers request; answers when `gate` is set."""

    def __init__(self, refuse: dict | None = None, drop_last: bool = False):
        self.requests: list[tuple[str, pb.WriteTxnMarkersRequest]] = []
        self.gate = asyncio.Event()
        self.refuse = refuse or {}
        self.drop_last = drop_last

    async def write_txn_markers(self, node, request, timeout_s):
        self.requests.append((node.node_id, request))
        await self.gate.wait()
        resp = pb.WriteTxnMarkersResponse()
        for m in request.markers:
            r = resp.markers.add(producer_id=m.producer_id)
            for t in m.topics:
                rt = r.topics.add(topic=t.topic)
                for p in t.partitions:
                    rt.partitions.add(partition=p, error_code=self.refuse.get((m.producer_id, t.topic, p), 0))
        if self.drop_last:
            del resp.markers[-1]
        return resp


def marker(pid, *tps):
    return TxnMarker(pid, 1, True, 0, frozenset(tps))


def test_markers_of_many_transactions_share_a_request_per_leader():
    async def scenario():
        client = Client(refuse={(3, "a", 1): ErrorCode.NOT_LEADER_OR_FOLLOWER})
        writer = ClusterMarkerWriter(Cluster(), client)
        first = asyncio.create_task(writer.write(marker(1, ("a", 0))))
        await asyncio.sleep(0)  # pid 1's request to pl-0 is in flight
        rest = [asyncio.create_task(writer.write(marker(pid, ("a", 0), ("a", 1), ("b", 0)))) for pid in (2, 3, 4)]
        await asyncio.sleep(0)
        client.gate.set()
        results = await asyncio.gather(first, *rest)
        assert results[0] == {("a", 0): 0}
        assert results[2] == {("a", 0): 0, ("b", 0): 0, ("a", 1): ErrorCode.NOT_LEADER_OR_FOLLOWER}
        assert all(set(r.values()) == {0} for r in (results[1], results[3]))
        to_pl0 = [req for node, req in client.requests if node == "pl-0"]
        to_pl1 = [req for node, req in client.requests if node == "pl-1"]
        # pl-0: pid 1 alone, then 2, 3, 4 together; pl-1: 2, 3, 4 in one request.
        assert [[m.producer_id for m in r.markers] for r in to_pl0] == [[1], [2, 3, 4]]
        assert [[m.producer_id for m in r.markers] for r in to_pl1] == [[2, 3, 4]]
        assert {(t.topic, tuple(t.partitions)) for t in to_pl0[1].markers[0].topics} == {("a", (0,)), ("b", (0,))}

    asyncio.run(scenario())


def test_a_short_answer_and_a_transport_failure_reach_every_waiter():
    async def scenario():
        client = Client(drop_last=True)
        client.gate.set()
        writer = ClusterMarkerWriter(Cluster(), client)
        a, b = await asyncio.gather(writer.write(marker(1, ("a", 0))), writer.write(marker(2, ("a", 0))))
        assert a == {("a", 0): 0} and b == {("a", 0): ErrorCode.UNKNOWN_SERVER_ERROR}

        class Down(Client):
            async def write_txn_markers(self, node, request, timeout_s):
                return ErrorCode.NETWORK_EXCEPTION
        writer = ClusterMarkerWriter(Cluster(), Down())
        assert await writer.write(marker(5, ("a", 0), ("a", 1))) == {("a", 0): ErrorCode.NETWORK_EXCEPTION,
                                                                     ("a", 1): ErrorCode.NETWORK_EXCEPTION}

    asyncio.run(scenario())


def test_transaction_log_appends_are_group_committed_per_leader_in_order():
    """One append request in flight per partition leader; what arrives meanwhile for
    any partition that leader leads goes together next, in arrival order."""
    async def scenario():
        leaders = {0: NodeInfo("pl-0", "partition_leader", "127.0.0.1", 1),
                   1: NodeInfo("pl-0", "partition_leader", "127.0.0.1", 1),
                   2: NodeInfo("pl-1", "partition_leader", "127.0.0.1", 2)}

        class LogCluster:
            def leader_of(self, topic, partition):
                assert topic == "__transaction_state"
                return leaders.get(partition)

        class LogClient:
            cluster = LogCluster()

            def __init__(self):
                self.requests: list[tuple[str, list[tuple[int, bytes]]]] = []
                self.gate = asyncio.Event()

            async def produce_to(self, node, topic, entries, acks, timeout_ms):
                assert (topic, acks) == ("__transaction_state", -1)
                self.requests.append((node.node_id, list(entries)))
                await self.gate.wait()
                return [ErrorCode.NOT_ENOUGH_REPLICAS if b == b"bad" else 0 for _, b in entries]

            async def produce(self, topic, partition, batch, acks, timeout_ms):
                return ErrorCode.LEADER_NOT_AVAILABLE, -1

        client = LogClient()
        txn_log = ClusterTxnLog(client)
        first = asyncio.create_task(txn_log.append(0, b"t1-ongoing"))
        await asyncio.sleep(0)
        rest = [asyncio.create_task(txn_log.append(p, b)) for p, b in
                ((0, b"t2-prepare"), (0, b"bad"), (1, b"t9-ongoing"), (2, b"t5-ongoing"), (0, b"t3-complete"))]
        await asyncio.sleep(0)
        client.gate.set()
        codes = await asyncio.gather(first, *rest)
        assert codes == [0, 0, ErrorCode.NOT_ENOUGH_REPLICAS, 0, 0, 0]
        assert client.requests == [("pl-0", [(0, b"t1-ongoing")]), ("pl-1", [(2, b"t5-ongoing")]),
                                   ("pl-0", [(0, b"t2-prepare"), (0, b"bad"), (1, b"t9-ongoing"),
                                             (0, b"t3-complete")])]
        assert await txn_log.append(7, b"no leader") == ErrorCode.LEADER_NOT_AVAILABLE

    asyncio.run(scenario())


class OneLeader:
    def leader_of(self, topic, partition):
        return LEADERS[("a", 0)]


class AppendClient:
    """Records the partitions of each CoordinatorProduce request and answers NONE."""

    cluster = OneLeader()

    def __init__(self):
        self.requests: list[list[int]] = []

    async def produce_to(self, node, topic, batches, acks, timeout_ms):
        self.requests.append([p for p, _ in batches])
        return [ErrorCode.NONE] * len(batches)


class HeldSleep:
    """A sleep that returns when the test releases it; records the seconds asked."""

    def __init__(self):
        self.slept: list[float] = []
        self.sleeping = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.sleeping.set()
        await self.release.wait()


def test_a_busy_coordinator_lingers_so_that_appends_share_a_request():
    async def scenario(busy: bool) -> tuple[list[list[int]], list[float]]:
        client = AppendClient()
        sleep = HeldSleep()
        linger = Linger(linger_ms=50, sleep=sleep)
        linger.bind(lambda: busy)
        log = ClusterTxnLog(client, linger=linger)
        first = asyncio.create_task(log.append(0, b"x"))
        if busy:
            await asyncio.wait_for(sleep.sleeping.wait(), 5)  # the first request lingers
        else:
            for _ in range(3):
                await asyncio.sleep(0)  # the first request's task runs: sent
        later = asyncio.create_task(log.append(1, b"y"))
        await asyncio.sleep(0)  # the later append is queued
        sleep.release.set()  # the linger is over
        assert await asyncio.wait_for(asyncio.gather(first, later), 5) == [ErrorCode.NONE, ErrorCode.NONE]
        return client.requests, sleep.slept

    # A lone producer's append goes out at once; a later one gets its own request.
    assert asyncio.run(scenario(busy=False)) == ([[0], [1]], [])
    # Several producers committing: the first request waits 50 ms, and the later append joins it.
    assert asyncio.run(scenario(busy=True)) == ([[0, 1]], [0.05])


def test_linger_zero_never_waits():
    async def scenario():
        linger = Linger(linger_ms=0)
        linger.bind(lambda: True)
        waiter = asyncio.create_task(linger.wait())
        await asyncio.sleep(0)
        assert waiter.done()

    asyncio.run(scenario())


def _txn_record(tid: bytes, ts: int, epoch: int = 0) -> bytes:
    return records.encode_batch([(tid, b"state", (), ts)], producer_id=9, producer_epoch=epoch,
                                base_sequence=records.NO_SEQUENCE)


def test_a_requests_batches_of_one_partition_become_one_batch():
    """Group commit merges the records queued for one partition into one record batch
    (in arrival order, the leader appending once per partition); each waiter gets its
    merged batch's answer."""
    async def scenario():
        class Client:
            cluster = OneLeader()

            def __init__(self):
                self.requests: list[list[tuple[int, bytes]]] = []
                self.gate = asyncio.Event()

            async def produce_to(self, node, topic, batches, acks, timeout_ms):
                self.requests.append(list(batches))
                await self.gate.wait()
                return [ErrorCode.NOT_ENOUGH_REPLICAS if p == 1 else ErrorCode.NONE for p, _ in batches]

        client = Client()
        txn_log = ClusterTxnLog(client)
        first = asyncio.create_task(txn_log.append(0, _txn_record(b"t0", 100)))
        await asyncio.sleep(0)  # in flight alone
        queued = [(0, _txn_record(b"t1", 101)), (1, _txn_record(b"t2", 102)), (0, _txn_record(b"t3", 103)),
                  (1, _txn_record(b"t4", 104, epoch=1)), (0, _txn_record(b"t5", 105))]
        rest = [asyncio.create_task(txn_log.append(p, b)) for p, b in queued]
        await asyncio.sleep(0)
        client.gate.set()
        codes = await asyncio.wait_for(asyncio.gather(first, *rest), 5)
        assert codes == [0, 0, ErrorCode.NOT_ENOUGH_REPLICAS, 0, ErrorCode.NOT_ENOUGH_REPLICAS, 0]
        assert len(client.requests) == 2
        # Partition 0: t1, t3, t5 in one batch. Partition 1: t4 is of another writer
        # epoch, so t2 and t4 go as they are, in their order.
        second = [(p, [r.key for r in records.decode_records(b)]) for p, b in client.requests[1]]
        assert second == [(0, [b"t1", b"t3", b"t5"]), (1, [b"t2"]), (1, [b"t4"])]
        assert [b for p, b in client.requests[1][1:]] == [queued[1][1], queued[3][1]]

    asyncio.run(scenario())


def test_merged_batches_stay_below_the_size_bound():
    entries = [(0, _txn_record(b"t%d" % i, i)) for i in range(5)]
    size = len(entries[0][1])
    merged = merge_per_partition(entries, max_bytes=2 * size)
    assert [(p, members) for p, _, members in merged] == [(0, [0, 1]), (0, [2, 3]), (0, [4])]
    assert merged[2][1] == entries[4][1]
    assert [r.key for r in records.decode_records(merged[1][1])] == [b"t2", b"t3"]


class PositionsClient(Client):
    """Answers every marker with the leader's position after it (leader epoch 3, offset
    100 + pid) and records each TxnPartitionsAdded notice."""

    def __init__(self):
        super().__init__()
        self.gate.set()
        self.notices: list[tuple[str, pb.TxnPartitionsAddedRequest]] = []

    async def write_txn_markers(self, node, request, timeout_s):
        resp = await super().write_txn_markers(node, request, timeout_s)
        for m, r in zip(request.markers, resp.markers):
            for t in m.topics:
                r.verifiable_from.add(topic=t.topic, partitions=[
                    pb.PartitionPosition(partition=p, leader_epoch=3, offset=100 + m.producer_id) for p in t.partitions])
        return resp

    def txn_partitions_added(self, node, request):
        self.notices.append((node.node_id, request))


def test_a_marker_answers_positions_and_an_add_tells_each_leader_of_its_partitions_once():
    """The positions a leader gives in its WriteTxnMarkers answer go with the PID's next
    add, one notice per leader; a partition without a position (no marker answered it)
    is left out, and so is a leader with none."""
    async def scenario():
        client = PositionsClient()
        writer = ClusterMarkerWriter(Cluster(), client)
        await writer.write(marker(7, ("a", 0), ("b", 0)))  # both on pl-0
        writer.partitions_added("t", 7, 1, 5, [("a", 0), ("b", 0), ("a", 1)])  # ("a", 1): no position
        assert [node for node, _ in client.notices] == ["pl-0"]
        req = client.notices[0][1]
        assert (req.transactional_id, req.producer_id, req.producer_epoch, req.coordinator_epoch) == ("t", 7, 1, 5)
        assert {(t.topic, p.partition, p.leader_epoch, p.offset) for t in req.topics for p in t.partitions} == \
            {("a", 0, 3, 107), ("b", 0, 3, 107)}
        writer.partitions_added("t", 8, 1, 5, [("a", 0)])  # another PID: no position
        assert len(client.notices) == 1

    asyncio.run(scenario())


def test_the_positions_kept_are_bounded_least_recently_written_first():
    async def scenario():
        client = PositionsClient()
        writer = ClusterMarkerWriter(Cluster(), client, max_positions=2)
        for pid in (1, 2, 3):
            await writer.write(marker(pid, ("a", 0)))
        assert list(writer.positions) == [(2, ("a", 0)), (3, ("a", 0))]
        await writer.write(marker(2, ("a", 0)))  # written again: now the most recent
        assert list(writer.positions) == [(3, ("a", 0)), (2, ("a", 0))]

    asyncio.run(scenario())


def test_appends_to_partitions_this_process_leads_go_in_process_and_a_failure_is_an_unknown_outcome():
    """metadata.version 3: ClusterTxnLog hands the batches of partitions led by this
    process to LocalAppender (the leader's write path in-process), the others to their
    leader over the network; an exception of the local write path (ZooKeeper gone while
    it reads the claim) is an outcome unknown for every batch of the group, as a lost
    answer of a remote append is: the coordinator reloads the partition, and never takes
    a batch that may be in the log for one that is not."""
    from services.partition_leader.produce import ProduceContext
    from services.txn_coordinator.adapters import LocalAppender
    from services.txn_coordinator.ports import AMBIGUOUS_APPEND_ERRORS

    here, there = NodeInfo("txn-0", "txn_coordinator", "127.0.0.1", 1), NodeInfo("pl-0", "partition_leader",
                                                                                 "127.0.0.1", 2)

    class LogCluster:
        def leader_of(self, topic, partition):
            return here if partition < 2 else there

    class LogClient:
        cluster = LogCluster()
        remote: list = []

        async def produce_to(self, node, topic, entries, acks, timeout_ms):
            self.remote.append((node.node_id, list(entries)))
            return [0] * len(entries)

    class Manager:
        hosted = type("Hosted", (), {"monotonic_s": staticmethod(lambda: 0.0)})()
        calls: list = []
        fail = False

        async def append_records(self, ctx: ProduceContext, entries):
            assert ctx.internal_only and ctx.acks == -1
            self.calls.append([(e.topic, e.partition, e.records) for e in entries])
            if self.fail:
                raise RuntimeError("session expired")
            return [type("R", (), {"error": 0})() for _ in entries]

    async def scenario():
        manager, client = Manager(), LogClient()
        txn_log = ClusterTxnLog(client, local=LocalAppender("txn-0", manager))
        codes = await asyncio.gather(txn_log.append(0, b"a"), txn_log.append(1, b"b"), txn_log.append(2, b"c"))
        assert codes == [0, 0, 0]
        assert manager.calls == [[("__transaction_state", 0, b"a"), ("__transaction_state", 1, b"b")]]
        assert client.remote == [("pl-0", [(2, b"c")])]
        manager.fail = True
        codes = await asyncio.gather(txn_log.append(0, b"d"), txn_log.append(1, b"e"))
        assert codes[0] == codes[1] and codes[0] in AMBIGUOUS_APPEND_ERRORS

    asyncio.run(scenario())
