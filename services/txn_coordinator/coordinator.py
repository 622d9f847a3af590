"""The transaction coordinator: PIDs, epochs, the transaction state machine, two-phase
commit with transaction markers, timeouts and transactional.id expiration.

Follows the design doc sections "Transaction Coordinator", "Transaction Log",
"Transaction Coordinator Startup", "Transaction Coordinator Request Handling",
"Coordinator-side Transaction Expiration" and "Coordinator TransactionalId
Expiration", with Kafka's TransactionCoordinator.scala where the doc is silent
(KIP-360 epoch checks, PID rotation on epoch exhaustion, fencing epoch bump).

Pure asyncio, no gRPC: the transaction log, the markers and the cluster topology are
reached through the small ports of `ports.py` (`TxnLogStore`, `MarkerWriter`,
`Topology`), implemented over the cluster in `adapters.py` and by fakes in unit
tests. Every protocol outcome is an `ErrorCode` value; exceptions are bugs.

The coordinator is made of collaborators, each built with its dependencies and
usable alone, as Kafka's `TransactionCoordinator.apply` builds its state manager and
marker channel first (`TransactionCoordinator.build` here):

- the owned partitions and their lifecycle (services.common.cluster.owned.OwnedPartitions);
- `store.TxnStore`: the transaction metadata -- lookup, append, apply;
- `completion.Completions`: markers, the Complete record, the wait for the previous
  transaction, the handover and its resumption;
- `group_txn.GroupTxn`: the KIP-447 draft's hooks;
- `requests.TxnRequests`: the RPCs, each check -> prepare -> append;
- `scans.TxnScans`: timeouts, expirations, feature levels;
- `load.TxnLoader`: the replay of a newly owned partition and its roll forward.

This class wires them, runs the periodic scans and delegates its RPCs.

State changes follow prepare -> append to the log -> complete (state.py). All request
handling runs on one event loop; the checks and the prepare of a request happen
without an `await` in between, so a second request sees the pending transition and
gets CONCURRENT_TRANSACTIONS.

Commit/abort: EndTxn appends PrepareCommit/PrepareAbort (the synchronisation point),
then a background task writes the markers to the leader of every partition of the
transaction (WriteTxnMarkers, grouped by leader, with the coordinator epoch), retried
with backoff until each partition answered, then appends CompleteCommit/
CompleteAbort -- unless the producer's next transaction already asks for its first
partition: its Ongoing record then completes this transaction too (the handover,
`TransactionMetadata.prepare_next_transaction`). EndTxn answers NONE as soon as the
Prepare record is in the log; it waits up to `exactly.txn.end.completion.wait.ms` for the completion so that the
producer's next transaction does not start with CONCURRENT_TRANSACTIONS.
The offsets topic's partitions added by AddOffsetsToTxn get their marker the same
way, from the partition leader of that partition.

Settings: `services.common.settings.TxnCoordinatorSchema` (each key's default, range and doc).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Iterable

from exactly_wire.clock import Clock, monotonic_ms, wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from exactly_wire.types import TopicPartition
from services.common.cluster.owned import OwnedPartitions
from services.common.protocol import TRANSACTION_STATE_TOPIC
from services.common.settings import TxnCoordinatorSchema

from . import metrics
from .completion import Completions
from .group_txn import GroupTxn
from .load import TxnLoader
from .partition import TxnPartition
from .pid_manager import ProducerIdManager
from .ports import DescribeResult, EndTxnResult, InitProducerIdResult, MarkerWriter, Topology, TxnLogStore
from .requests import TxnRequests
from .scans import TxnScans
from .state import GroupAssignment, TxnStateSummary
from .store import TxnStore

log = logging.getLogger(__name__)


class TransactionCoordinator:
    """Handles the transaction coordinator RPCs for the transaction log partitions this
    process owns (`on_elected` / `on_resigned`), over its collaborators (see the module
    docstring), which it holds as public attributes: `partitions` (OwnedPartitions),
    `store`, `completions`, `groups`, `requests`, `scans`, `loader`. Build one with
    `TransactionCoordinator.build` from the ports; this constructor takes the parts
    built already (a test may build them one by one). pids: the producer-id blocks
    (closed by `stop`); config: the parsed settings (TxnCoordinatorSchema); sleep:
    async (seconds) -> None, between the periodic scans (injected in tests)."""

    def __init__(self, partitions: OwnedPartitions[TxnPartition], store: TxnStore, completions: Completions,
                 groups: GroupTxn, requests: TxnRequests, scans: TxnScans, loader: TxnLoader,
                 pids: ProducerIdManager, config: TxnCoordinatorSchema | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self.partitions = partitions
        self.store = store
        self.completions = completions
        self.groups = groups
        self.requests = requests
        self.scans = scans
        self.loader = loader
        self.config = config or TxnCoordinatorSchema()
        self._pids = pids
        self._sleep = sleep

    @classmethod
    def build(cls, log_store: TxnLogStore, markers: MarkerWriter, topology: Topology, pids: ProducerIdManager,
              config: TxnCoordinatorSchema | None = None, clock: Clock = wall_clock_ms,
              sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
              on_fenced: Callable[[int, int], None] | None = None, bind_producer_ids: bool = False,
              monotonic: Clock = monotonic_ms) -> TransactionCoordinator:
        """The coordinator over its ports, each part built with its dependencies.

        log_store, markers, topology: the ports (ports.py); pids: PID allocation;
        config: the parsed settings (services.common.settings.TxnCoordinatorSchema; its
        defaults when None); clock: wall-clock ms (timestamps written to the
        transaction log); monotonic: ms of a monotonic clock (every duration:
        transaction.timeout.ms, a prepared transaction's age, the expirations, the
        marker deadline; docs/design.md, "Clocks"); sleep: async (seconds) -> None
        (injected in tests); on_fenced(partition, coordinator_epoch): called (on the
        loop) when a newer owner of the partition exists (CoordinatorOwnership.fenced).
        bind_producer_ids (on with the authorizer): every producer id is issued bound
        to a principal, the binding written to partition producer id % n of the log
        first (docs/design.md, "Producer-id bindings")."""
        config = config or TxnCoordinatorSchema()
        loader: TxnLoader | None = None  # the owned partitions load through the loader, built last

        async def load(part: TxnPartition) -> None:
            await loader.load(part)

        partitions = OwnedPartitions(TRANSACTION_STATE_TOPIC, TxnPartition, load,
                                     lambda part, batch: log_store.append(part.partition, batch),
                                     dropped=lambda part: part.completions.clear(), wall_clock=clock, sleep=sleep,
                                     on_fenced=on_fenced, retry_backoff_ms=config.txn_retry_backoff_ms,
                                     retry_backoff_max_ms=config.txn_retry_backoff_max_ms)
        store = TxnStore(partitions, log_store, topology, clock, monotonic)
        completions = Completions(store, markers, topology, config, clock, monotonic, sleep)
        groups = GroupTxn(store, completions)
        requests = TxnRequests(store, completions, groups, pids, topology, config, clock, monotonic,
                               bind_producer_ids, markers)
        scans = TxnScans(store, completions, groups, topology, config, clock, monotonic)
        loader = TxnLoader(partitions, log_store, completions, scans.record_feature_level, config, clock, monotonic)
        return cls(partitions, store, completions, groups, requests, scans, loader, pids, config, sleep)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the periodic scans (timed-out transactions, expired ids, producer-id
        bindings with bind_producer_ids, feature levels)."""
        cfg, scans, spawn = self.config, self.scans, self.partitions.spawn
        spawn(None, self._every(cfg.abort_timed_out_interval_ms, scans.abort_timed_out_transactions),
              "txn-timeout-abort")
        spawn(None, self._every(cfg.remove_expired_interval_ms, scans.expire_transactional_ids), "txn-id-expiration")
        if self.requests.bind_producer_ids:
            spawn(None, self._every(cfg.producer_id_expiration_check_interval_ms, scans.expire_producer_id_bindings),
                  "pid-binding-expiration")
        spawn(None, self._every(cfg.abort_timed_out_interval_ms, scans.record_feature_levels), "txn-feature-levels")

    def metadata_version_changed(self) -> None:
        """The finalized metadata.version changed: record it in the owned partitions
        now (`TxnScans.record_feature_levels`) rather than at the next scan. On the loop."""
        self.partitions.spawn(None, self.scans.record_feature_levels(), "txn-feature-levels-now")

    async def stop(self) -> None:
        """Cancel the scans and the work of every owned partition."""
        await self.partitions.stop()
        await self._pids.close()

    async def _every(self, interval_ms: int, fn: Callable[[], Awaitable[int]]) -> None:
        while True:
            await self._sleep(max(interval_ms, 1) / 1000)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a scan bug must not stop later scans
                log.exception("periodic %s failed", getattr(fn, "__name__", fn))

    async def on_elected(self, partition: int, coordinator_epoch: int, producer_id: int = -1,
                         producer_epoch: int = -1, retired_producer_id: int = -1) -> None:
        """This process now owns transaction log partition `partition` with
        `coordinator_epoch`: requests for its ids get COORDINATOR_LOAD_IN_PROGRESS
        while it is replayed from offset 0 to the high watermark; then prepared
        transactions are rolled forward and their timeouts run again
        ("Transaction Coordinator Startup"). Writer identity and fencing as
        OwnedPartitions.on_elected."""
        await self.partitions.on_elected(partition, coordinator_epoch, producer_id, producer_epoch,
                                         retired_producer_id)

    async def on_resigned(self, partition: int) -> None:
        """Another coordinator owns `partition` now: forget its cache and stop its
        marker and completion work (requests get NOT_COORDINATOR)."""
        if await self.partitions.on_resigned(partition):
            metrics.TRANSACTIONAL_IDS.remove_partition(partition)
            metrics.PRODUCER_ID_BINDINGS.remove_partition(partition)

    def owned_partitions(self) -> dict[int, bool]:
        """partition -> True when it serves (False while loading or disabled)."""
        return self.partitions.owned_partitions()

    async def wait_loaded(self, partition: int | None = None, *, timeout_s: float | None = None) -> bool:
        """Wait until `partition` (every owned one when None) is loaded, at most
        `timeout_s` s; False on timeout (OwnedPartitions.wait_loaded)."""
        return await self.partitions.wait_loaded(partition, timeout_s=timeout_s)

    # ------------------------------------------------------------ the RPCs (requests.TxnRequests)
    async def init_producer_id(self, transactional_id: str | None, transaction_timeout_ms: int,
                               expected: tuple[int, int] | None = None, group: GroupAssignment | None = None,
                               principal: str = "", keep_prepared_txn: bool = False) -> InitProducerIdResult:
        """InitProducerId: see TxnRequests.init_producer_id."""
        return await self.requests.init_producer_id(transactional_id, transaction_timeout_ms, expected, group,
                                                    principal, keep_prepared_txn)

    def verify_producer_id(self, producer_id: int, principal: str, transactional_id: str,
                           transactional: bool) -> tuple[ErrorCode, str]:
        """VerifyProducerId: see TxnRequests.verify_producer_id."""
        return self.requests.verify_producer_id(producer_id, principal, transactional_id, transactional)

    async def add_partitions_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                    partitions: Iterable[TopicPartition], verify_only: bool = False,
                                    group_id: str = "", generation_id: int = -1) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn: see TxnRequests.add_partitions_to_txn."""
        return await self.requests.add_partitions_to_txn(transactional_id, producer_id, producer_epoch, partitions,
                                                         verify_only, group_id, generation_id)

    async def add_offsets_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                 group_id: str, consumer_group_id: str = "", generation_id: int = -1) -> ErrorCode:
        """AddOffsetsToTxn: see TxnRequests.add_offsets_to_txn."""
        return await self.requests.add_offsets_to_txn(transactional_id, producer_id, producer_epoch, group_id,
                                                      consumer_group_id, generation_id)

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool,
                      group_id: str = "", generation_id: int = -1, transaction_version: int = 2) -> EndTxnResult:
        """EndTxn: see TxnRequests.end_txn."""
        return await self.requests.end_txn(transactional_id, producer_id, producer_epoch, committed, group_id,
                                           generation_id, transaction_version)

    async def prepare_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          group_id: str = "", generation_id: int = -1) -> ErrorCode:
        """PrepareTxn: see TxnRequests.prepare_txn."""
        return await self.requests.prepare_txn(transactional_id, producer_id, producer_epoch, group_id,
                                               generation_id)

    def list_transactions(self, state_filters: Iterable[str] = (), producer_id_filters: Iterable[int] = (),
                          duration_filter_ms: int = 0) -> tuple[ErrorCode, list[TxnStateSummary]]:
        """ListTransactions: see TxnStore.list_transactions."""
        return self.store.list_transactions(state_filters, producer_id_filters, duration_filter_ms)

    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[DescribeResult]:
        """DescribeTransactions: see TxnStore.describe_transactions."""
        return self.store.describe_transactions(transactional_ids)

    # ------------------------------------------------------------ metrics
    def state_counts(self) -> dict[str, int]:
        """Kafka state name -> transactional ids in that state (TxnStore.state_counts)."""
        return self.store.state_counts()

    def prepared_count(self) -> int:
        """Prepared transactions waiting for their decision (TxnStore.prepared_count)."""
        return self.store.prepared_count()

    def oldest_prepared_age_ms(self) -> int:
        """Age (ms) of the oldest prepared transaction (TxnStore.oldest_prepared_age_ms)."""
        return self.store.oldest_prepared_age_ms()

    def recently_active(self, window_s: float = 0.02) -> int:
        """Producers committing through this coordinator at once (TxnStore.recently_active)."""
        return self.store.recently_active(window_s)
