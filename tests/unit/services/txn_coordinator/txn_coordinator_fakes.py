"""In-memory stand-ins for the transaction log, the partition leaders' WriteTxnMarkers
and the cluster topology, to drive the coordinator without gRPC or ZooKeeper."""
from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from exactly.testing import MockTime
from exactly_wire import records
from exactly_wire.error_codes import ErrorCode
from services.common.cluster.state import NodeInfo
from services.txn_coordinator import txn_log
from services.txn_coordinator.adapters import ClusterTxnLog
from services.common.settings import TxnCoordinatorSchema, role_settings
from services.txn_coordinator.coordinator import TransactionCoordinator
from services.txn_coordinator.ports import TxnLogFetch, TxnMarker
from services.txn_coordinator.partition import TxnPartition
from services.txn_coordinator.pid_manager import ProducerIdManager
from services.txn_coordinator.state import TxnState, TxnTransitMetadata


NOW_MS = 1_700_000_000_000  # the clocks' first reading


# The completion's wait for a back-to-back producer's next add (exactly.txn.handover.wait.ms)
# is off in the harness unless a test sets it: the harness's default sleep only yields and
# its clock moves only when a test moves it, so that wait would end only with an add.
HARNESS_DEFAULTS: dict[str, object] = {"exactly.txn.handover.wait.ms": 0}


def txn_settings(conf: dict[str, object]) -> TxnCoordinatorSchema:
    """The transaction coordinator's settings with the Kafka keys of `conf` set (the
    schema's defaults elsewhere, but HARNESS_DEFAULTS). Raises ConfigurationError for
    an unknown key."""
    return role_settings(TxnCoordinatorSchema, {**HARNESS_DEFAULTS, **conf})


def sleep_on(clock: MockTime) -> Callable[[float], Awaitable[None]]:
    """A coordinator's sleep (seconds) on `clock`: a retry backoff (up to
    exactly.txn.retry.backoff.max.ms) only yields, a longer sleep returns once the test
    moved `clock` past its end (`clock.sleeping` is set while it waits)."""
    backoff_max_s = TxnCoordinatorSchema().txn_retry_backoff_max_ms / 1000

    async def sleep(seconds: float) -> None:
        if seconds <= backoff_max_s:
            await asyncio.sleep(0)
            return
        await clock.wait_async(seconds)

    return sleep


async def fast_sleep(_seconds: float) -> None:
    await asyncio.sleep(0)


class FakeLog:
    """`__transaction_state` partitions as lists of batches with assigned offsets."""

    def __init__(self):
        self.batches: dict[int, list[bytes]] = {}
        self.next_offset: dict[int, int] = {}
        self.append_errors: list[int] = []  # consumed one per append
        # consumed one per append after append_errors: the batch is written, then this
        # error is answered (an ambiguous outcome, e.g. NOT_ENOUGH_REPLICAS_AFTER_APPEND)
        self.errors_after_write: list[int] = []
        self.append_gate: asyncio.Event | None = None  # when set, appends wait for it
        self.fetch_gate: asyncio.Event | None = None
        self.fetch_errors: list[int] = []

    async def append(self, partition: int, batch: bytes) -> int:
        if self.append_gate is not None:
            await self.append_gate.wait()
        if self.append_errors:
            return self.append_errors.pop(0)
        self.write(partition, batch)
        if self.errors_after_write:
            return self.errors_after_write.pop(0)
        return ErrorCode.NONE

    def write(self, partition: int, batch: bytes) -> None:
        buf = bytearray(batch)
        offset = self.next_offset.get(partition, 0)
        records.set_base_offset(buf, offset)
        self.batches.setdefault(partition, []).append(bytes(buf))
        self.next_offset[partition] = records.parse_header(buf).last_offset + 1

    async def fetch(self, partition: int, offset: int, max_bytes: int) -> TxnLogFetch:
        if self.fetch_gate is not None:
            await self.fetch_gate.wait()
        if self.fetch_errors:
            return TxnLogFetch(self.fetch_errors.pop(0))
        out = bytearray()
        for b in self.batches.get(partition, []):
            h = records.parse_header(b)
            if h.last_offset < offset:
                continue
            if out and len(out) + len(b) > max_bytes:
                break
            out += b
        return TxnLogFetch(ErrorCode.NONE, bytes(out), self.next_offset.get(partition, 0), 0)

    def entries(self, partition: int = 0) -> list[txn_log.TxnLogEntry]:
        """The records of the partition, without its feature-level records."""
        return [e for e in self.all_entries(partition) if not isinstance(e, txn_log.FeatureLevelEntry)]

    def all_entries(self, partition: int = 0) -> list:
        """Every record of the partition, decoded (txn_log.decode_fetched)."""
        entries, _ = txn_log.decode_fetched(b"".join(self.batches.get(partition, [])))
        return entries

    def states(self, transactional_id: str, partition: int = 0) -> list[TxnState | None]:
        return [e.transit.state if e.transit else None for e in self.entries(partition)
                if e.transactional_id == transactional_id]


