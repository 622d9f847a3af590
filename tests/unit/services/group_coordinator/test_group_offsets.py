"""Committed and pending transactional offsets (services/group_coordinator/offsets.py),
the __consumer_offsets record format (log_format.py) and replay of a partition
(state.py). KIP-98 design doc "Consumer Coordinator"; KIP-447 require_stable."""
from __future__ import annotations

import itertools

import pytest

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.group_coordinator import log_format
from services.group_coordinator.group import GroupMetadata
from services.group_coordinator.offsets import FetchedOffset, OffsetAndMetadata, OffsetStore
from services.group_coordinator.state import OffsetsPartitionState

TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)
PID = 4000


def om(offset: int, metadata: str = "") -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, metadata, -1, 1700000000000)


# ---------------------------------------------------------------- OffsetStore

def test_commit_then_fetch():
    s = OffsetStore()
    s.apply_commit("g", TP0, om(10, "m"), log_offset=0)
    assert s.fetch("g", [TP0, TP1], require_stable=False) == {
        TP0: FetchedOffset(10, "m", ErrorCode.NONE), TP1: FetchedOffset(-1, "", ErrorCode.NONE)}
    assert s.fetch("other", [TP0], False) == {TP0: FetchedOffset(-1, "", ErrorCode.NONE)}


def test_pending_offsets_are_invisible_until_the_commit_marker():
    s = OffsetStore()
    s.apply_commit("g", TP0, om(5), 0)
    s.apply_txn_commit(PID, "g", TP0, om(20), 1)
    s.apply_txn_commit(PID, "g", TP1, om(30), 1)
    assert s.fetch("g", [TP0, TP1], require_stable=False) == {
        TP0: FetchedOffset(5, "", ErrorCode.NONE), TP1: FetchedOffset(-1, "", ErrorCode.NONE)}
    assert s.fetch("g", [TP0, TP1], require_stable=True) == {
        TP0: FetchedOffset(-1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT),
        TP1: FetchedOffset(-1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT)}
    assert s.complete_txn(PID, committed=True) == {"g"}
    assert s.fetch("g", [TP0, TP1], require_stable=True) == {
        TP0: FetchedOffset(20, "", ErrorCode.NONE), TP1: FetchedOffset(30, "", ErrorCode.NONE)}


def test_abort_marker_discards_pending_offsets():
    s = OffsetStore()
    s.apply_commit("g", TP0, om(5), 0)
    s.apply_txn_commit(PID, "g", TP0, om(20), 1)
    s.complete_txn(PID, committed=False)
    assert s.fetch("g", [TP0], True) == {TP0: FetchedOffset(5, "", ErrorCode.NONE)}
    assert not s.has_pending("g", TP0)
    s.complete_txn(PID, committed=True)  # a later marker has nothing to apply
    assert s.committed("g", TP0) == om(5)


def test_markers_only_touch_their_own_producer():
    s = OffsetStore()
    s.apply_txn_commit(PID, "g", TP0, om(1), 0)
    s.apply_txn_commit(PID + 1, "g", TP1, om(2), 1)
    s.apply_txn_commit(PID + 1, "h", TP0, om(3), 1)
    assert s.complete_txn(PID + 1, True) == {"g", "h"}
    assert s.fetch("g", None, True) == {TP0: FetchedOffset(-1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT),
                                        TP1: FetchedOffset(2, "", ErrorCode.NONE)}
    assert s.fetch("g", None, False) == {TP1: FetchedOffset(2, "", ErrorCode.NONE)}
    assert s.committed("h", TP0) == om(3)


def test_a_later_plain_commit_wins_over_an_earlier_transactional_one():
    s = OffsetStore()
    s.apply_txn_commit(PID, "g", TP0, om(20), log_offset=3)
    s.apply_commit("g", TP0, om(25), log_offset=4)
    s.complete_txn(PID, True)
    assert s.committed("g", TP0) == om(25)


def test_tombstone_deletes_a_committed_offset():
    s = OffsetStore()
    s.apply_commit("g", TP0, om(1), 0)
    s.apply_commit("g", TP0, None, 1)
    assert s.committed("g", TP0) is None
    assert s.groups() == set()


# ---------------------------------------------------------------- record format

def test_offset_batch_round_trip():
    batch = log_format.offsets_batch("g", {TP0: om(7, "meta"), TP1: om(8)}, 123)
    h = records.verify_crc(batch)
    assert (h.producer_id, h.is_transactional, h.record_count) == (-1, False, 2)
    recs = records.decode_records(batch)
    assert log_format.decode_key(recs[0].key) == log_format.OffsetKey("g", TP0)
    assert log_format.decode_offset_value(recs[0].value) == om(7, "meta")
    assert log_format.decode_offset_value(None) is None


def test_txn_offset_batch_is_transactional_for_the_producer():
    batch = log_format.offsets_batch("g", {TP0: om(7)}, 123, producer_id=PID, producer_epoch=3)
    h = records.verify_crc(batch)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (PID, 3, records.NO_SEQUENCE)
    assert h.is_transactional and not h.is_control


def test_group_batch_round_trip():
    ids = itertools.count(1)
    g = GroupMetadata("grp", 0, new_member_id=lambda _i: f"m{next(ids)}")
    g.join("", ["orders"], 10_000, 0, 0)
    g.join("", ["orders", "payments"], 10_000, 0, 0, group_instance_id="inst")
    g.poll_rebalance(0, {"orders": 3, "payments": 1})
    batch = log_format.group_batch(g.snapshot(), 5)
    rec = records.decode_records(batch)[0]
    assert log_format.decode_key(rec.key) == log_format.GroupKey("grp")
    assert log_format.decode_group_value("grp", rec.value) == g.snapshot()


