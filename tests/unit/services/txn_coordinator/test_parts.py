"""Each part of the transaction coordinator is built alone, from its own
dependencies, and does its work without the coordinator: the owned partitions
(OwnedPartitions), the store (lookup, append, apply), the completions (markers,
Complete record, handover), the KIP-447 draft's hooks, the requests, the scans and
the loader (docs/design.md, "The coordinator's modules")."""
from __future__ import annotations

import asyncio

from exactly_wire.error_codes import ErrorCode as E
from services.common.cluster.owned import OwnedPartitions
from services.txn_coordinator import txn_log
from services.txn_coordinator.completion import Completions
from services.txn_coordinator.group_txn import GroupTxn
from services.txn_coordinator.load import TxnLoader
from services.txn_coordinator.partition import TxnPartition
from services.txn_coordinator.pid_manager import ProducerIdManager
from services.txn_coordinator.requests import TxnRequests
from services.txn_coordinator.scans import TxnScans
from services.txn_coordinator.state import GroupAssignment, TransactionMetadata, TxnState
from services.txn_coordinator.store import TxnStore
from exactly.testing import MockTime
from txn_coordinator_fakes import NOW_MS, FakeLog, FakeMarkers, FakeTopology, fast_sleep, run, txn_settings

S = TxnState
CONFIG = txn_settings({})


async def _owned_partition(load=None, log: FakeLog | None = None) -> tuple[OwnedPartitions, TxnPartition]:
    """Owned partitions whose load only serves (or runs `load`), with partition 0 owned."""
    async def serve(part: TxnPartition) -> None:
        part.finish_loading()

    owned = OwnedPartitions("txn-log", TxnPartition, load or serve, lambda part, batch: log.append(0, batch),
                            wall_clock=MockTime(NOW_MS), sleep=fast_sleep)
    await owned.on_elected(0, 1)
    await owned.wait_loaded(0)
    return owned, owned.get(0)


def _store(owned: OwnedPartitions, log: FakeLog, clock: MockTime) -> TxnStore:
    return TxnStore(owned, log, FakeTopology(), clock, clock)


def _prepared(part: TxnPartition, clock: MockTime, state: TxnState = S.PREPARE_COMMIT) -> TransactionMetadata:
    md = TransactionMetadata("t", 7, producer_epoch=4, txn_timeout_ms=60000, state=state,
                             partitions=[("orders", 0)], txn_start_timestamp=clock(),
                             txn_last_update_timestamp=clock())
    part.txns["t"] = md
    return md


def test_owned_partitions_alone_load_after_fencing_and_resign():
    async def scenario():
        loaded = []

        async def load(part):
            loaded.append(part.partition)
            part.finish_loading()
        owned, part = await _owned_partition(load)
        assert loaded == [0] and owned.owned_partitions() == {0: True} and owned.owns(part)
        assert await owned.on_resigned(0) and owned.owned_partitions() == {} and part.closed
        await owned.stop()
    run(scenario())


def test_the_store_alone_looks_up_appends_and_applies():
    async def scenario():
        clock, log = MockTime(NOW_MS), FakeLog()
        owned, part = await _owned_partition(log=log)
        store = _store(owned, log, clock)
        assert store.lookup("t") == (E.NONE, part)
        md = TransactionMetadata("t", 7, txn_timeout_ms=60000, txn_last_update_timestamp=clock())
        store.add(part, md)
        assert await store.append(part, md, md.prepare_increment_producer_epoch(60000, None, clock())) == E.NONE
        assert (md.state, md.producer_epoch, log.states("t")) == (S.EMPTY, 0, [S.EMPTY])
        g = GroupAssignment("g", 3, frozenset({("orders", 0)}))
        assert await store.append_group(part, "t", g) == E.NONE
        assert part.groups == {"g": {"t": g}} and md.group == g  # replayed as written
        await owned.stop()
    run(scenario())


def test_completions_alone_write_the_markers_then_the_complete_record():
    async def scenario():
        clock, log, markers = MockTime(NOW_MS), FakeLog(), FakeMarkers()
        owned, part = await _owned_partition(log=log)
        completions = Completions(_store(owned, log, clock), markers, FakeTopology(), CONFIG, clock, clock, fast_sleep)
        md = _prepared(part, clock)
        # No marker recorded as written: the handover is refused, nothing pending.
        assert await completions.hand_over(part, md, frozenset({("orders", 1)})) == E.CONCURRENT_TRANSACTIONS
        assert md.pending_state is None
        await completions.start(part, md, md.snapshot(), from_client=False)
        assert [tp for _, tp in markers.written_for(7)] == [("orders", 0)]
        assert md.state is S.COMPLETE_COMMIT and log.states("t") == [S.COMPLETE_COMMIT]
        await owned.stop()
    run(scenario())


def test_the_group_hooks_alone_refuse_an_older_generation():
    async def scenario():
        clock, log = MockTime(NOW_MS), FakeLog()
        owned, part = await _owned_partition(log=log)
        store = _store(owned, log, clock)
        groups = GroupTxn(store, Completions(store, FakeMarkers(), FakeTopology(), CONFIG, clock, clock, fast_sleep))
        assert await groups.init("t", GroupAssignment("g", 5, frozenset({("orders", 0)}))) is None
        older = await groups.init("u", GroupAssignment("g", 4, frozenset({("orders", 1)})))
        assert older.error == E.ILLEGAL_GENERATION and part.generation("g") == 5
        await owned.stop()
    run(scenario())


