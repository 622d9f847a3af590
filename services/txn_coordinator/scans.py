"""The periodic scans of the transaction coordinator: timeouts and expirations.

Timed-out transactions are aborted (design doc "Coordinator-side Transaction
Expiration"; never a prepared one: docs/design.md, "Two-phase commit with a
database"), idle transactional.ids expired
("Coordinator TransactionalId Expiration"), unused producer-id bindings expired
(docs/design.md, "Producer-id bindings"), and the finalized metadata.version recorded
in every owned partition (`record_feature_levels`; docs/operating/upgrades.md).
Durations count on the injected monotonic clock (docs/design.md, "Clocks").

`TxnScans` is a part of `coordinator.TransactionCoordinator`, which runs the scans
periodically (`start`).
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from exactly_wire.error_codes import RETRIABLE, ErrorCode
from services.common.cluster import features

from . import metrics, txn_log
from .completion import Completion
from .ports import AMBIGUOUS_APPEND_ERRORS
from .state import COMPLETED_STATES, TransactionMetadata, TxnState

if TYPE_CHECKING:
    from .partition import TxnPartition

log = logging.getLogger(__name__)


class TxnScans:
    """The scans. Uses the coordinator's owned partitions, `_append`,
    `_append_bindings`, `_fence_and_abort`, `_start_completion`, `_forget_group`
    and clocks."""

    async def abort_timed_out_transactions(self) -> int:
        """Design doc "Coordinator-side Transaction Expiration": abort, with an epoch
        bump, every ongoing transaction older than its transaction.timeout.ms (from its
        first partition); restart the completion of PrepareCommit / PrepareAbort
        transactions whose completion is not running. Returns the number of
        transactions aborted.

        A prepared transaction (sealed by PrepareTxn) is never aborted here, however old:
        the coordinator is a participant that voted yes, and only the transaction
        manager that holds the decision -- the application's database through
        `exactly.postgres.recover()`, or an operator (`exactly transactions
        commit-prepared` / `abort-prepared`) -- completes it (KIP-939 has no timeout for
        a prepared transaction). Its age is exported for an alert
        (`oldest_prepared_age_ms`).

        The timeout counts on this process's monotonic clock from when it applied the
        transition: a wall clock stepped forwards expires nothing early, one stepped
        backwards holds nothing longer. A transaction loaded after a failover or restart
        resumes with its wall-clock age at the load (`_resume_timeouts`; docs/design.md,
        "Clocks")."""
        now = self._monotonic()
        aborts = []
        for part, md in self._loaded_txns():
            if md.pending_transition_in_progress:
                continue
            if md.started_monotonic_ms is None:
                md.started_monotonic_ms = now
            if md.prepared_monotonic_ms is None:
                md.prepared_monotonic_ms = now
            if md.is_prepared:
                continue  # decided by its transaction manager or an operator, never by a clock
            if md.state is TxnState.ONGOING and md.started_monotonic_ms + md.txn_timeout_ms < now:
                log.info("transaction of %r (PID %d epoch %d) timed out after %d ms; aborting",
                         md.transactional_id, md.producer_id, md.producer_epoch, md.txn_timeout_ms)
                aborts.append(self._fence_and_abort(part, md, cause="timeout"))
            elif (md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
                  and not Completion.runs(part.completions, md.transactional_id)):
                self._start_completion(part, md, md.snapshot(), from_client=False)
        results = await asyncio.gather(*aborts)
        return sum(1 for r in results if r == ErrorCode.NONE)

    async def expire_transactional_ids(self) -> int:
        """Design doc "Coordinator TransactionalId Expiration": write a tombstone for,
        and forget, every transactional.id without a transaction in progress whose
        last update is older than transactional.id.expiration.ms. A failed tombstone
        is ignored (retried at the next scan). Returns the number expired.

        The age is the last update's wall-clock timestamp (it outlives restarts, as in
        Kafka); one updated by this process must also be that old on its monotonic
        clock, so a wall clock stepped forwards expires no id in use."""
        now = self._clock()
        mono = self._monotonic()
        expiring = [self._expire(part, md, now) for part, md in self._loaded_txns()
                    if md.state in COMPLETED_STATES and not md.pending_transition_in_progress
                    and md.txn_last_update_timestamp + self.config.transactional_id_expiration_ms <= now
                    and (md.updated_monotonic_ms is None
                         or md.updated_monotonic_ms + self.config.transactional_id_expiration_ms <= mono)]
        return sum(await asyncio.gather(*expiring))

    def prepared_count(self) -> int:
        """Prepared transactions of the loaded owned partitions (metrics)."""
        return sum(1 for _, md in self._loaded_txns() if md.is_prepared)

    def oldest_prepared_age_ms(self) -> int:
        """Age (ms, on this process's monotonic clock; a transaction loaded from the log
        counts its wall-clock age at the load) of the oldest prepared transaction of the
        loaded owned partitions; 0 when none is prepared (metrics)."""
        now = self._monotonic()
        ages = [now - md.prepared_monotonic_ms for _, md in self._loaded_txns()
                if md.is_prepared and md.prepared_monotonic_ms is not None]
        return max(ages, default=0)

    async def record_feature_levels(self) -> int:
        """Append the feature-level record of the finalized metadata.version to every
        loaded owned partition that does not record it yet, from metadata.version 2 on
        (txn_log.FeatureLevelValue): a version of the transaction coordinator that does
        not know the level then refuses the partition instead of serving records it
        cannot read. Runs after each load, when the level changes, and periodically
        (a failed append is tried again). Returns the records appended."""
        parts = [part for part in list(self._parts.values()) if not (part.loading or part.error)]
        done = await asyncio.gather(*(self._record_feature_level(part) for part in parts))
        return sum(done)

    async def _record_feature_level(self, part: TxnPartition) -> bool:
        """One partition's feature-level record (see record_feature_levels); True once
        appended here."""
        level = self._topology.metadata_version()
        introduced = features.FORMATS["txn-log-feature-level"].level_of(0)
        if level < introduced or part.recorded_level >= level or not self._owns(part):
            return False
        batch = txn_log.encode_feature_level_batch(level, self._clock(), producer_id=part.producer_id,
                                                   producer_epoch=part.producer_epoch)
        code = await self._shielded(self._log.append(part.partition, batch), f"txn-feature-level-{part.partition}")
        if code == ErrorCode.NONE:
            part.recorded_level = max(part.recorded_level, level)
            log.info("__transaction_state-%d records metadata.version %d", part.partition, level)
            return True
        if code in AMBIGUOUS_APPEND_ERRORS or code in RETRIABLE:
            return False  # the next scan tries again
        self._is_fenced(part, code)
        return False

    def _loaded_txns(self) -> list[tuple[TxnPartition, TransactionMetadata]]:
        """(partition, metadata) of every transactional.id of the loaded, not
        disabled owned partitions: a snapshot, safe to iterate across awaits."""
        return [(part, md) for part in list(self._parts.values()) if not (part.loading or part.error)
                for md in list(part.txns.values())]

    async def _expire(self, part: TxnPartition, md: TransactionMetadata, now: int) -> int:
        group = md.group
        err = await self._append(part, md, md.prepare_dead(now))
        if err or part.txns.get(md.transactional_id) is not md:
            return 0
        del part.txns[md.transactional_id]
        await self._forget_group(part, md.transactional_id, group)
        metrics.TRANSACTIONAL_IDS.set(part.partition, len(part.txns))
        log.info("transactional.id %r expired", md.transactional_id)
        return 1

    async def expire_producer_id_bindings(self) -> int:
        """Write tombstones for, and forget, the expired producer-id bindings of the
        loaded owned partitions: an idempotent producer's binding unused for
        producer.id.expiration.ms; a transactional producer's binding whose
        transactional.id no longer holds the producer id (expired, or rotated to
        another producer id) and unused for transactional.id.expiration.ms. One
        batch per partition and up to 1000 records; a failed append is retried at
        the next scan. Returns the number expired. Use times are monotonic ms (a
        binding loaded from the log counts as used at the load)."""
        now = self._monotonic()
        expired = 0
        for part in list(self._parts.values()):
            if not part.serving:
                continue
            gone = []
            for pid, b in part.bindings.items():
                used = part.binding_used.setdefault(pid, now)
                if not b.transactional_id:
                    if used + self.config.producer_id_expiration_ms <= now:
                        gone.append((pid, used))
                    continue
                md = part.txns.get(b.transactional_id)
                if md is not None and pid in (md.producer_id, md.last_producer_id):
                    continue
                if used + self.config.transactional_id_expiration_ms <= now:
                    gone.append((pid, used))
            for i in range(0, len(gone), 1000):
                # Not one used (or rebound) since the scan looked at it.
                chunk = [pid for pid, used in gone[i:i + 1000] if part.binding_used.get(pid) == used]
                if chunk and await self._append_bindings(part, [(pid, None) for pid in chunk]) == ErrorCode.NONE:
                    expired += len(chunk)
        if expired:
            log.info("expired %d producer-id bindings", expired)
        return expired