def test_garbage_key_is_corruption():
    with pytest.raises(records.CorruptRecordError):
        log_format.decode_key(b"\xff\xff\xff")


# ---------------------------------------------------------------- replay

class _Log:
    """A list of batches with offsets assigned, like a partition."""

    def __init__(self):
        self.buf = bytearray()
        self.end = 0

    def append(self, batch: bytes) -> int:
        b = bytearray(batch)
        records.set_base_offset(b, self.end)
        self.buf += b
        base = self.end
        self.end += records.parse_header(b).last_offset_delta + 1
        return base


def _replay(buf: bytes, max_bytes: int | None = None) -> OffsetsPartitionState:
    """Load a partition as the tailer does: fetches of whole batches from
    next_offset, at most max_bytes each (at least one batch)."""
    st = OffsetsPartitionState(0)
    batches = [bytes(buf[pos:pos + h.size]) for pos, h in records.iter_batches(buf)]
    while True:
        piece = b""
        for b in batches:
            if records.parse_header(b).last_offset < st.next_offset:
                continue
            if piece and max_bytes is not None and len(piece) + len(b) > max_bytes:
                break
            piece += b
        if not piece:
            return st
        st.apply_all(piece, 0, loading=True)


def test_replay_applies_markers_like_the_live_state():
    log = _Log()
    live = OffsetsPartitionState(0)

    def write(batch):
        base = log.append(batch)
        live.apply_all(bytes(log.buf[-len(batch):]), 0, loading=False)
        return base

    write(log_format.offsets_batch("g", {TP0: om(1)}, 0))
    write(log_format.offsets_batch("g", {TP0: om(5), TP1: om(6)}, 0, producer_id=PID, producer_epoch=0))
    write(log_format.offsets_batch("h", {TP0: om(9)}, 0, producer_id=PID + 1, producer_epoch=0))
    write(records.encode_control_batch(True, PID, 0, 0, 0))
    write(log_format.offsets_batch("g", {TP1: om(7)}, 0, producer_id=PID, producer_epoch=1))
    write(records.encode_control_batch(False, PID, 1, 0, 0))
    write(log_format.offsets_batch("h", {TP1: om(11)}, 0))

    assert live.offsets.fetch("g", [TP0, TP1], True) == {
        TP0: FetchedOffset(5, "", ErrorCode.NONE), TP1: FetchedOffset(6, "", ErrorCode.NONE)}
    assert live.offsets.fetch("h", [TP0, TP1], True) == {
        TP0: FetchedOffset(-1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT), TP1: FetchedOffset(11, "", ErrorCode.NONE)}
    for chunk in (None, 100, 200):
        replayed = _replay(bytes(log.buf), chunk)
        assert replayed.offsets.state() == live.offsets.state()
        assert replayed.next_offset == log.end


def test_replay_keeps_the_latest_generation_of_each_group():
    ids = itertools.count(1)
    g = GroupMetadata("grp", 0, new_member_id=lambda _i: f"m{next(ids)}")
    log = _Log()
    g.join("", ["orders"], 10_000, 0, 0)
    log.append(log_format.group_batch(g.poll_rebalance(0, {"orders": 2}).snapshot, 0))
    g.store_completed(1, ErrorCode.NONE, 0)
    g.join("", ["orders"], 10_000, 0, 0)
    g.join("m1", ["orders"], 10_000, 0, 0)
    gen2 = g.poll_rebalance(0, {"orders": 2}).snapshot
    g.store_completed(2, ErrorCode.NONE, 0)
    g.leave("m1", 0)
    g.join("m2", ["orders"], 10_000, 0, 0)
    gen3 = g.poll_rebalance(0, {"orders": 2}).snapshot
    log.append(log_format.group_batch(gen3, 0))
    log.append(log_format.group_batch(gen2, 0))  # an older store that lost the race
    st = _replay(bytes(log.buf))
    assert st.groups["grp"].snapshot() == gen3
    assert st.groups["grp"].generation == 3


def test_live_tail_does_not_overwrite_groups_with_their_own_records():
    st = OffsetsPartitionState(0)
    ids = itertools.count(1)
    g = GroupMetadata("grp", 0, new_member_id=lambda _i: f"m{next(ids)}")
    st.groups["grp"] = g
    g.join("", ["orders"], 10_000, 0, 0)
    snap = g.poll_rebalance(0, {"orders": 2}).snapshot
    g.store_completed(1, ErrorCode.NONE, 0)
    g.join("", ["orders"], 10_000, 0, 0)  # a new member while the record is in flight
    st.apply_all(log_format.group_batch(snap, 0), 0, loading=False)
    assert st.groups["grp"] is g and len(g.members) == 2


def test_corrupt_batch_is_skipped():
    log = _Log()
    log.append(log_format.offsets_batch("g", {TP0: om(1)}, 0))
    bad = bytearray(log_format.offsets_batch("g", {TP0: om(2)}, 0))
    bad[-1] ^= 0xFF
    log.append(bytes(bad))
    log.append(log_format.offsets_batch("g", {TP1: om(3)}, 0))
    st = _replay(bytes(log.buf))
    assert st.corrupt_batches == [(1, 1)]
    assert st.offsets.committed("g", TP0) == om(1)
    assert st.offsets.committed("g", TP1) == om(3)
    assert st.next_offset == 3
