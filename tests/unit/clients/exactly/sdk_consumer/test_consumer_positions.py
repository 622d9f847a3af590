"""Position bookkeeping: draining buffered fetches, seeks invalidating in-flight
responses and read_committed state, error handling per partition in the Fetcher; the
Fetcher against exactly.testing.MockCluster (one partition leader here) and the errors it
is told to answer."""
from __future__ import annotations

import pytest

from exactly import errors
from exactly._client import ClientCore
from exactly._consumer_state import TopicPartitionState, ResetStrategy, SubscriptionState
from exactly.config import ConsumerSchema
from exactly.errors import NoOffsetForPartitionError
from exactly._fetcher import READ_COMMITTED, READ_UNCOMMITTED, Fetcher, parse_fetched
from exactly.testing import MockCluster
from exactly_wire.config import parse
from exactly_wire.error_codes import ErrorCode
from exactly.types import TopicPartition
from exactly_wire.v1 import exactly_pb2 as pb

from .logbuilder import PartitionLog

A = TopicPartition("t", 0)
B = TopicPartition("t", 1)


@pytest.fixture
def cluster():
    """Both partitions of "t" on one partition leader: a fetch of both is one request."""
    with MockCluster({"t": 2}) as c:
        yield c


@pytest.fixture
def make_fetcher(cluster):
    cores = []

    def _make(partitions, isolation=READ_UNCOMMITTED, reset=ResetStrategy.EARLIEST):
        """(core, subscription state, fetcher) reading `partitions` from offset 0; the
        core has fetched the cluster's metadata."""
        core = ClientCore(parse(ConsumerSchema, {"bootstrap.servers": cluster.bootstrap_servers}), transport=cluster)
        cores.append(core)
        core.metadata()
        subs = SubscriptionState(default_reset=reset)
        subs.assign_from_user(partitions)
        for tp in partitions:
            subs.assignment[tp].seek(0)
        fetcher = Fetcher(core, subs, isolation_level=isolation, max_wait_ms=0, min_bytes=1,
                          max_bytes=1 << 20, partition_max_bytes=1 << 20, backoff_ms=0, backoff_max_ms=0)
        return core, subs, fetcher

    yield _make
    for core in cores:
        core.close()


def write(logs, tp: TopicPartition, n: int) -> None:
    """Records v0..v<n-1> to `tp`, one batch each."""
    logs.plain(tp.topic, tp.partition, *[f"v{i}".encode() for i in range(n)])


def test_drain_moves_position_record_by_record_then_past_trailing_markers():
    log = PartitionLog()
    log.append([b"a", b"b", b"c"], pid=1, transactional=True)
    log.marker(1, committed=True)
    fetched = parse_fetched(A, log.fetch(0)[0], 0, None)
    recs, pos = fetched.drain(2)
    assert [r.offset for r in recs] == [0, 1] and pos == 2
    recs, pos = fetched.drain(2)
    assert [r.offset for r in recs] == [2] and pos == 4  # past the COMMIT marker
    assert fetched.exhausted


def test_fetcher_round_trip_positions_and_max_records(make_fetcher, logs):
    write(logs, A, 5)
    write(logs, B, 3)
    core, subs, fetcher = make_fetcher([A, B])
    assert fetcher.send_fetches() == 1  # both partitions, one leader, one request
    fetcher.wait(1.0)
    got = fetcher.drain(4)
    assert len(got) == 4
    got += fetcher.drain(100)
    assert sorted((r.partition, r.offset) for r in got) == [(0, i) for i in range(5)] + [(1, i) for i in range(3)]
    assert subs.positions() == {A: 5, B: 3}
    # nothing new: an empty fetch keeps positions
    fetcher.send_fetches()
    fetcher.wait(1.0)
    assert fetcher.drain(10) == [] and subs.positions() == {A: 5, B: 3}


def test_records_returned_in_offset_order_per_partition_across_fetches(make_fetcher, logs):
    write(logs, A, 10)
    core, subs, fetcher = make_fetcher([A])
    got = []
    for _ in range(10):
        fetcher.send_fetches()
        fetcher.wait(1.0)
        got += fetcher.drain(3)
    assert [r.offset for r in got] == list(range(10))


def test_partition_with_buffered_records_is_not_fetched_again(make_fetcher, logs):
    write(logs, A, 4)
    core, subs, fetcher = make_fetcher([A])
    fetcher.send_fetches()
    fetcher.wait(1.0)
    fetcher.drain(1)
    assert fetcher.send_fetches() == 0
    fetcher.drain(10)
    assert fetcher.send_fetches() == 1


def test_seek_drops_buffer_and_stale_responses(make_fetcher, logs):
    write(logs, A, 6)
    core, subs, fetcher = make_fetcher([A])
    fetcher.send_fetches()
    fetcher.wait(1.0)
    subs.state(A).seek(4)
    assert subs.state(A).buffered is None
    assert [r.offset for r in fetcher.drain(10)] == []
    # a response to a request sent before the seek is dropped
    sent = {A: (0, subs.state(A).epoch - 1)}
    pr = pb.FetchPartitionResponse(partition=0, records=PartitionLog().fetch(0)[0])
    fetcher.handle_partition(A, pr, sent)
    assert subs.state(A).buffered is None and subs.state(A).position == 4
    fetcher.send_fetches()
    fetcher.wait(1.0)
    assert [r.offset for r in fetcher.drain(10)] == [4, 5]


