"""Loading an owned `__transaction_state` partition (design doc "Transaction
Coordinator Startup").

Fence the previous owner, replay the log into the partition's cache (transactions,
KIP-447 group assignments, producer-id bindings), resume the timeouts, and roll
PrepareCommit / PrepareAbort transactions forward (a transaction sealed by PrepareTxn
stays as it is: its transaction manager decides it).

`TxnLoad` is a part of `coordinator.TransactionCoordinator`.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Iterable

from exactly_wire.error_codes import ErrorCode
from services.common.cluster.owned import NotOwner, RetryLater, code_name

from . import metrics, txn_log
from .state import TransactionMetadata, TxnState

if TYPE_CHECKING:
    from .partition import TxnPartition

log = logging.getLogger(__name__)


class TxnLoad:
    """The load. Uses the coordinator's `_fence_previous_owner`, `_retrying`,
    `_owns`, log, clocks, `_loaded_groups` and `_start_completion`."""

    async def _load(self, part: TxnPartition) -> None:
        """PartitionOwner's main task of a newly owned partition: fence the previous
        owner, replay the partition from offset 0 to the high watermark (design doc
        "Transaction Coordinator Startup"), serve, then roll the prepared
        transactions forward. A corrupt log disables the partition."""
        started = time.monotonic()
        entries: list[object] = []
        offset, target = 0, None
        max_bytes = self.config.state_log_load_buffer_size
        try:
            await self._fence_previous_owner(part)
            async for attempt in self._retrying():
                with attempt:
                    while True:
                        if not self._owns(part):
                            raise NotOwner()
                        res = await self._log.fetch(part.partition, offset, max_bytes)
                        if res.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and offset < res.log_start_offset:
                            offset = res.log_start_offset
                            continue
                        if res.error_code:
                            raise RetryLater(f"fetching __transaction_state-{part.partition}: {code_name(res.error_code)}")
                        if target is None:
                            target = res.high_watermark
                        if offset >= target:
                            break
                        batch_entries, next_offset = txn_log.decode_fetched(res.records)
                        if next_offset is None or next_offset <= offset:
                            max_bytes *= 2  # a batch larger than the buffer
                            raise RetryLater(f"no progress reading __transaction_state-{part.partition} at {offset}")
                        entries.extend(batch_entries)
                        offset = next_offset
            txns = txn_log.rebuild(entries)
            groups = self._loaded_groups(entries, txns)
            bindings = txn_log.rebuild_bindings(entries)
        except NotOwner:
            return
        except txn_log.NewerTxnLogError as exc:
            part.error = str(exc)
            part.finish_loading()
            log.error("__transaction_state-%d holds records of a newer version of Exactly; not served: %s",
                      part.partition, exc)
            return
        except txn_log.CorruptTxnLogError as exc:
            part.error = str(exc)
            part.finish_loading()
            log.error("__transaction_state-%d is corrupt; disabled: %s", part.partition, exc)
            return
        part.txns = txns
        part.groups = groups
        part.recorded_level = txn_log.recorded_level(entries)
        # A use seen by the previous owner is not in the log: count the load as one,
        # so a failover never expires a binding early.
        loaded_at = self._monotonic()
        self._resume_timeouts(txns.values(), loaded_at)
        part.set_bindings(bindings, loaded_at)
        metrics.PRODUCER_ID_BINDINGS.set(part.partition, len(bindings))
        part.finish_loading()
        metrics.TRANSACTIONAL_IDS.set(part.partition, len(txns))
        prepared = [md for md in txns.values() if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)]
        log.info("loaded __transaction_state-%d (coordinator epoch %d): %d transactional ids, %d groups, %d records, "
                 "%d to roll forward, in %.0f ms", part.partition, part.coordinator_epoch, len(txns), len(groups),
                 len(entries), len(prepared), (time.monotonic() - started) * 1000)
        for md in prepared:
            self._start_completion(part, md, md.snapshot(), from_client=False)
        self._spawn(part, self._record_feature_level(part), f"txn-feature-level-{part.partition}")

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
