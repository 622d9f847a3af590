"""The coordinator's view of one `CONSUMER_OFFSETS_TOPIC` partition, built by applying
the partition's record batches in log order. Pure (no I/O).

KIP-98 design document, "Consumer Coordinator Startup": transactional offset
commits are held per PID until a control batch of that PID: COMMIT puts them in
the cache, ABORT forgets them. The same `apply_batch` serves the initial load
(replay from offset 0 to the high watermark) and the live tail, so the state
after a restart equals the state before it.
"""
from __future__ import annotations

import logging
from typing import Callable

from exactly_wire import records
from services.common.settings import GroupCoordinatorSchema
from services.common.protocol import CONSUMER_OFFSETS_TOPIC

from . import log_format
from .group import GroupMetadata, default_member_id
from .offsets import OffsetStore

log = logging.getLogger(__name__)


class OffsetsPartitionState:
    """Groups and offsets of one `CONSUMER_OFFSETS_TOPIC` partition.

    `next_offset` is the log offset after the last applied batch. Group metadata
    records rebuild groups while loading; once the partition is live the
    in-memory groups are ahead of their own records, so a record only replaces
    a group that is unknown or has a lower generation.
    """

    def __init__(self, partition: int, config: GroupCoordinatorSchema | None = None,
                 new_member_id: Callable[[str], str] = default_member_id):
        self.partition = partition
        self.config = config or GroupCoordinatorSchema()
        self._new_member_id = new_member_id
        self.groups: dict[str, GroupMetadata] = {}
        self.offsets = OffsetStore()
        self.next_offset = 0
        self.corrupt_batches: list[tuple[int, int]] = []

    def apply_batch(self, buf: bytes | memoryview, pos: int, header: records.BatchHeader,
                    now_ms: int, loading: bool) -> None:
        """Apply the batch at `pos` of `buf` (its header already parsed) and move
        `next_offset` past it. Batches wholly below next_offset are skipped.
        Raises records.CorruptRecordError on undecodable records."""
        if header.last_offset < self.next_offset:
            return
        recs = records.decode_records(buf, pos, header)
        if header.is_control:
            for rec in recs:
                ctype, _coordinator_epoch = records.decode_control_record(rec)
                if ctype in (records.CONTROL_COMMIT, records.CONTROL_ABORT):
                    self.offsets.complete_txn(header.producer_id, ctype == records.CONTROL_COMMIT)
        else:
            for rec in recs:
                if rec.offset < self.next_offset:
                    continue
                self._apply_record(rec, header, now_ms, loading)
        self.next_offset = header.last_offset + 1

    def _apply_record(self, rec: records.Record, header: records.BatchHeader, now_ms: int,
                      loading: bool) -> None:
        key = log_format.decode_key(rec.key)
        if isinstance(key, log_format.OffsetKey):
            value = log_format.decode_offset_value(rec.value)
            if header.is_transactional:
                if value is not None:
                    self.offsets.apply_txn_commit(header.producer_id, key.group, key.tp, value,
                                                  rec.offset)
            else:
                self.offsets.apply_commit(key.group, key.tp, value, rec.offset)
        elif isinstance(key, log_format.GroupKey) and not header.is_transactional:
            snap = log_format.decode_group_value(key.group, rec.value)
            current = self.groups.get(key.group)
            if snap is None:
                if loading:
                    self.groups.pop(key.group, None)
                return
            # Generations never go back: a record with a lower generation (an older
            # store that lost a race) never replaces a newer group.
            if current is None or snap.generation > current.generation or \
                    (loading and snap.generation == current.generation):
                self.groups[key.group] = GroupMetadata.from_snapshot(
                    snap, now_ms, self.config, self._new_member_id)

    def apply_all(self, buf: bytes | memoryview, now_ms: int, loading: bool) -> int:
        """Apply every whole batch in `buf` (Fetch records, CRCs checked); returns
        how many. A corrupt batch is logged and skipped so one bad batch does not
        stop the partition from loading; its offsets are remembered in
        `corrupt_batches`."""
        n = 0
        pos = 0
        while len(buf) - pos >= records.HEADER_SIZE:
            try:
                header = records.parse_header(buf, pos)
            except records.CorruptRecordError as exc:
                log.error(f"{CONSUMER_OFFSETS_TOPIC}-%d: unreadable batch header (%s); stopping this fetch",
                          self.partition, exc)
                return n
            if pos + header.size > len(buf):
                return n  # a partial batch cut by the fetch size limit
            try:
                records.verify_crc(buf, pos, header)
                self.apply_batch(buf, pos, header, now_ms, loading)
            except records.CorruptRecordError as exc:
                log.error(f"{CONSUMER_OFFSETS_TOPIC}-%d: skipping corrupt batch at offsets %d..%d: %s",
                          self.partition, header.base_offset, header.last_offset, exc)
                self.corrupt_batches.append((header.base_offset, header.last_offset))
                self.next_offset = max(self.next_offset, header.last_offset + 1)
            pos += header.size
            n += 1
        return n