class GroupCommitLog(FakeLog):
    """A FakeLog behind the coordinator's group commit (adapters.ClusterTxnLog): an
    append joins the queue of the partition leader, and its record is written when
    the request carrying it goes out, whatever became of the caller meanwhile.
    `request_gate`, when not None, holds each request until set; `requested` is set
    when a request waits at it, `answered` once such a request's records are
    written."""

    LEADER = NodeInfo("pl-0", "partition_leader", "127.0.0.1", 1)

    def __init__(self):
        super().__init__()
        self.cluster = self  # the ClusterClient's ClusterState
        self.request_gate: asyncio.Event | None = None
        self.requested = asyncio.Event()
        self.answered = asyncio.Event()
        self._queue = ClusterTxnLog(self)

    def leader_of(self, topic: str, partition: int) -> NodeInfo:
        return self.LEADER

    async def produce_to(self, node, topic, entries, acks, timeout_ms) -> list[int]:
        gated = self.request_gate is not None
        if gated:
            self.requested.set()
            await self.request_gate.wait()
        codes = [await FakeLog.append(self, partition, batch) for partition, batch in entries]
        if gated:
            self.answered.set()
        return codes

    async def append(self, partition: int, batch: bytes) -> int:
        return await self._queue.append(partition, batch)


class FakeMarkers:
    """Records every marker attempt; `fail[(topic, p)]` = list of error codes answered
    before success; `errors[(topic, p)]` = code answered forever."""

    def __init__(self):
        self.attempts: list[TxnMarker] = []
        self.written: list[tuple[TxnMarker, tuple[str, int]]] = []
        self.fail: dict[tuple[str, int], list[int]] = {}
        self.errors: dict[tuple[str, int], int] = {}
        self.gate: asyncio.Event | None = None
        self.held = asyncio.Event()  # set once a write waits at the gate
        self.added: list[tuple] = []  # partitions_added calls

    async def write(self, marker: TxnMarker) -> dict[tuple[str, int], int]:
        if self.gate is not None:
            self.held.set()
            await self.gate.wait()
        self.attempts.append(marker)
        out = {}
        for tp in marker.partitions:
            if tp in self.errors:
                out[tp] = self.errors[tp]
            elif self.fail.get(tp):
                out[tp] = self.fail[tp].pop(0)
            else:
                out[tp] = ErrorCode.NONE
                self.written.append((marker, tp))
        return out

    def partitions_added(self, transactional_id, producer_id, producer_epoch, coordinator_epoch, partitions):
        self.added.append((transactional_id, producer_id, producer_epoch, coordinator_epoch, frozenset(partitions)))

    def written_for(self, producer_id: int) -> list[tuple[TxnMarker, tuple[str, int]]]:
        return [(m, tp) for m, tp in self.written if m.producer_id == producer_id]


@dataclass
class FakeTopology:
    txn_partitions: int = 1
    offsets_partitions: int = 4
    topics: dict[str, int] = field(default_factory=lambda: {"orders": 3, "payments": 2})
    level: int = 2  # the finalized metadata.version (a new cluster's: the newest)

    def txn_partition_for(self, transactional_id: str) -> int:
        if self.txn_partitions <= 0:
            return -1
        return zlib.crc32(transactional_id.encode()) % self.txn_partitions

    def offsets_partition_for(self, group_id: str) -> int:
        return zlib.crc32(group_id.encode()) % self.offsets_partitions

    def txn_partition_count(self) -> int:
        return max(self.txn_partitions, 0)

    def metadata_version(self) -> int:
        return self.level

    def partition_exists(self, topic: str, partition: int) -> bool:
        if topic == "__consumer_offsets":
            return 0 <= partition < self.offsets_partitions
        return 0 <= partition < self.topics.get(topic, 0)


