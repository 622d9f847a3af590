"""The transaction coordinator under feature levels (services.common.cluster.features;
docs/operating/upgrades.md): below metadata.version 2 it writes only what versions
before feature levels read (InitProducerId with keep_prepared_txn keeps the prepared
transaction under its own pair, nothing appended); from 2 on it writes value version 1
and a feature-level record per partition; a record of a newer version, or a level above
the ones it supports, makes a partition unreadable instead of being read as something
else -- and a version that knows no feature-level record refuses it as a value of an
unknown version."""
from __future__ import annotations

import pytest
from txn_coordinator_fakes import FakeLog, Harness, run, replayed

from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import txn_log_pb2
from services.common.cluster import features
from services.txn_coordinator import txn_log
from services.txn_coordinator.state import TxnState, TxnTransitMetadata

E = ErrorCode
PARTS = (("orders", 0), ("payments", 1))


def _transit(**changes) -> TxnTransitMetadata:
    base = dict(producer_id=7, last_producer_id=-1, producer_epoch=3, last_producer_epoch=-1, txn_timeout_ms=60000,
                state=TxnState.ONGOING, partitions=frozenset(PARTS), txn_start_timestamp=1000,
                txn_last_update_timestamp=1000, prepared_timestamp=1500, transaction_version=2)
    return TxnTransitMetadata(**{**base, **changes})


def test_values_carry_version_1_only_with_a_kept_transaction():
    plain = txn_log_pb2.TransactionLogValue.FromString(txn_log.encode_value(_transit()))
    assert plain.version == 0 and not plain.HasField("ongoing_txn_producer_id")
    kept = _transit(producer_epoch=4, ongoing_txn_producer_id=7, ongoing_txn_producer_epoch=3)
    value = txn_log_pb2.TransactionLogValue.FromString(txn_log.encode_value(kept))
    assert value.version == txn_log.KEPT_TXN_VALUE_VERSION == 1
    assert txn_log.decode_value(txn_log.encode_value(kept)) == kept


def test_a_value_of_a_newer_version_is_refused_naming_it():
    data = txn_log_pb2.TransactionLogValue(version=2, producer_id=7, state=int(TxnState.EMPTY)).SerializeToString()
    with pytest.raises(txn_log.NewerTxnLogError, match=r"offset 12: txn-log-value version 2 is not one this "
                                                        r"version of Exactly reads \(0, 1\)"):
        txn_log.decode_value(data, 12)


def _batch(key: bytes, value: bytes | None) -> bytes:
    return records.encode_batch([(key, value, (), 0)], base_sequence=records.NO_SEQUENCE)


def test_the_feature_level_record_round_trips_and_a_higher_level_is_refused():
    entries, _ = txn_log.decode_fetched(txn_log.encode_feature_level_batch(2, 0))
    assert entries == [txn_log.FeatureLevelEntry(0, 2)] and replayed(entries).recorded_level == 2
    assert replayed([]).recorded_level == features.BASELINE_LEVEL
    above = txn_log_pb2.FeatureLevelValue(metadata_version=features.MAX_LEVEL + 1).SerializeToString()
    with pytest.raises(txn_log.NewerTxnLogError, match=f"records metadata.version {features.MAX_LEVEL + 1}"):
        txn_log.decode_fetched(_batch(txn_log.FEATURES_KEY, above))


def test_a_record_type_of_a_newer_version_is_never_taken_for_a_transactional_id():
    with pytest.raises(txn_log.NewerTxnLogError, match="a record type this version of Exactly does not read"):
        txn_log.decode_fetched(_batch(b"\0newer\0kind", b"\x08\x01"))


def test_a_version_without_feature_levels_refuses_the_feature_level_record():
    """What a transaction coordinator of the versions before feature levels does with
    the record: it takes the key for a transactional.id and parses the value as a
    TransactionLogValue, whose version it requires to be 0 -- the record's field 1 is
    the level, so it refuses the partition ("unknown transaction log value version 2")."""
    batch = txn_log.encode_feature_level_batch(2, 0)
    rec = next(iter(records.decode_records(batch, 0, records.parse_header(batch, 0))))
    as_old = txn_log_pb2.TransactionLogValue.FromString(rec.value)
    assert as_old.version == 2 != txn_log.VALUE_VERSION
    assert TxnState(as_old.state) is TxnState.EMPTY  # it parses: only the version check refuses it


def test_below_level_2_keep_prepared_keeps_the_pair_and_appends_nothing():
    async def scenario():
        h = Harness()
        h.topology.level = 1
        await h.elect()
        pid, epoch = await h.begin("t", partitions=PARTS)
        assert await h.coord.prepare_txn("t", pid, epoch) == E.NONE
        before = len(h.log.all_entries())
        r = await h.coord.init_producer_id("t", 60000, keep_prepared_txn=True)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, pid, epoch)
        assert (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch) == (pid, epoch)
        assert len(h.log.all_entries()) == before  # nothing written
        assert all(txn_log_pb2.TransactionLogValue.FromString(txn_log.encode_value(e.transit)).version == 0
                   for e in h.log.entries() if e.transit is not None)
        end = await h.coord.end_txn("t", pid, epoch, True)  # completed as the versions before did
        assert end.error == E.NONE
        await h.settle()
        assert h.md("t").state is TxnState.COMPLETE_COMMIT
        assert not [e for e in h.log.all_entries() if isinstance(e, txn_log.FeatureLevelEntry)]
    run(scenario())


def test_raising_the_level_records_it_once_per_partition_and_a_reload_reads_it():
    async def scenario():
        log = FakeLog()
        h = Harness(log=log, txn_partitions=2)
        h.topology.level = 1
        await h.elect(0)
        await h.elect(1)
        assert await h.coord.scans.record_feature_levels() == 0
        h.topology.level = 2
        assert await h.coord.scans.record_feature_levels() == 2
        assert await h.coord.scans.record_feature_levels() == 0  # recorded already
        assert [e.metadata_version for e in log.all_entries(0) if isinstance(e, txn_log.FeatureLevelEntry)] == [2]
        again = Harness(log=log, txn_partitions=2)  # another owner loads the partitions
        await again.elect(0, coordinator_epoch=2)
        await again.settle()
        assert again.coord.partitions.get(0).recorded_level == 2
        assert [e for e in log.all_entries(0) if isinstance(e, txn_log.FeatureLevelEntry)] == \
            [txn_log.FeatureLevelEntry(0, 2)]  # not written again
    run(scenario())


def test_a_partition_with_a_record_of_a_newer_version_is_not_served():
    async def scenario():
        log = FakeLog()
        newer = txn_log_pb2.TransactionLogValue(version=5, producer_id=3, state=int(TxnState.EMPTY))
        log.batches[0] = [_batch(b"t", newer.SerializeToString())]
        log.next_offset[0] = 1
        h = Harness(log=log)
        await h.elect()
        part = h.coord.partitions.get(0)
        assert part.error and "txn-log-value version 5" in part.error and not part.serving
        r = await h.coord.init_producer_id("t", 60000)
        assert r.error == E.NOT_COORDINATOR
    run(scenario())
