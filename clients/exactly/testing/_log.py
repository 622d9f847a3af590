"""The log of one partition of `exactly.testing.MockCluster`: the partition leader's
producer state (`services.partition_leader.producer_state`) over a list of record batches,
with the aborted-transaction entries read_committed fetches list
(`services.partition_leader.log.AbortedTxn`)."""
from __future__ import annotations

import bisect

from exactly_wire import records
from exactly_wire.clock import wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from services.partition_leader.log import AbortedTxn
from services.partition_leader.producer_state import ProducerStateManager


class PartitionLog:
    """One partition's log: whole record batches (offsets assigned), its producer state
    and aborted-transaction index, and the node that leads it; one replica, so the high
    watermark is the log end."""

    def __init__(self, topic: str, leader: str):
        self.leader = leader  # the node id of the partition's leader
        self.batches: list[bytes] = []
        self.starts: list[int] = []  # base offset of each batch, for bisect
        self.log_end = 0
        self.producers = ProducerStateManager(internal=topic.startswith("__"))
        self.aborted: list[AbortedTxn] = []

    def last_stable_offset(self) -> int:
        first = self.producers.first_unstable_offset_at(self.log_end)
        return self.log_end if first is None else min(first, self.log_end)

    def _add(self, batch: bytearray, base: int) -> records.BatchHeader:
        records.set_base_offset(batch, base)
        header = records.parse_header(batch)
        self.batches.append(bytes(batch))
        self.starts.append(base)
        self.log_end = header.last_offset + 1
        return header

    def append(self, batch: bytes) -> tuple[ErrorCode, int, str]:
        """A client's batch: (error, base offset, message), checked by the producer state."""
        try:
            header = records.verify_crc(batch)
            problem = records.validate_records(batch, header)
        except records.CorruptRecordError as exc:
            return ErrorCode.CORRUPT_MESSAGE, -1, str(exc)
        if problem is not None or header.is_control:
            return ErrorCode.CORRUPT_MESSAGE if problem else ErrorCode.INVALID_REQUEST, -1, problem or "a control batch"
        if header.producer_id >= 0:
            check = self.producers.check_append(header)
            if check.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                return check.error, check.duplicate.first_offset, check.message
            if check.error != ErrorCode.NONE:
                return check.error, -1, check.message
        written = self._add(bytearray(batch), self.log_end)
        if written.producer_id >= 0:
            self.producers.on_append(written)
        return ErrorCode.NONE, written.base_offset, ""

    def write_marker(self, producer_id: int, producer_epoch: int, committed: bool,
                     transaction_version: int) -> ErrorCode:
        """A COMMIT or ABORT marker of the producer's transaction."""
        check = self.producers.check_marker(producer_id, producer_epoch, 0, transaction_version)
        if check.error != ErrorCode.NONE:
            return check.error
        offset, now = self.log_end, wall_clock_ms()
        if not committed:
            self.aborted.append(AbortedTxn(producer_id, self.producers.txn_first_offset(producer_id, offset), offset,
                                           self.producers.lso_excluding(producer_id, offset + 1)))
        self._add(bytearray(records.encode_control_batch(committed, producer_id, producer_epoch, 0, now)), offset)
        self.producers.complete_marker(producer_id, producer_epoch, 0, offset, now, committed)
        return ErrorCode.NONE

    def read(self, offset: int, max_bytes: int, read_committed: bool) -> tuple[bytes, list[AbortedTxn]]:
        """Whole batches from the one holding `offset` up to the high watermark (the
        last stable offset under read_committed), at least one, about `max_bytes`; with
        the aborted transactions they overlap under read_committed."""
        bound = self.last_stable_offset() if read_committed else self.log_end
        out, size = [], 0
        for i in range(max(bisect.bisect_right(self.starts, offset) - 1, 0), len(self.batches)):
            if self.starts[i] >= bound or (out and size + len(self.batches[i]) > max_bytes):
                break
            out.append(self.batches[i])
            size += len(self.batches[i])
        aborted = [a for a in self.aborted if a.last_offset >= offset and a.first_offset < bound] \
            if read_committed else []
        return b"".join(out), aborted

    def headers(self) -> list[records.BatchHeader]:
        """The header of every batch, data and control, with its offsets."""
        return [records.parse_header(b) for b in self.batches]

    def offset_for_time(self, timestamp: int) -> tuple[int, int]:
        """(offset, timestamp ms) of the first record whose timestamp is `timestamp` ms
        or later, as ListOffsets by time answers; (-1, -1) when there is none."""
        for batch, header in zip(self.batches, self.headers()):
            if header.is_control or header.max_timestamp < timestamp:
                continue
            for r in records.decode_records(batch, 0, header):
                if r.timestamp >= timestamp:
                    return r.offset, r.timestamp
        return -1, -1


__all__ = ["PartitionLog"]
