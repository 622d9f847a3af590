"""The Consumer end to end against exactly.testing.MockCluster: positions from committed
offsets or the reset policy, read_committed filtering and the LSO, seeks, rebalances with
callbacks, commits, and a leader going down or moving (the cluster's fault injection)."""
from __future__ import annotations

import pytest

from exactly import errors
from exactly.consumer import Consumer
from exactly.errors import NoOffsetForPartitionError
from exactly_wire.error_codes import ErrorCode
from exactly.types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition


A = TopicPartition("t", 0)
B = TopicPartition("t", 1)




def poll_all(c: Consumer, rounds: int = 20) -> list:
    out = []
    for _ in range(rounds):
        out += c.poll(0.01)
    return out


@pytest.mark.parametrize("isolation,expected", [
    ("read_committed", [b"plain-0", b"committed-0", b"plain-1"]),
    ("read_uncommitted", [b"plain-0", b"aborted-0", b"aborted-1", b"committed-0", b"plain-1"]),
])
def test_isolation_levels(make, logs, isolation, expected):
    logs.transactions()
    c = make(isolation_level=isolation, auto_offset_reset="earliest")
    c.assign([A])
    assert [r.value for r in poll_all(c)] == expected
    assert c.position(A) == 7


def test_default_isolation_is_read_uncommitted(cluster, make, logs):
    logs.transactions()
    c = make(auto_offset_reset="earliest")
    c.assign([A])
    poll_all(c)
    assert cluster.requests_of("Fetch") and all(req.isolation_level == 0 for req in cluster.requests_of("Fetch"))


def test_read_committed_stops_at_lso_until_commit(make, logs):
    logs.plain("t", 0, b"before")
    logs.begin("open")
    logs.in_txn("open", "t", 0, b"open-0")
    logs.plain("t", 0, b"plain-after")
    c = make(isolation_level="read_committed", auto_offset_reset="earliest")
    c.assign([A])
    assert [r.value for r in poll_all(c)] == [b"before"]
    assert c.position(A) == 1
    logs.in_txn("open", "t", 0, b"open-1")
    logs.end("open", committed=True)
    assert [r.value for r in poll_all(c)] == [b"open-0", b"plain-after", b"open-1"]


def test_seek_to_end_read_committed_goes_to_lso(cluster, make, logs):
    logs.plain("t", 0, b"a", b"b")
    logs.begin("open")
    logs.in_txn("open", "t", 0, b"open")
    logs.plain("t", 0, b"c")
    rc = make(isolation_level="read_committed")
    rc.assign([A])
    rc.seek_to_end([A])
    assert rc.position(A) == 2
    ru = make()
    ru.assign([A])
    ru.seek_to_end()
    assert ru.position(A) == 4
    ru.seek_to_beginning([A])
    assert ru.position(A) == 0
    req = [r for r in cluster.requests_of("ListOffsets") if r.isolation_level == 1][0]
    assert req.topics[0].partitions[0].timestamp == -3


def test_seek_and_max_records(make, logs):
    logs.plain("t", 0, *[f"v{i}".encode() for i in range(10)])
    c = make(auto_offset_reset="earliest", max_poll_records=3)
    c.assign([A])
    first = c.poll(1.0)
    assert [r.offset for r in first] == [0, 1, 2] and c.position(A) == 3
    assert [r.offset for r in c.poll(1.0, max_records=2)] == [3, 4]
    c.seek(A, 8)
    assert c.position(A) == 8
    assert [r.offset for r in poll_all(c)] == [8, 9]
    with pytest.raises(ValueError):
        c.seek(A, -1)
    with pytest.raises(errors.IllegalStateError):
        c.seek(B, 0)


def test_auto_offset_reset_latest_and_none(make, logs):
    logs.plain("t", 0, b"old")
    latest = make()  # default latest
    latest.assign([A])
    assert poll_all(latest, 3) == [] and latest.position(A) == 1
    logs.plain("t", 0, b"new")
    assert [r.value for r in poll_all(latest)] == [b"new"]
    none = make(auto_offset_reset="none")
    none.assign([A])
    with pytest.raises(NoOffsetForPartitionError):
        none.poll(0.05)


def test_offset_out_of_range_resets(make, logs):
    logs.plain("t", 0, b"x", b"y")
    c = make(auto_offset_reset="earliest")
    c.assign([A])
    c.seek(A, 100)
    assert [r.value for r in poll_all(c)] == [b"x", b"y"]