def _requests(store: TxnStore, clock: MockTime, blocks: list) -> TxnRequests:
    async def allocate() -> tuple[int, int]:
        blocks.append((len(blocks) * 10, len(blocks) * 10 + 9))
        return blocks[-1]
    completions = Completions(store, FakeMarkers(), FakeTopology(), CONFIG, clock, clock, fast_sleep)
    return TxnRequests(store, completions, GroupTxn(store, completions), ProducerIdManager(allocate),
                       FakeTopology(), CONFIG, clock, clock)


def test_the_requests_alone_initialise_and_start_a_transaction():
    async def scenario():
        clock, log, blocks = MockTime(NOW_MS), FakeLog(), []
        owned, part = await _owned_partition(log=log)
        requests = _requests(_store(owned, log, clock), clock, blocks)
        r = await requests.init_producer_id("t", 60000)
        assert (r.error, r.producer_id, r.producer_epoch, blocks) == (E.NONE, 0, 0, [(0, 9)])
        assert await requests.add_partitions_to_txn("t", 0, 0, [("orders", 0)]) == {("orders", 0): E.NONE}
        assert part.txns["t"].state is S.ONGOING and log.states("t") == [S.EMPTY, S.ONGOING]
        await owned.stop()
    run(scenario())


def test_the_scans_alone_abort_a_timed_out_transaction():
    async def scenario():
        clock, log = MockTime(NOW_MS), FakeLog()
        owned, part = await _owned_partition(log=log)
        store = _store(owned, log, clock)
        completions = Completions(store, FakeMarkers(), FakeTopology(), CONFIG, clock, clock, fast_sleep)
        scans = TxnScans(store, completions, GroupTxn(store, completions), FakeTopology(), CONFIG, clock, clock)
        md = TransactionMetadata("t", 7, producer_epoch=4, txn_timeout_ms=1000, state=S.ONGOING,
                                 partitions=[("orders", 0)], txn_start_timestamp=clock(),
                                 txn_last_update_timestamp=clock())
        md.started_monotonic_ms = clock()
        part.txns["t"] = md
        assert await scans.abort_timed_out_transactions() == 0
        clock.advance(1001)
        assert await scans.abort_timed_out_transactions() == 1
        assert md.state in (S.PREPARE_ABORT, S.COMPLETE_ABORT) and md.producer_epoch == 5
        await owned.stop()
    run(scenario())


def test_the_loader_alone_replays_a_partition_and_rolls_it_forward():
    async def scenario():
        clock, log, markers = MockTime(NOW_MS), FakeLog(), FakeMarkers()
        prepared = TransactionMetadata("t", 7, producer_epoch=4, txn_timeout_ms=60000, state=S.PREPARE_ABORT,
                                       partitions=[("orders", 0)], txn_start_timestamp=clock(),
                                       txn_last_update_timestamp=clock()).snapshot()
        log.write(0, txn_log.encode_batch("t", prepared, clock()))
        log.write(0, txn_log.encode_batch("gone", prepared, clock()))
        log.write(0, txn_log.encode_batch("gone", None, clock()))
        loader: TxnLoader | None = None

        async def load(part):
            await loader.load(part)
        owned = OwnedPartitions("txn-log", TxnPartition, load, lambda part, batch: log.append(0, batch),
                                wall_clock=clock, sleep=fast_sleep)
        completions = Completions(_store(owned, log, clock), markers, FakeTopology(), CONFIG, clock, clock,
                                  fast_sleep)
        recorded = []

        async def record_feature_level(part):
            recorded.append(part.partition)
        loader = TxnLoader(owned, log, completions, record_feature_level, CONFIG, clock, clock)
        await owned.on_elected(0, 1)
        await owned.wait_loaded(0)
        part = owned.get(0)
        assert set(part.txns) == {"t"}
        for _ in range(100):
            if part.txns["t"].state is S.COMPLETE_ABORT:
                break
            await asyncio.sleep(0)
        assert part.txns["t"].state is S.COMPLETE_ABORT and [tp for _, tp in markers.written_for(7)] == \
            [("orders", 0)] and recorded == [0]
        await owned.stop()
    run(scenario())


def test_a_reload_whose_log_has_no_leader_answers_not_coordinator_then_serves():
    # The fence of a (re)load refused for want of a leader (e.g. this process's own
    # replica lost its lease while cut off from ZooKeeper): the producer is sent to find
    # the owner again rather than told to wait here; once a fence is in, it serves.
    async def scenario():
        clock, log = MockTime(NOW_MS), FakeLog()
        asked = [asyncio.Event(), asyncio.Event()]
        go = [asyncio.Event(), asyncio.Event()]
        calls = []

        async def fence(part, batch):
            n = len(calls)
            calls.append(n)
            asked[n].set()
            await go[n].wait()
            return E.NOT_LEADER_OR_FOLLOWER if n == 0 else await log.append(0, batch)

        async def serve(part):
            part.finish_loading()
        owned = OwnedPartitions("txn-log", TxnPartition, serve, fence, wall_clock=MockTime(NOW_MS), sleep=fast_sleep)
        store = _store(owned, log, clock)
        await owned.on_elected(0, 1, 5, 0)
        await asked[0].wait()
        assert store.lookup("t") == (E.COORDINATOR_LOAD_IN_PROGRESS, None)
        go[0].set()
        await asked[1].wait()
        part = owned.get(0)
        assert part.leaderless and part.loading and store.lookup("t") == (E.NOT_COORDINATOR, None)
        go[1].set()
        await owned.wait_loaded(0)
        assert not part.leaderless and store.lookup("t") == (E.NONE, part)
        await owned.stop()
    run(scenario())
