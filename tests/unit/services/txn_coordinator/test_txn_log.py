"""Transaction log records: encoding round trip and rebuilding the cache
(design doc "Transaction Log", "Transaction Coordinator Startup")."""
from __future__ import annotations

import pytest

from exactly_wire import records
from exactly_wire.v1 import txn_log_pb2
from txn_coordinator_fakes import replayed
from services.txn_coordinator import txn_log
from services.txn_coordinator.state import GroupAssignment, TxnState, TxnTransitMetadata
from services.txn_coordinator.txn_log import CorruptTxnLogError, TxnLogEntry

S = TxnState


def transit(state=S.ONGOING, pid=7, epoch=2, partitions=frozenset({("orders", 0), ("orders", 2), ("pay", 1)}),
            start=1000, update=1500):
    return TxnTransitMetadata(producer_id=pid, last_producer_id=-1, producer_epoch=epoch, last_producer_epoch=1,
                              txn_timeout_ms=60000, state=state, partitions=partitions,
                              txn_start_timestamp=start, txn_last_update_timestamp=update)


@pytest.mark.parametrize("state", [s for s in TxnState if s not in (S.DEAD, S.PREPARE_EPOCH_FENCE)])
def test_value_round_trip(state):
    t = transit(state)
    assert txn_log.decode_value(txn_log.encode_value(t)) == t


def test_group_assignment_is_a_record_of_its_own():
    """KIP-447 draft: the assignment of a group-aware producer has its own key and
    value type; the last record of (group, transactional.id) wins, a tombstone removes
    it, and transaction records next to it are unaffected."""
    a4 = GroupAssignment("g", 4, frozenset({("in", 0), ("in", 3)}))
    a5 = GroupAssignment("g", 5, frozenset({("in", 1)}))
    log = bytearray()
    for i, batch in enumerate([txn_log.encode_group_batch("g", "p1", a4, 10),
                               txn_log.encode_batch("p1", transit(), 11),
                               txn_log.encode_group_batch("g", "p2", a4, 12),
                               txn_log.encode_group_batch("g", "p1", a5, 13),
                               txn_log.encode_group_batch("g", "p2", None, 14)]):
        b = bytearray(batch)
        records.set_base_offset(b, i)
        log += b
    entries, next_offset = txn_log.decode_fetched(bytes(log))
    assert next_offset == 5
    groups = [e for e in entries if isinstance(e, txn_log.GroupAssignmentEntry)]
    assert [(e.group_id, e.transactional_id, e.assignment) for e in groups] == [
        ("g", "p1", a4), ("g", "p2", a4), ("g", "p1", a5), ("g", "p2", None)]
    assert replayed(entries).groups == {"g": {"p1": a5}}
    assert set(replayed(entries).txns) == {"p1"}
    [rec] = records.decode_records(txn_log.encode_group_batch("g", "p1", a4, 10))
    assert rec.key == b"\0group\0g\0p1"
    v = txn_log_pb2.GroupAssignmentValue.FromString(rec.value)
    assert (v.version, v.generation_id) == (0, 4)


def test_value_fields_follow_the_schema():
    v = txn_log_pb2.TransactionLogValue.FromString(txn_log.encode_value(transit(S.PREPARE_COMMIT)))
    assert (v.version, v.producer_id, v.producer_epoch, v.transaction_timeout_ms, v.state) == (0, 7, 2, 60000, 2)
    assert [(tp.topic, list(tp.partitions)) for tp in v.partitions] == [("orders", [0, 2]), ("pay", [1])]
    assert (v.txn_start_timestamp_ms, v.txn_last_update_timestamp_ms) == (1000, 1500)


def test_batch_is_a_plain_record_batch_keyed_by_transactional_id():
    batch = txn_log.encode_batch("my-tid", transit(), 1234)
    h = records.verify_crc(batch)
    assert h.producer_id == -1 and not h.is_transactional and not h.is_control
    [rec] = records.decode_records(batch)
    assert rec.key == b"my-tid" and rec.timestamp == 1234
    assert txn_log.decode_value(rec.value) == transit()


