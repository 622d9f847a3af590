"""Loading an owned partition of the transaction log (design doc "Transaction
Coordinator Startup").

Once the previous owner is fenced (services.common.cluster.owned.OwnedPartitions),
replay the log into the partition's cache (`TxnPartition.replay`: transactions,
KIP-447 group assignments, producer-id bindings, feature levels), resume the
timeouts, serve, then roll PrepareCommit / PrepareAbort transactions forward (a
transaction sealed by PrepareTxn stays as it is: its transaction manager decides it)
and record the finalized metadata.version.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Awaitable, Callable, Iterable

from exactly_wire.clock import Clock, monotonic_ms, wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from services.common.cluster.owned import NotOwner, OwnedPartitions, RetryLater, code_name
from services.common.protocol import TRANSACTION_STATE_TOPIC
from services.common.settings import TxnCoordinatorSchema

from . import metrics, txn_log
from .ports import TxnLogStore
from .state import TransactionMetadata, TxnState

if TYPE_CHECKING:
    from .completion import Completions
    from .partition import TxnPartition

log = logging.getLogger(__name__)


class TxnLoader:
    """The load of a newly owned partition (the `load` of its OwnedPartitions).

    owned: the owned partitions (services.common.cluster.owned.OwnedPartitions:
    whether a partition is still owned, retries and tasks); log: the transaction log (ports.TxnLogStore); completions:
    completion.Completions (the roll forward); record_feature_level(part): async,
    the partition's feature-level record once it serves (scans.TxnScans); config:
    the parsed settings (transaction.state.log.load.buffer.size); clock: wall-clock
    ms; monotonic: ms of a monotonic clock (docs/design.md, "Clocks")."""

    def __init__(self, owned: OwnedPartitions[TxnPartition], log: TxnLogStore, completions: Completions,
                 record_feature_level: Callable[[TxnPartition], Awaitable[object]],
                 config: TxnCoordinatorSchema | None = None, clock: Clock = wall_clock_ms,
                 monotonic: Clock = monotonic_ms):
        self._owned = owned
        self._log = log
        self._completions = completions
        self._record_feature_level = record_feature_level
        self.config = config or TxnCoordinatorSchema()
        self._clock = clock
        self._monotonic = monotonic

    async def load(self, part: TxnPartition) -> None:
        """Replay `part` from offset 0 to the high watermark (design doc "Transaction
        Coordinator Startup"), serve, then roll the prepared transactions forward. A
        corrupt log disables the partition; one written by a newer version is not
        served either."""
        started = time.monotonic()
        try:
            entries = await self._read(part)
        except NotOwner:
            return
        except txn_log.NewerTxnLogError as exc:
            part.error = str(exc)
            part.finish_loading()
            log.error("%s-%d holds records of a newer version of Exactly; not served: %s",
                      TRANSACTION_STATE_TOPIC, part.partition, exc)
            return
        except txn_log.CorruptTxnLogError as exc:
            part.error = str(exc)
            part.finish_loading()
            log.error("%s-%d is corrupt; disabled: %s", TRANSACTION_STATE_TOPIC, part.partition, exc)
            return
        # A use seen by the previous owner is not in the log: count the load as one,
        # so a failover never expires a binding early.
        loaded_at = self._monotonic()
        for entry in entries:
            part.replay(entry, loaded_at)
        self._resume_timeouts(part.txns.values(), loaded_at)
        metrics.PRODUCER_ID_BINDINGS.set(part.partition, len(part.bindings))
        part.finish_loading()
        metrics.TRANSACTIONAL_IDS.set(part.partition, len(part.txns))
        prepared = [md for md in part.txns.values() if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)]
        log.info("loaded %s-%d (coordinator epoch %d): %d transactional ids, %d groups, %d records, "
                 "%d to roll forward, in %.0f ms", TRANSACTION_STATE_TOPIC, part.partition, part.coordinator_epoch,
                 len(part.txns), len(part.groups), len(entries), len(prepared), (time.monotonic() - started) * 1000)
        for md in prepared:
            self._completions.start(part, md, md.snapshot(), from_client=False)
        self._owned.spawn(part, self._record_feature_level(part), f"txn-feature-level-{part.partition}")

    async def _read(self, part: TxnPartition) -> list[object]:
        """The decoded records of `part` from offset 0 to the high watermark of the
        first fetch (`transaction.state.log.load.buffer.size` bytes per fetch,
        doubled when a batch does not fit), retried with backoff. Raises NotOwner,
        CorruptTxnLogError (NewerTxnLogError)."""
        entries: list[object] = []
        offset, target = 0, None
        max_bytes = self.config.state_log_load_buffer_size
        async for attempt in self._owned.retrying():
            with attempt:
                while True:
                    if not self._owned.owns(part):
                        raise NotOwner()
                    res = await self._log.fetch(part.partition, offset, max_bytes)
                    if res.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and offset < res.log_start_offset:
                        offset = res.log_start_offset
                        continue
                    if res.error_code:
                        raise RetryLater(f"fetching {TRANSACTION_STATE_TOPIC}-{part.partition}: "
                                         f"{code_name(res.error_code)}")
                    if target is None:
                        target = res.high_watermark
                    if offset >= target:
                        return entries
                    batch_entries, next_offset = txn_log.decode_fetched(res.records)
                    if next_offset is None or next_offset <= offset:
                        max_bytes *= 2  # a batch larger than the buffer
                        raise RetryLater(f"no progress reading {TRANSACTION_STATE_TOPIC}-{part.partition} "
                                         f"at {offset}")
                    entries.extend(batch_entries)
                    offset = next_offset
        return entries

    def _resume_timeouts(self, txns: Iterable[TransactionMetadata], loaded_at: int) -> None:
        """A loaded transaction resumes its timeout: its age at the load is the wall
        clock's (now - txn_start_timestamp), taken as 0 when negative (this host's
        clock is behind the previous owner's: no hang) and at most its
        transaction.timeout.ms + 1 ms; from then on only the monotonic clock counts. A
        prepared transaction has no timeout (the coordinator never aborts it): its
        wall-clock age since its prepare, 0 when negative, only feeds its age metric."""
        now = self._clock()
        for md in txns:
            if md.txn_start_timestamp >= 0:
                age = min(max(now - md.txn_start_timestamp, 0), md.txn_timeout_ms + 1)
                md.started_monotonic_ms = loaded_at - age
            if md.prepared_timestamp >= 0:
                md.prepared_monotonic_ms = loaded_at - max(now - md.prepared_timestamp, 0)
