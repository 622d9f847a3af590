"""The periodic scans of the transaction coordinator: timeouts and expirations.

Timed-out transactions are aborted (design doc "Coordinator-side Transaction
Expiration"; never a prepared one: docs/design.md, "Two-phase commit with a
database"), idle transactional.ids expired
("Coordinator TransactionalId Expiration"), unused producer-id bindings expired
(docs/design.md, "Producer-id bindings"), and the finalized metadata.version recorded
in every owned partition (`record_feature_levels`; docs/operating/upgrades.md).
Durations count on the injected monotonic clock (docs/design.md, "Clocks").

`TxnScans` holds them; `coordinator.TransactionCoordinator` runs them periodically
(`start`).
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from exactly_wire.clock import Clock, monotonic_ms, wall_clock_ms
from exactly_wire.error_codes import ErrorCode
from services.common.cluster import features
from services.common.protocol import TRANSACTION_STATE_TOPIC
from services.common.settings import TxnCoordinatorSchema

from .ports import Topology
from .state import COMPLETED_STATES, TransactionMetadata, TxnState

if TYPE_CHECKING:
    from .completion import Completions
    from .group_txn import GroupTxn
    from .partition import TxnPartition
    from .store import TxnStore

log = logging.getLogger(__name__)


class TxnScans:
    """The scans.

    store: the transaction metadata (store.TxnStore: the loaded transactional ids,
    append, bindings, feature levels); completions: completion.Completions (aborts,
    restarted completions); groups: group_txn.GroupTxn (an expired id's group
    assignment); topology: ports.Topology (the finalized metadata.version); config:
    the parsed settings (TxnCoordinatorSchema); clock: wall-clock ms; monotonic: ms
    of a monotonic clock (every duration)."""

    def __init__(self, store: TxnStore, completions: Completions, groups: GroupTxn, topology: Topology,
                 config: TxnCoordinatorSchema | None = None, clock: Clock = wall_clock_ms,
                 monotonic: Clock = monotonic_ms):
        self._store = store
        self._completions = completions
        self._groups = groups
        self._topology = topology
        self.config = config or TxnCoordinatorSchema()
        self._clock = clock
        self._monotonic = monotonic

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
        for part, md in self._store.loaded_txns():
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
                aborts.append(self._completions.fence_and_abort(part, md, cause="timeout"))
            elif (md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
                  and not self._completions.running(part, md.transactional_id)):
                self._completions.start(part, md, md.snapshot(), from_client=False)
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
        expiring = [self._expire(part, md, now) for part, md in self._store.loaded_txns()
                    if md.state in COMPLETED_STATES and not md.pending_transition_in_progress
                    and md.txn_last_update_timestamp + self.config.transactional_id_expiration_ms <= now
                    and (md.updated_monotonic_ms is None
                         or md.updated_monotonic_ms + self.config.transactional_id_expiration_ms <= mono)]
        return sum(await asyncio.gather(*expiring))

    async def record_feature_levels(self) -> int:
        """Append the feature-level record of the finalized metadata.version to every
        loaded owned partition that does not record it yet, from metadata.version 2 on
        (txn_log.FeatureLevelValue): a version of the transaction coordinator that does
        not know the level then refuses the partition instead of serving records it
        cannot read. Runs after each load, when the level changes, and periodically
        (a failed append is tried again). Returns the records appended."""
        done = await asyncio.gather(*(self.record_feature_level(part) for part in self._store.serving()))
        return sum(done)

    async def record_feature_level(self, part: TxnPartition) -> bool:
        """One partition's feature-level record (see record_feature_levels); True once
        appended here."""
        level = self._topology.metadata_version()
        introduced = features.FORMATS["txn-log-feature-level"].level_of(0)
        if level < introduced or part.recorded_level >= level:
            return False
        if await self._store.append_feature_level(part, level) != ErrorCode.NONE:
            return False  # the next scan tries again
        log.info("%s-%d records metadata.version %d", TRANSACTION_STATE_TOPIC, part.partition, level)
        return True

    async def _expire(self, part: TxnPartition, md: TransactionMetadata, now: int) -> int:
        group = md.group
        err = await self._store.append(part, md, md.prepare_dead(now))
        if err or not self._store.forget(part, md):
            return 0
        await self._groups.forget(part, md.transactional_id, group)
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
        for part in self._store.serving():
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
                if chunk and await self._store.append_bindings(part, [(pid, None) for pid in chunk]) == ErrorCode.NONE:
                    expired += len(chunk)
        if expired:
            log.info("expired %d producer-id bindings", expired)
        return expired