def test_leader_down_poll_returns_empty_and_position_does_not_raise(cluster, make, logs):
    logs.plain("t", 0, b"a")
    logs.plain("t", 1, b"b0")
    c = make(auto_offset_reset="earliest")
    c.assign([A, B])
    assert sorted(r.value for r in poll_all(c)) == [b"a", b"b0"]
    logs.plain("t", 0, b"lost-for-now")
    cluster.take_down("leader-0")
    logs.plain("t", 1, b"b1")
    assert [r.value for r in poll_all(c)] == [b"b1"]
    assert c.position(A) == 1
    cluster.bring_up("leader-0")
    got: list = []
    for _ in range(500):  # the metadata refresh after its backoff, however busy the machine
        got += poll_all(c, rounds=1)
        if got:
            break
    assert [r.value for r in got + poll_all(c)] == [b"lost-for-now"]


def test_position_refreshes_metadata_that_knew_no_leader(cluster, clock, make, logs):
    """position() alone (no poll) resolves a reset once a leader is known again: the
    metadata cached while the partition had no live leader is refreshed, as a poll
    would, instead of being asked again until metadata.max.age.ms."""
    logs.plain("t", 0, b"a", b"b")
    cluster.take_down("leader-0")
    c = make(auto_offset_reset="earliest")
    c.assign([A])
    start = clock.now_s()
    with pytest.raises(errors.KafkaTimeoutError):
        c.position(A, timeout=0.3)
    assert clock.now_s() - start >= 0.3  # waited out the timeout (virtual time)
    fetched = len(cluster.requests_of("Metadata"))
    cluster.bring_up("leader-0")
    assert c.position(A, timeout=5) == 0
    assert len(cluster.requests_of("Metadata")) > fetched


def test_position_follows_a_leader_that_moved(cluster, make, logs):
    """A ListOffsets to the leader named by the cached metadata fails (it is gone, the
    partition moved): position() refreshes the metadata and asks the new leader."""
    logs.plain("t", 0, b"a", b"b")
    c = make(auto_offset_reset="earliest")
    c.assign([A])
    assert c.position(A) == 0
    cluster.move_leader("t", 0, "leader-1")
    cluster.take_down("leader-0")
    c.seek_to_end([A])
    assert c.position(A, timeout=5) == 2
    assert [r.address for r in cluster.requests if r.rpc == "ListOffsets"][-1] == cluster.address_of("leader-1")


def test_subscribe_assigns_from_committed_and_rebalances(cluster, make, logs):
    logs.transactions()
    setter = make(group_id="g")
    setter.commit({A: OffsetAndMetadata(3)})  # a simple commit: the group has no members yet
    events = []
    c = make(group_id="g", isolation_level="read_committed")
    c.subscribe(["t"], on_assign=lambda tps: events.append(("assign", tps)),
                on_revoke=lambda tps: events.append(("revoke", tps)))
    got = poll_all(c)
    assert events == [("assign", [A, B])]
    assert [r.value for r in got] == [b"committed-0", b"plain-1"]
    assert all(r.require_stable for r in cluster.requests_of("OffsetFetch"))
    member = c.group_metadata().member_id
    assert member and c.group_metadata() == ConsumerGroupMetadata("g", 1, member, None)
    # the coordinator starts a rebalance: the next poll revokes and rejoins, with a
    # subscription that leaves only t-1 (a second member takes t-0)
    other = make(group_id="g")
    other.subscribe(["t"])
    other.poll(0)  # its JoinGroup waits for `c` to rejoin
    assert c._group.heartbeat_once() == ErrorCode.REBALANCE_IN_PROGRESS
    c.poll(0.05)
    other.poll(0.05)
    c.poll(0.05)
    assert events[1:] == [("revoke", [A, B]), ("assign", [A])] or events[1:] == [("revoke", [A, B]), ("assign", [B])]
    assert c.assignment() | other.assignment() == {A, B} and len(c.assignment()) == 1
    assert c.group_metadata().generation_id == 2


def test_commit_positions_and_committed(cluster, make, logs):
    logs.plain("t", 0, b"a", b"b", b"c")
    c = make(group_id="g", auto_offset_reset="earliest")
    c.subscribe(["t"])
    assert len(poll_all(c)) == 3
    c.commit()
    assert cluster.committed_offsets("g") == {A: 3, B: 0}
    c.commit({A: OffsetAndMetadata(1, "meta")})
    assert c.committed([A]) == {A: OffsetAndMetadata(1, "meta")}
    req = cluster.requests_of("OffsetCommit")[-1]
    assert (req.generation_id, req.member_id) == (1, c.group_metadata().member_id)


def test_committed_waits_for_stable_offsets_under_read_committed(cluster, make):
    make(group_id="g").commit({A: OffsetAndMetadata(7)})
    cluster.fail_next("OffsetFetch", ErrorCode.UNSTABLE_OFFSET_COMMIT)
    c = make(group_id="g", isolation_level="read_committed")
    assert c.committed([A]) == {A: OffsetAndMetadata(7, "")}
    assert len(cluster.requests_of("OffsetFetch")) == 2


