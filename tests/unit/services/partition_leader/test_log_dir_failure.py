"""KIP-112 log-directory failure in the replica manager: the first I/O error of a
write takes the directory offline for the process; produce, fetch and replica fetch
answer KAFKA_STORAGE_ERROR, no lease is valid, followers stop, nothing more is written
(snapshots, checkpoints, ISR changes, close), and the failure is reported once."""
from __future__ import annotations

import asyncio
import errno
import math

from exactly_wire.error_codes import ErrorCode
from exactly.testing import MockTime
from services.common.cluster.state import PartitionState
from services.partition_leader.replica_manager import FetchEntry, ProduceEntry

from .conftest import make_batch, append_records
from .test_leases_and_isr_writes import FakeZk, manager_for

TP = ("r", 0)


def test_an_io_error_on_append_takes_the_log_dir_offline(tmp_path, store, clock, monkeypatch):
    now = MockTime(10_000)  # 10 s
    zk = FakeZk(PartitionState("me", 2, ("me", "x", "y"), version=4, mzxid=100))
    m = manager_for(zk, tmp_path, store, clock, now)
    reported: list[OSError] = []
    m.hosted.on_log_dir_failure = reported.append
    m.hosted.refresh()
    p = m.hosted.replicas[TP]
    p.lease_until = math.inf

    async def produce():
        return (await append_records(m, 1, [ProduceEntry("r", 0, make_batch(2))], timeout_ms=1000))[0]

    ok = asyncio.run(produce())
    assert ok.error == ErrorCode.NONE and not m.hosted.log_dir_offline
    end = p.log_end_offset

    def eio(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(p.log, "append", eio)
    failed = asyncio.run(produce())
    assert failed.error == ErrorCode.KAFKA_STORAGE_ERROR
    assert m.hosted.log_dir_offline and len(reported) == 1 and reported[0].errno == errno.EIO
    monkeypatch.undo()
    # Offline for good: every request answers KAFKA_STORAGE_ERROR, nothing is appended.
    assert asyncio.run(produce()).error == ErrorCode.KAFKA_STORAGE_ERROR
    assert p.log_end_offset == end
    assert m.hosted.get("r", 0) == (None, ErrorCode.KAFKA_STORAGE_ERROR)
    assert m.hosted.get("nope", 0)[1] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert m.fetch_for_follower("r", 0, "x", 0, 1000).error == ErrorCode.KAFKA_STORAGE_ERROR
    fetched = asyncio.run(m.fetch_messages([FetchEntry("r", 0, 0, 1000)]))
    assert fetched[0].error == ErrorCode.KAFKA_STORAGE_ERROR
    assert not m.hosted.lease_valid(p) and m.hosted.partitions == {} and m.hosted.follower_targets() == {}
    assert m.hosted.desired_isr(TP) is None and m.hosted.maybe_snapshot_all() == 0 and m.hosted.high_watermarks_to_checkpoint() == []
    assert m.hosted.refresh() == ([], [])
    m.hosted.fail_log_dir(OSError(errno.ENOSPC, "No space left on device"))
    assert len(reported) == 1
    m.hosted.close()  # writes nothing


def test_rocksdb_io_errors_become_oserror(store, monkeypatch):
    class FailingDb:
        def __setitem__(self, key, value):
            raise Exception("IO error: While appending to file: 000009.log: Input/output error")

        def __delitem__(self, key):
            raise Exception("Invalid argument: not an I/O error")

    monkeypatch.setattr(store, "_db", FailingDb())
    try:
        store.put("t", 0, 5, b"snapshot")
    except OSError as exc:
        assert exc.errno == errno.EIO and "Input/output error" in str(exc)
    else:
        raise AssertionError("no OSError")
    try:
        store.delete("t", 0, 5)
    except OSError:
        raise AssertionError("a non-I/O error became an OSError")
    except Exception as exc:  # noqa: BLE001 - the original error
        assert "Invalid argument" in str(exc)
