"""The Consumer end to end against in-process fakes of the services: positions
from committed offsets or the reset policy, read_committed filtering and the LSO,
seeks, rebalances with callbacks, commits, and a leader going down."""
from __future__ import annotations

import pytest

import exactly.consumer as consumer_mod
from exactly import errors
from exactly.consumer import Consumer
from exactly.errors import NoOffsetForPartitionError
from exactly_wire.error_codes import ErrorCode
from exactly.types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition

from .fakes import FakeCore, FakeGroupCoordinator, FakeLeader
from .logbuilder import PartitionLog

A = TopicPartition("t", 0)
B = TopicPartition("t", 1)


@pytest.fixture
def core(monkeypatch):
    fake = FakeCore()
    monkeypatch.setattr(consumer_mod, "ClientCore", lambda conf, transport=None: fake)
    return fake


def make(core, **conf) -> Consumer:
    base = {"bootstrap.servers": "127.0.0.1:1", "fetch.max.wait.ms": 0, "heartbeat.interval.ms": 600000,
            "enable.auto.commit": False}
    base.update({k.replace("_", "."): v for k, v in conf.items()})
    return Consumer(base)


def poll_all(c: Consumer, rounds: int = 20) -> list:
    out = []
    for _ in range(rounds):
        out += c.poll(0.01)
    return out


def txn_log() -> PartitionLog:
    log = PartitionLog()
    log.append([b"plain-0"])                                # 0
    log.append([b"aborted-0", b"aborted-1"], pid=1, transactional=True)  # 1-2
    log.append([b"committed-0"], pid=2, transactional=True)  # 3
    log.marker(1, committed=False)                          # 4
    log.marker(2, committed=True)                           # 5
    log.append([b"plain-1"])                                # 6
    return log


@pytest.mark.parametrize("isolation,expected", [
    ("read_committed", [b"plain-0", b"committed-0", b"plain-1"]),
    ("read_uncommitted", [b"plain-0", b"aborted-0", b"aborted-1", b"committed-0", b"plain-1"]),
])
def test_isolation_levels(core, isolation, expected):
    FakeLeader(core, "l:1", {("t", 0): txn_log()})
    c = make(core, isolation_level=isolation, auto_offset_reset="earliest")
    c.assign([A])
    assert [r.value for r in poll_all(c)] == expected
    assert c.position(A) == 7


def test_default_isolation_is_read_uncommitted(core):
    FakeLeader(core, "l:1", {("t", 0): txn_log()})
    c = make(core, auto_offset_reset="earliest")
    c.assign([A])
    poll_all(c)
    assert all(req.isolation_level == 0 for req in core.calls_of("Fetch"))


def test_read_committed_stops_at_lso_until_commit(core):
    log = PartitionLog()
    log.append([b"before"])
    log.append([b"open-0"], pid=9, transactional=True)
    log.append([b"plain-after"])
    FakeLeader(core, "l:1", {("t", 0): log})
    c = make(core, isolation_level="read_committed", auto_offset_reset="earliest")
    c.assign([A])
    assert [r.value for r in poll_all(c)] == [b"before"]
    assert c.position(A) == 1
    log.append([b"open-1"], pid=9, transactional=True)
    log.marker(9, committed=True)
    assert [r.value for r in poll_all(c)] == [b"open-0", b"plain-after", b"open-1"]


def test_seek_to_end_read_committed_goes_to_lso(core):
    log = PartitionLog()
    log.append([b"a", b"b"])
    log.append([b"open"], pid=3, transactional=True)
    log.append([b"c"])
    FakeLeader(core, "l:1", {("t", 0): log})
    rc = make(core, isolation_level="read_committed")
    rc.assign([A])
    rc.seek_to_end([A])
    assert rc.position(A) == 2
    ru = make(core)
    ru.assign([A])
    ru.seek_to_end()
    assert ru.position(A) == 4
    ru.seek_to_beginning([A])
    assert ru.position(A) == 0
    req = [r for r in core.calls_of("ListOffsets") if r.isolation_level == 1][0]
    assert req.topics[0].partitions[0].timestamp == -3


def test_seek_and_max_records(core):
    log = PartitionLog()
    log.append([f"v{i}".encode() for i in range(10)])
    FakeLeader(core, "l:1", {("t", 0): log})
    c = make(core, auto_offset_reset="earliest", max_poll_records=3)
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


def test_auto_offset_reset_latest_and_none(core):
    log = PartitionLog()
    log.append([b"old"])
    FakeLeader(core, "l:1", {("t", 0): log})
    latest = make(core)  # default latest
    latest.assign([A])
    assert poll_all(latest, 3) == [] and latest.position(A) == 1
    log.append([b"new"])
    assert [r.value for r in poll_all(latest)] == [b"new"]
    none = make(core, auto_offset_reset="none")
    none.assign([A])
    with pytest.raises(NoOffsetForPartitionError):
        none.poll(0.05)


def test_offset_out_of_range_resets(core):
    log = PartitionLog()
    log.append([b"x", b"y"])
    FakeLeader(core, "l:1", {("t", 0): log})
    c = make(core, auto_offset_reset="earliest")
    c.assign([A])
    c.seek(A, 100)
    assert [r.value for r in poll_all(c)] == [b"x", b"y"]