def test_position_waits_out_unstable_offset_commit(cluster, make, logs):
    logs.plain("t", 0, b"a", b"b")
    make(group_id="g").commit({A: OffsetAndMetadata(1)})
    cluster.fail_next("OffsetFetch", ErrorCode.UNSTABLE_OFFSET_COMMIT)
    c = make(group_id="g", isolation_level="read_committed")
    c.assign([A])
    assert c.position(A, timeout=5) == 1


def test_commit_after_rebalance_raises_then_rejoins(cluster, make):
    c = make(group_id="g", auto_offset_reset="earliest")
    c.subscribe(["t"])
    poll_all(c, 3)
    cluster.fail_next("OffsetCommit", ErrorCode.ILLEGAL_GENERATION)
    joins = len(cluster.requests_of("JoinGroup"))
    with pytest.raises(errors.IllegalGenerationError):
        c.commit({A: OffsetAndMetadata(0)})
    c.poll(0.05)
    # It joined again; the coordinator, which saw no change, answered its current generation.
    assert len(cluster.requests_of("JoinGroup")) == joins + 1
    assert c.group_metadata().generation_id == 1 and c.assignment() == {A, B}


def test_auto_commit_on_close_and_leave(cluster, make, logs):
    logs.plain("t", 0, b"a")
    revoked = []
    c = make(group_id="g", auto_offset_reset="earliest", enable_auto_commit=True)
    c.subscribe(["t"], on_revoke=revoked.append)
    assert len(poll_all(c)) == 1
    member = c.group_metadata().member_id
    c.close()
    assert cluster.committed_offsets("g") == {A: 1, B: 0}
    assert revoked == [[A, B]]
    assert cluster.requests_of("LeaveGroup")[0].member_id == member
    with pytest.raises(errors.IllegalStateError):
        c.poll(0)
    c.close()  # idempotent


def test_api_misuse(make):
    c = make()
    with pytest.raises(errors.IllegalStateError):
        c.poll(0)
    with pytest.raises(errors.InvalidGroupIdError):
        c.subscribe(["t"])
    with pytest.raises(errors.InvalidGroupIdError):
        c.commit()
    with pytest.raises(errors.InvalidGroupIdError):
        c.group_metadata()
    g = make(group_id="g")
    g.assign([A])
    with pytest.raises(errors.IllegalStateError):
        g.subscribe(["t"])
    assert g.group_metadata() == ConsumerGroupMetadata("g", -1, "", None)
    with pytest.raises(ValueError):
        make(isolation_level="serializable")
    with pytest.raises(ValueError):
        make(auto_offset_reset="sometimes")


def _warnings(caplog, *words):
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and all(w in r.getMessage() for w in words)]


def test_an_empty_poll_warns_what_it_waits_for_rate_limited(cluster, clock, make, logs, caplog):
    # A poll that gets nothing because the partition's leader is down says so at WARNING:
    # once the wait lasted 1 s, then at most every 10 s (virtual time: no real waiting).
    logs.plain("t", 0, b"a")
    cluster.take_down("leader-0")
    caplog.set_level("WARNING", logger="exactly.consumer")
    c = make(auto_offset_reset="earliest", retry_backoff_ms=200, retry_backoff_max_ms=1000)  # few waits per poll
    c.assign([A])
    start = clock.now_s()
    while clock.now_s() - start < 25:
        assert c.poll(1.0) == []
    warned = _warnings(caplog, "t-0", "LeaderNotAvailableError")  # the metadata lists no leader while down
    assert len(warned) == 3, [r.getMessage() for r in caplog.records]  # about 1 s, 11 s and 21 s in
    cluster.bring_up("leader-0")
    caplog.clear()
    got = []
    for _ in range(5):  # the partition's backoff (up to retry.backoff.max.ms) ends first
        got += c.poll(1.0)
    assert [r.value for r in got] == [b"a"]
    for _ in range(3):
        c.poll(1.0)
    assert _warnings(caplog) == []  # an empty poll for want of records is no problem


def test_an_empty_poll_warns_about_an_unknown_subscribed_topic(make, caplog):
    caplog.set_level("WARNING", logger="exactly.consumer")
    c = make(group_id="g")
    c.subscribe(["invoices"])
    for _ in range(3):
        assert c.poll(1.0) == []
    warned = _warnings(caplog, "'invoices'", "does not know")
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


def test_an_empty_poll_warns_when_no_service_answers(cluster, make, caplog):
    caplog.set_level("WARNING", logger="exactly.consumer")
    c = make(auto_offset_reset="earliest", bootstrap_servers=cluster.address_of("leader-0"))
    cluster.take_down("leader-0")  # the only address the consumer knows
    c.assign([A])
    for _ in range(3):
        assert c.poll(1.0) == []
    assert len(_warnings(caplog, "no service of bootstrap.servers leader-0:9092 answers")) == 1, caplog.text