def test_seek_clears_read_committed_state():
    st = TopicPartitionState(position=0)
    from exactly._fetched import AbortedTransactions
    st.aborted = AbortedTransactions()
    st.aborted.add([(1, 0)])
    epoch = st.epoch
    st.seek(10)
    assert st.aborted is None and st.epoch == epoch + 1 and st.position == 10


def test_response_for_revoked_partition_is_ignored(make_fetcher, logs):
    write(logs, A, 2)
    core, subs, fetcher = make_fetcher([A])
    fetcher.send_fetches()
    subs.assign_from_user([B])
    fetcher.wait(1.0)
    assert A not in subs.assignment


def test_only_markers_and_aborted_data_advance_position(cluster, make_fetcher, logs):
    logs.begin("aborted")
    logs.in_txn("aborted", "t", 0, b"x")
    logs.end("aborted", committed=False)  # its ABORT marker at offset 1
    core, subs, fetcher = make_fetcher([A], isolation=READ_COMMITTED)
    fetcher.send_fetches()
    fetcher.wait(1.0)
    assert fetcher.drain(10) == []
    assert subs.state(A).position == 2 and subs.state(A).buffered is None
    assert cluster.requests_of("Fetch")[0].isolation_level == 1


def test_offset_out_of_range_requests_reset_with_policy(make_fetcher, logs):
    write(logs, A, 2)
    core, subs, fetcher = make_fetcher([A], reset=ResetStrategy.LATEST)
    subs.state(A).seek(50)
    fetcher.send_fetches()
    fetcher.wait(1.0)
    st = subs.state(A)
    assert st.reset_strategy is ResetStrategy.LATEST and not st.has_position


def test_offset_out_of_range_with_policy_none_raises_from_drain(make_fetcher, logs):
    write(logs, A, 2)
    core, subs, fetcher = make_fetcher([A], reset=ResetStrategy.NONE)
    subs.state(A).seek(50)
    fetcher.send_fetches()
    fetcher.wait(1.0)
    with pytest.raises(NoOffsetForPartitionError) as ei:
        fetcher.drain(10)
    assert isinstance(ei.value, errors.OffsetOutOfRangeError)


@pytest.mark.parametrize("code", [ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                  ErrorCode.LEADER_NOT_AVAILABLE])
def test_leader_errors_back_off_refresh_metadata_and_retry(cluster, make_fetcher, logs, code):
    write(logs, A, 2)
    core, subs, fetcher = make_fetcher([A])
    cluster.fail_next("Fetch", code, topic="t", partition=0)
    fetcher.send_fetches()
    fetcher.wait(1.0)
    assert fetcher.drain(10) == []
    assert subs.state(A).failures == 1 and subs.state(A).position == 0
    fetched = len(cluster.requests_of("Metadata"))
    fetcher.send_fetches()  # refreshes metadata first (in the background), then fetches again
    refresh = core.pending_refresh()
    if refresh is not None:
        refresh.result(5)
    assert len(cluster.requests_of("Metadata")) == fetched + 1
    fetcher.wait(1.0)
    assert [r.offset for r in fetcher.drain(10)] == [0, 1]
    assert subs.state(A).failures == 0


def test_leader_down_returns_nothing_and_keeps_position(cluster, make_fetcher, logs):
    write(logs, A, 3)
    write(logs, B, 2)
    core, subs, fetcher = make_fetcher([A, B])
    fetcher.send_fetches()
    fetcher.wait(1.0)
    assert len(fetcher.drain(100)) == 5
    cluster.take_down("leader-0")
    for _ in range(3):
        fetcher.send_fetches()
        fetcher.wait(0.01)
        assert fetcher.drain(100) == []
    assert subs.positions() == {A: 3, B: 2}


def test_non_retriable_partition_error_is_raised(cluster, make_fetcher, logs):
    write(logs, A, 2)
    core, subs, fetcher = make_fetcher([A])
    cluster.fail_next("Fetch", ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic="t", partition=0)
    fetcher.send_fetches()
    fetcher.wait(1.0)
    with pytest.raises(errors.TopicAuthorizationFailedError):
        fetcher.drain(10)


def test_corrupt_batch_error_after_good_records(make_fetcher):
    log = PartitionLog()
    for value in (b"v0", b"v1"):
        log.append([value])
    broken = bytearray(log.entries[1].data)
    broken[-1] ^= 0x55
    log.entries[1].data = bytes(broken)
    core, subs, fetcher = make_fetcher([A])
    pr = pb.FetchPartitionResponse(partition=0, high_watermark=2, records=log.fetch(0)[0])
    fetcher.handle_partition(A, pr, {A: (0, subs.state(A).epoch)})  # as a leader answering the corrupt batch
    assert [r.offset for r in fetcher.drain(10)] == [0]
    with pytest.raises(errors.CorruptMessageError):
        fetcher.drain(10)
    assert subs.state(A).position == 1


def test_assignment_keeps_state_of_retained_partitions():
    subs = SubscriptionState()
    subs.assign_from_user([A, B])
    subs.state(A).seek(7)
    subs.assign_from_user([A])
    assert subs.positions() == {A: 7}
    subs.assign_from_user([A, B])
    assert subs.state(B).awaiting_committed


def test_state_of_unassigned_partition_raises():
    with pytest.raises(errors.IllegalStateError):
        SubscriptionState().state(A)