def test_leader_down_poll_returns_empty_and_position_does_not_raise(core):
    log = PartitionLog()
    log.append([b"a"])
    FakeLeader(core, "l:1", {("t", 0): log})
    other = PartitionLog()
    other.append([b"b0"])
    FakeLeader(core, "l:2", {("t", 1): other})
    c = make(core, auto_offset_reset="earliest")
    c.assign([A, B])
    assert sorted(r.value for r in poll_all(c)) == [b"a", b"b0"]
    core.down.add("l:1")
    log.append([b"lost-for-now"])
    other.append([b"b1"])
    assert [r.value for r in poll_all(c)] == [b"b1"]
    assert c.position(A) == 1
    core.down.clear()
    assert [r.value for r in poll_all(c)] == [b"lost-for-now"]


def test_position_refreshes_metadata_that_knew_no_leader(core):
    """position() alone (no poll) resolves a reset once a leader is known again: the
    metadata cached while the partition had no live leader is refreshed, as a poll
    would, instead of being asked again until metadata.max.age.ms."""
    core.cache_metadata = True
    log = PartitionLog()
    log.append([b"a", b"b"])
    FakeLeader(core, "l:1", {("t", 0): log})
    core.down.add("l:1")
    c = make(core, auto_offset_reset="earliest")
    c.assign([A])
    start = core.clock.now_s()
    with pytest.raises(errors.KafkaTimeoutError):
        c.position(A, timeout=0.3)
    assert core.clock.now_s() - start >= 0.3  # waited out the timeout (virtual time)
    core.down.clear()
    assert c.position(A, timeout=5) == 0
    assert core.metadata_refreshes >= 1


def test_position_follows_a_leader_that_moved(core):
    """A ListOffsets to the leader named by the cached metadata fails (it is gone, the
    partition moved): position() refreshes the metadata and asks the new leader."""
    core.cache_metadata = True
    log = PartitionLog()
    log.append([b"a", b"b"])
    FakeLeader(core, "l:1", {("t", 0): log})
    c = make(core, auto_offset_reset="earliest")
    c.assign([A])
    assert c.position(A) == 0
    FakeLeader(core, "l:2", {("t", 0): log})
    core.down.add("l:1")
    c.seek_to_end([A])
    assert c.position(A, timeout=5) == 2
    assert [addr for addr, rpc, _ in core.calls if rpc == "ListOffsets"][-1] == "l:2"


def test_subscribe_assigns_from_committed_and_rebalances(core):
    FakeLeader(core, "l:1", {("t", 0): txn_log(), ("t", 1): PartitionLog()})
    coord = FakeGroupCoordinator(core)
    coord.assignment = [("t", 0), ("t", 1)]
    coord.committed[("t", 0)] = 3
    events = []
    c = make(core, group_id="g", isolation_level="read_committed")
    c.subscribe(["t"], on_assign=lambda tps: events.append(("assign", tps)),
                on_revoke=lambda tps: events.append(("revoke", tps)))
    got = poll_all(c)
    assert events == [("assign", [A, B])]
    assert [r.value for r in got] == [b"committed-0", b"plain-1"]
    assert all(r.require_stable for r in core.calls_of("OffsetFetch"))
    assert c.group_metadata() == ConsumerGroupMetadata("g", 1, "m1", None)
    # the coordinator starts a rebalance: the next poll revokes and rejoins
    coord.heartbeat_code = ErrorCode.REBALANCE_IN_PROGRESS
    c._group.heartbeat_once()
    coord.heartbeat_code = 0
    coord.assignment = [("t", 1)]
    c.poll(0.05)
    assert events[1:] == [("revoke", [A, B]), ("assign", [B])]
    assert c.assignment() == {B}
    assert c.group_metadata().generation_id == 2


def test_commit_positions_and_committed(core):
    log = PartitionLog()
    log.append([b"a", b"b", b"c"])
    FakeLeader(core, "l:1", {("t", 0): log})
    coord = FakeGroupCoordinator(core)
    coord.assignment = [("t", 0)]
    c = make(core, group_id="g", auto_offset_reset="earliest")
    c.subscribe(["t"])
    assert len(poll_all(c)) == 3
    c.commit()
    assert coord.committed == {("t", 0): 3}
    c.commit({A: OffsetAndMetadata(1, "meta")})
    assert c.committed([A]) == {A: OffsetAndMetadata(1, "")}
    req = core.calls_of("OffsetCommit")[-1]
    assert (req.generation_id, req.member_id) == (1, "m1")


def test_committed_waits_for_stable_offsets_under_read_committed(core):
    coord = FakeGroupCoordinator(core)
    coord.committed[("t", 0)] = 7
    coord.unstable = {("t", 0)}
    c = make(core, group_id="g", isolation_level="read_committed")
    assert c.committed([A]) == {A: OffsetAndMetadata(7, "")}
    assert len(core.calls_of("OffsetFetch")) == 2