class Harness:
    """A coordinator over the fakes. PIDs come from blocks of `block_size`; `sleep`
    is the coordinator's (seconds; by default it only yields to the loop). `clock` is
    both its wall and its monotonic clock, unless split_clocks: then `wall` is a clock
    of its own (stepped by hand) and `clock` the monotonic one. clock_sleep: the
    coordinator sleeps on `clock` (sleep_on) instead of `sleep`. The clocks are
    exactly.testing.MockTime from 1_700_000_000_000 ms."""

    def __init__(self, config: TxnCoordinatorSchema | None = None, txn_partitions: int = 1, block_size: int = 1000,
                 log: FakeLog | None = None, first_pid: int = 0, on_fenced=None, sleep=fast_sleep,
                 bind_producer_ids: bool = False, split_clocks: bool = False, clock_sleep: bool = False):
        self.clock = MockTime(NOW_MS)
        if clock_sleep:
            sleep = sleep_on(self.clock)
        self.wall = MockTime(NOW_MS) if split_clocks else self.clock
        self.log = log or FakeLog()
        self.markers = FakeMarkers()
        self.topology = FakeTopology(txn_partitions=txn_partitions)
        self.block_size = block_size
        self.next_block = first_pid
        self.blocks: list[tuple[int, int]] = []
        self.pids = ProducerIdManager(self._allocate)
        self.coord = TransactionCoordinator.build(self.log, self.markers, self.topology, self.pids,
                                                  config or txn_settings({}),
                                                  clock=self.wall, sleep=sleep, on_fenced=on_fenced,
                                                  bind_producer_ids=bind_producer_ids, monotonic=self.clock)

    async def _allocate(self) -> tuple[int, int]:
        block = (self.next_block, self.next_block + self.block_size - 1)
        self.next_block += self.block_size
        self.blocks.append(block)
        return block

    async def elect(self, partition: int = 0, coordinator_epoch: int = 1) -> None:
        await self.coord.on_elected(partition, coordinator_epoch)
        await self.coord.wait_loaded(partition)

    async def settle(self) -> None:
        """Run background work (markers, completions, and appends whose outcome is
        still to be applied) until nothing is left."""
        for _ in range(1000):
            pending = [t for part in self.coord.partitions.values() for t in part.tasks if not t.done()]
            pending += [t for t in self.coord.partitions.tasks()
                        if t.get_name().startswith("txn-append") and not t.done()]
            if not pending:
                return
            await asyncio.wait(pending, timeout=0.5)
        raise AssertionError("background tasks never settled")

    def md(self, transactional_id: str, partition: int = 0):
        return self.coord.partitions.get(partition).txns.get(transactional_id)

    async def begin(self, tid: str, partitions=(("orders", 0),), timeout_ms: int = 60000):
        """InitProducerId + AddPartitionsToTxn; returns (pid, epoch)."""
        r = await self.coord.init_producer_id(tid, timeout_ms)
        assert r.error == ErrorCode.NONE, r
        res = await self.coord.add_partitions_to_txn(tid, r.producer_id, r.producer_epoch, partitions)
        assert set(res.values()) == {ErrorCode.NONE}, res
        return r.producer_id, r.producer_epoch


def write_record(log: FakeLog, tid: str, state: TxnState, pid: int = 42, epoch: int = 3,
                 partitions=frozenset({("orders", 0), ("payments", 1)}), start: int = 100, timeout_ms: int = 60000,
                 partition: int = 0, last_update: int = 200) -> None:
    """Write a transaction record of `tid` in `state` straight to `log` (as a previous
    owner left it); the partitions only for a transaction in progress."""
    log.write(partition, txn_log.encode_batch(tid, TxnTransitMetadata(
        pid, -1, epoch, -1, timeout_ms, state, partitions if state in (TxnState.ONGOING, TxnState.PREPARE_COMMIT,
                                                                          TxnState.PREPARE_ABORT)
        else frozenset(), start, last_update), last_update))


def replayed(entries, used_at_ms: int = 0) -> TxnPartition:
    """A fresh partition cache with `entries` (records read back from the log, in
    order) replayed into it, as a load does (TxnPartition.replay)."""
    part = TxnPartition(0, 0)
    for entry in entries:
        part.replay(entry, used_at_ms)
    return part


def run(coro):
    return asyncio.run(coro)