def test_tombstone_has_null_value():
    [rec] = records.decode_records(txn_log.encode_batch("t", None, 1))
    assert rec.value is None
    [rec] = records.decode_records(txn_log.encode_batch("t", transit(S.DEAD, partitions=frozenset()), 1))
    assert rec.value is None


def _log(*items):
    buf = bytearray()
    for offset, (tid, t) in enumerate(items):
        b = bytearray(txn_log.encode_batch(tid, t, 1))
        records.set_base_offset(b, offset)
        buf += b
    return bytes(buf)


def test_decode_fetched_reports_next_offset_and_skips_partial_batch():
    buf = _log(("a", transit()), ("b", transit()))
    entries, nxt = txn_log.decode_fetched(buf + buf[:20])
    assert [(e.offset, e.transactional_id) for e in entries] == [(0, "a"), (1, "b")] and nxt == 2
    assert txn_log.decode_fetched(b"") == ([], None)


def test_decode_rejects_corrupt_batch():
    buf = bytearray(_log(("a", transit())))
    buf[-1] ^= 0xFF
    with pytest.raises(CorruptTxnLogError):
        txn_log.decode_fetched(bytes(buf))


def test_decode_rejects_undecodable_value():
    batch = records.encode_batch([(b"t", b"\xff\xff\xff", (), 1)])
    with pytest.raises(CorruptTxnLogError):
        txn_log.decode_fetched(batch)


def test_rebuild_last_record_wins():
    entries = [TxnLogEntry(0, "a", transit(S.EMPTY, epoch=0, partitions=frozenset(), start=-1)),
               TxnLogEntry(1, "b", transit(S.EMPTY, pid=9, epoch=0, partitions=frozenset(), start=-1)),
               TxnLogEntry(2, "a", transit(S.ONGOING, epoch=0)),
               TxnLogEntry(3, "a", transit(S.PREPARE_COMMIT, epoch=0))]
    cache = replayed(entries).txns
    assert set(cache) == {"a", "b"}
    a = cache["a"]
    assert (a.state, a.producer_epoch, a.pending_state) == (S.PREPARE_COMMIT, 0, None)
    assert a.partitions == {("orders", 0), ("orders", 2), ("pay", 1)}


def test_rebuild_tombstone_removes_and_id_can_return():
    entries = [TxnLogEntry(0, "a", transit(S.COMPLETE_COMMIT, partitions=frozenset())),
               TxnLogEntry(1, "a", None)]
    assert replayed(entries).txns == {}
    entries.append(TxnLogEntry(2, "a", transit(S.EMPTY, pid=50, epoch=0, partitions=frozenset())))
    assert replayed(entries).txns["a"].producer_id == 50


def test_rebuild_lets_the_last_record_win_when_an_epoch_goes_backwards():
    """An ambiguous append (PrepareAbort at epoch 6 by a timeout abort) landed although
    the coordinator went on at epoch 5, where the producer committed: the log's last
    record is the state (Kafka's loader), not a corrupt partition."""
    entries = [TxnLogEntry(0, "a", transit(S.ONGOING, epoch=5)),
               TxnLogEntry(1, "a", transit(S.PREPARE_ABORT, epoch=6)),
               TxnLogEntry(2, "a", transit(S.PREPARE_COMMIT, epoch=5)),
               TxnLogEntry(3, "a", transit(S.COMPLETE_COMMIT, epoch=5, partitions=frozenset()))]
    md = replayed(entries).txns["a"]
    assert (md.state, md.producer_epoch) == (S.COMPLETE_COMMIT, 5)


def test_rebuild_allows_new_pid_with_lower_epoch():
    entries = [TxnLogEntry(0, "a", transit(S.EMPTY, epoch=32766, partitions=frozenset())),
               TxnLogEntry(1, "a", transit(S.EMPTY, pid=8, epoch=0, partitions=frozenset()))]
    assert replayed(entries).txns["a"].producer_id == 8