def test_position_waits_out_unstable_offset_commit(core):
    log = PartitionLog()
    log.append([b"a", b"b"])
    FakeLeader(core, "l:1", {("t", 0): log})
    coord = FakeGroupCoordinator(core)
    coord.committed[("t", 0)] = 1
    coord.unstable = {("t", 0)}
    c = make(core, group_id="g", isolation_level="read_committed")
    c.assign([A])
    assert c.position(A, timeout=5) == 1


def test_commit_after_rebalance_raises_then_rejoins(core):
    FakeLeader(core, "l:1", {("t", 0): PartitionLog()})
    coord = FakeGroupCoordinator(core)
    coord.assignment = [("t", 0)]
    c = make(core, group_id="g", auto_offset_reset="earliest")
    c.subscribe(["t"])
    poll_all(c, 3)
    coord.commit_codes = [ErrorCode.ILLEGAL_GENERATION]
    with pytest.raises(errors.IllegalGenerationError):
        c.commit({A: OffsetAndMetadata(0)})
    c.poll(0.05)
    assert c.group_metadata().generation_id == 2


def test_auto_commit_on_close_and_leave(core):
    log = PartitionLog()
    log.append([b"a"])
    FakeLeader(core, "l:1", {("t", 0): log})
    coord = FakeGroupCoordinator(core)
    coord.assignment = [("t", 0)]
    revoked = []
    c = make(core, group_id="g", auto_offset_reset="earliest", enable_auto_commit=True)
    c.subscribe(["t"], on_revoke=revoked.append)
    assert len(poll_all(c)) == 1
    c.close()
    assert coord.committed == {("t", 0): 1}
    assert revoked == [[A]]
    assert core.calls_of("LeaveGroup")[0].member_id == "m1"
    with pytest.raises(errors.IllegalStateError):
        c.poll(0)
    c.close()  # idempotent


def test_api_misuse(core):
    c = make(core)
    with pytest.raises(errors.IllegalStateError):
        c.poll(0)
    with pytest.raises(errors.InvalidGroupIdError):
        c.subscribe(["t"])
    with pytest.raises(errors.InvalidGroupIdError):
        c.commit()
    with pytest.raises(errors.InvalidGroupIdError):
        c.group_metadata()
    g = make(core, group_id="g")
    g.assign([A])
    with pytest.raises(errors.IllegalStateError):
        g.subscribe(["t"])
    assert g.group_metadata() == ConsumerGroupMetadata("g", -1, "", None)
    with pytest.raises(ValueError):
        make(core, isolation_level="serializable")
    with pytest.raises(ValueError):
        make(core, auto_offset_reset="sometimes")


def _warnings(caplog, *words):
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and all(w in r.getMessage() for w in words)]


def test_an_empty_poll_warns_what_it_waits_for_rate_limited(core, caplog):
    # A poll that gets nothing because the partition's leader is down says so at WARNING:
    # once the wait lasted 1 s, then at most every 10 s (virtual time: no real waiting).
    log = PartitionLog()
    log.append([b"a"])
    FakeLeader(core, "l:1", {("t", 0): log})
    core.down.add("l:1")
    core.retry_backoff_ms, core.retry_backoff_max_ms = 200, 1000  # few waits per 1 s poll
    caplog.set_level("WARNING", logger="exactly.consumer")
    c = make(core, auto_offset_reset="earliest")
    c.assign([A])
    start = core.clock.now_s()
    while core.clock.now_s() - start < 25:
        assert c.poll(1.0) == []
    warned = _warnings(caplog, "t-0", "LeaderNotAvailableError")  # the fake lists no leader while down
    assert len(warned) == 3, [r.getMessage() for r in caplog.records]  # about 1 s, 11 s and 21 s in
    core.down.clear()
    caplog.clear()
    got = []
    for _ in range(5):  # the partition's backoff (up to retry.backoff.max.ms) ends first
        got += c.poll(1.0)
    assert [r.value for r in got] == [b"a"]
    for _ in range(3):
        c.poll(1.0)
    assert _warnings(caplog) == []  # an empty poll for want of records is no problem


def test_an_empty_poll_warns_about_an_unknown_subscribed_topic(core, caplog):
    FakeLeader(core, "l:1", {("t", 0): PartitionLog()})
    coord = FakeGroupCoordinator(core)
    coord.assignment = []
    caplog.set_level("WARNING", logger="exactly.consumer")
    c = make(core, group_id="g")
    c.subscribe(["invoices"])
    for _ in range(3):
        assert c.poll(1.0) == []
    warned = _warnings(caplog, "'invoices'", "does not know")
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


def test_an_empty_poll_warns_when_no_service_answers(core, caplog):
    caplog.set_level("WARNING", logger="exactly.consumer")
    core.metadata_error = errors.NetworkException("UNAVAILABLE: failed to connect to all addresses")

    def no_metadata(topics=None, refresh=False):
        raise core.metadata_error

    core.metadata_nowait = no_metadata
    c = make(core, auto_offset_reset="earliest")
    c.assign([A])
    for _ in range(3):
        assert c.poll(1.0) == []
    assert len(_warnings(caplog, "no service of bootstrap.servers", "failed to connect")) == 1
