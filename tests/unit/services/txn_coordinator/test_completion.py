"""The completion of a transaction (completion.Completions): markers, the Complete record,
the next transaction's wait and the handover (design doc "Two-phase commit with markers";
docs/design.md, "Prepare -> append -> complete"), and `Completion`, one transactional.id's
completion: its task and the next adds waiting for it, the markers-written fact it records on the
metadata, and when it leaves its partition's registry."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from txn_coordinator_fakes import Harness, run, txn_settings
from exactly_wire.error_codes import ErrorCode
from services.txn_coordinator import txn_log
from services.common.settings import TxnCoordinatorSchema
from services.common.protocol import (MARKER_DEADLINE_MARGIN_MS, marker_coordinator_wait_ms,
                                      marker_leader_deadline_s)
from services.txn_coordinator.partition import Completion
from services.txn_coordinator.state import Guard, GuardNotHeldError, TransactionMetadata, TxnState

S = TxnState
E = ErrorCode


@pytest.mark.parametrize("committed", [True, False])
def test_commit_or_abort_writes_prepare_markers_complete(committed):
    async def scenario():
        h = Harness()
        await h.elect(0, coordinator_epoch=3)
        pid, epoch = await h.begin("t", [("orders", 0), ("orders", 1)])
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("payments", 1), ("orders", 0)])
        assert set(res.values()) == {E.NONE}
        assert (await h.coord.end_txn("t", pid, epoch, committed)).error == E.NONE
        prepare = S.PREPARE_COMMIT if committed else S.PREPARE_ABORT
        assert h.log.states("t")[-1] is prepare  # appended before answering
        await h.settle()
        complete = S.COMPLETE_COMMIT if committed else S.COMPLETE_ABORT
        assert h.log.states("t") == [S.EMPTY, S.ONGOING, S.ONGOING, prepare, complete]
        prepared = h.log.entries()[3].transit
        assert prepared.partitions == {("orders", 0), ("orders", 1), ("payments", 1)}
        written = h.markers.written_for(pid)
        assert {tp for _, tp in written} == {("orders", 0), ("orders", 1), ("payments", 1)}
        # KIP-890 part 2: the transaction ends under the next epoch, markers included.
        assert prepared.producer_epoch == epoch + 1 and prepared.last_producer_epoch == epoch
        assert all(m.committed is committed and m.producer_epoch == epoch + 1 and m.coordinator_epoch == 3
                   for m, _ in written)
        md = h.md("t")
        assert md.state is complete and not md.partitions and md.producer_epoch == epoch + 1

    run(scenario())


def test_end_txn_waits_for_completion_when_configured():
    async def scenario():
        h = Harness(txn_settings({"exactly.txn.end.completion.wait.ms": 5000}))
        await h.elect()
        pid, epoch = await h.begin("t")
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        assert h.md("t").state is S.COMPLETE_COMMIT  # next AddPartitions will not see CONCURRENT_TRANSACTIONS

    run(scenario())


def test_next_transaction_waits_for_the_previous_ones_markers():
    """EndTxn answers after the Prepare record; the producer's next AddPartitionsToTxn
    waits in the coordinator until the markers are written, then starts the next
    transaction (no CONCURRENT_TRANSACTIONS round trips) with one Ongoing record that
    also completes the previous one (the handover)."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        h.markers.gate = asyncio.Event()
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        assert h.md("t").state is S.PREPARE_COMMIT  # answered before the markers
        nxt = asyncio.create_task(h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 1)]))
        # The completion (spawned first) reaches the gate, then the add runs up to its
        # wait for that completion, before this coroutine resumes.
        await h.markers.held.wait()
        assert not nxt.done() and h.markers.written_for(pid) == []
        h.markers.gate.set()
        assert set((await nxt).values()) == {E.NONE}
        # Prepare, then straight to the next transaction, whose record was appended only
        # after every marker of the previous one was written.
        assert h.log.states("t")[-2:] == [S.PREPARE_COMMIT, S.ONGOING]
        assert [tp for _, tp in h.markers.written_for(pid)] == [("orders", 0)]
        assert h.md("t").partitions == {("orders", 1)} and h.md("t").state is S.ONGOING

    run(scenario())


def test_markers_retried_until_written():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0), ("orders", 1)])
        h.markers.fail[("orders", 1)] = [E.NOT_LEADER_OR_FOLLOWER, E.NETWORK_EXCEPTION, E.LEADER_NOT_AVAILABLE]
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT
        assert {tp for _, tp in h.markers.written_for(pid)} == {("orders", 0), ("orders", 1)}
        # orders-0 is written once, orders-1 retried alone
        assert sum(("orders", 0) in m.partitions for m in h.markers.attempts) == 1
        assert sum(("orders", 1) in m.partitions for m in h.markers.attempts) == 4

    run(scenario())


def test_marker_for_deleted_topic_is_dropped():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0), ("payments", 0)])
        del h.topology.topics["payments"]
        h.markers.errors[("payments", 0)] = E.UNKNOWN_TOPIC_OR_PARTITION
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT
        assert {tp for _, tp in h.markers.written_for(pid)} == {("orders", 0)}

    run(scenario())


def test_unknown_partition_of_existing_topic_is_retried():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0)])
        h.markers.fail[("orders", 0)] = [E.UNKNOWN_TOPIC_OR_PARTITION] * 3
        assert (await h.coord.end_txn("t", pid, epoch, False)).error == E.NONE
        await h.settle()
        assert h.md("t").state is S.COMPLETE_ABORT
        assert len(h.markers.written_for(pid)) == 1

    run(scenario())


def test_completion_append_is_retried():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        h.log.append_errors = [E.REQUEST_TIMED_OUT, E.NOT_ENOUGH_REPLICAS]
        await h.settle()
        assert h.log.states("t")[-1] is S.COMPLETE_COMMIT

    run(scenario())


def test_resigned_partition_stops_completion():
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        h.markers.errors[("orders", 0)] = E.NOT_LEADER_OR_FOLLOWER
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        for _ in range(5):
            await asyncio.sleep(0)
        await h.coord.on_resigned(0)
        await h.settle()
        assert h.log.states("t")[-1] is S.PREPARE_COMMIT
        assert (await h.coord.init_producer_id("t", 60000)).error == E.NOT_COORDINATOR

    run(scenario())


def test_pause_after_prepare_delays_markers_of_client_commits_only():
    async def scenario():
        slept = []

        async def recording_sleep(s):
            slept.append(s)
            await asyncio.sleep(0)
        h = Harness(txn_settings({"exactly.test.pause.after.prepare.ms": 5000}), sleep=recording_sleep)
        await h.elect()
        pid, epoch = await h.begin("t")
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        assert 5.0 in slept and h.md("t").state is S.COMPLETE_COMMIT

    run(scenario())


def test_a_marker_refused_for_a_newer_epoch_is_never_skipped_silently(caplog):
    from services.txn_coordinator import metrics
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", [("orders", 0), ("orders", 1)])
        h.markers.errors[("orders", 1)] = E.INVALID_PRODUCER_EPOCH
        before = metrics.MARKERS_REJECTED.labels("INVALID_PRODUCER_EPOCH")._value.get()
        with caplog.at_level("ERROR", logger="services.txn_coordinator.coordinator"):
            assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
            await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT
        assert metrics.MARKERS_REJECTED.labels("INVALID_PRODUCER_EPOCH")._value.get() == before + 1
        [rec] = [r for r in caplog.records if "refused on orders-1" in r.getMessage()]
        assert rec.levelname == "ERROR" and f"PID {pid} epoch {epoch + 1}" in rec.getMessage()

    run(scenario())


class _HeldSleep:
    """The coordinator's sleep: backoffs (up to exactly.txn.retry.backoff.max.ms)
    only yield; a longer sleep sets `parked` and waits for `resume`, then moves the
    clock on by the time asked for."""

    def __init__(self):
        self.clock = None
        self.parked = asyncio.Event()
        self.resume = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        if seconds <= TxnCoordinatorSchema().txn_retry_backoff_max_ms / 1000:
            await asyncio.sleep(0)
            return
        self.parked.set()
        await self.resume.wait()
        self.clock.advance(int(seconds * 1000))


async def _held_harness() -> tuple["Harness", "_HeldSleep", int, int]:
    """An elected Harness whose coordinator sleeps on a `_HeldSleep`, with transaction
    "t" begun: (harness, sleep, producer id, epoch)."""
    sleep = _HeldSleep()
    h = Harness(txn_settings({"exactly.txn.previous.completion.wait.ms": 0}), sleep=sleep)
    sleep.clock = h.clock
    await h.elect()
    pid, epoch = await h.begin("t")
    return h, sleep, pid, epoch


@pytest.mark.parametrize("unanswered", [E.REQUEST_TIMED_OUT, E.NETWORK_EXCEPTION], ids=["timed_out", "stream_broke"])
def test_a_version_1_transaction_outlives_its_unanswered_marker_requests(unanswered):
    """Transaction version 1 (a Kafka client's EndTxn below v5): the markers keep the
    producer's epoch, so the next transaction has the same PID and epoch. A marker
    request that got no answer (timed out at the coordinator, or its tunnel stream
    broke) may still append its marker at the leader until the leader's deadline;
    landing after the next transaction's first batch it would end that transaction.
    So the transaction completes, and the next one may start, only once the leader's
    deadline for that request, and a margin, have passed after the retry wrote the
    marker (the request arrived at the leader at the latest then)."""
    async def scenario():
        h, sleep, pid, epoch = await _held_harness()
        h.markers.fail[("orders", 0)] = [unanswered]  # no answer to the first request; the retry writes it
        ended_at = h.clock()
        end = await h.coord.end_txn("t", pid, epoch, True, transaction_version=1)
        assert (end.error, end.producer_epoch) == (E.NONE, epoch)
        completion = h.coord.partitions.get(0).completions["t"].task
        parked = asyncio.create_task(sleep.parked.wait())
        await asyncio.wait({parked, completion}, return_when=asyncio.FIRST_COMPLETED)
        assert not completion.done()  # still waiting for the unanswered request to die at the leader
        assert [m.producer_epoch for m, _ in h.markers.written_for(pid)] == [epoch]
        assert h.md("t").state is S.PREPARE_COMMIT
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 0)])
        assert set(res.values()) == {E.CONCURRENT_TRANSACTIONS}  # the next transaction waits
        sleep.resume.set()
        await h.settle()
        complete = h.log.entries()[-1].transit
        assert complete.state is S.COMPLETE_COMMIT
        # The retry wrote the marker at ended_at (the clock moves only in the held sleep).
        leader_deadline_ms = marker_leader_deadline_s(ended_at / 1000) * 1000
        assert complete.txn_last_update_timestamp - leader_deadline_ms >= MARKER_DEADLINE_MARGIN_MS
        res = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 0)])
        assert set(res.values()) == {E.NONE}

    run(scenario())


def test_unanswered_marker_requests_hold_no_version_2_transaction():
    """With an epoch bump per transaction (version 2) the leader refuses a late
    duplicate marker by its epoch: the completion does not wait."""
    async def scenario():
        h, sleep, pid, epoch = await _held_harness()
        h.markers.fail[("orders", 0)] = [E.REQUEST_TIMED_OUT]
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT and not sleep.parked.is_set()

    run(scenario())


def test_the_coordinator_outwaits_the_leaders_marker_deadline_by_the_margin():
    """services/common/protocol.py: for a request that arrived at its leader at the
    latest when the retry wrote the marker, the leader's deadline (counted from the
    arrival) ends MARKER_DEADLINE_MARGIN_MS before the coordinator's wait does."""
    written_at_ms = 1_700_000_000_000
    leader_deadline_ms = marker_leader_deadline_s(written_at_ms / 1000) * 1000
    coordinator_until_ms = written_at_ms + marker_coordinator_wait_ms()
    assert coordinator_until_ms - leader_deadline_ms == MARKER_DEADLINE_MARGIN_MS > 0


def _journal(h) -> list[tuple]:
    """Record marker writes and log appends of `h` in the order they happen."""
    journal: list[tuple] = []
    write, append = h.markers.write, h.log.append

    async def journaled_write(marker):
        out = await write(marker)
        journal.extend(("marker", tp) for tp, code in sorted(out.items()) if code == E.NONE)
        return out

    async def journaled_append(partition, batch):
        code = await append(partition, batch)
        if code == E.NONE:
            entry = txn_log.decode_fetched(h.log.batches[partition][-1])[0][-1]
            journal.append(("append", entry.transit.state if entry.transit else None))
        return code

    h.markers.write, h.log.append = journaled_write, journaled_append
    return journal


async def _commit_then_add(h, pid: int, epoch: int, add_epoch: int, partition: tuple, transaction_version: int = 2):
    """Commit the ongoing transaction of "t" with its markers held at the gate, then
    send the next transaction's add of `partition` under `add_epoch`; returns the add's
    task once the completion waits at the gate (the add waits for that completion)."""
    h.markers.held.clear()
    h.markers.gate = asyncio.Event()
    assert (await h.coord.end_txn("t", pid, epoch, True, transaction_version=transaction_version)).error == E.NONE
    add = asyncio.create_task(h.coord.add_partitions_to_txn("t", pid, add_epoch, [partition]))
    await h.markers.held.wait()
    return add


def test_the_handover_appends_the_next_transaction_only_after_every_marker():
    """Back-to-back transactions: the next one's first add waits; its Ongoing record,
    which also completes the previous transaction, follows every marker of it."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t", partitions=(("orders", 0), ("orders", 1)))
        journal = _journal(h)
        nxt = await _commit_then_add(h, pid, epoch, epoch + 1, ("orders", 2))
        h.markers.gate.set()
        assert set((await nxt).values()) == {E.NONE}
        await h.settle()
        assert journal == [("append", S.PREPARE_COMMIT), ("marker", ("orders", 0)), ("marker", ("orders", 1)),
                           ("append", S.ONGOING)]
        assert S.COMPLETE_COMMIT not in h.log.states("t")
        # A new owner loads the next transaction, not the previous one.
        await h.coord.on_resigned(0)
        await h.elect(0, 2)
        md = h.md("t")
        assert (md.state, md.producer_epoch, md.partitions) == (S.ONGOING, epoch + 1, {("orders", 2)})
        assert (await h.coord.end_txn("t", pid, epoch + 1, False)).error == E.NONE
        await h.settle()
        assert h.md("t").state is S.COMPLETE_ABORT

    run(scenario())


def test_a_failed_handover_completes_the_previous_transaction_after_all():
    """The add that was to start the next transaction fails to append: the previous
    transaction gets its Complete record anyway, and the add is answered the error."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        nxt = await _commit_then_add(h, pid, epoch, epoch + 1, ("orders", 1))
        h.log.append_errors.append(E.NOT_ENOUGH_REPLICAS)  # the Ongoing record of the handover
        h.markers.gate.set()
        assert set((await nxt).values()) == {E.COORDINATOR_NOT_AVAILABLE}
        await h.settle()
        assert h.log.states("t")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
        assert h.md("t").state is S.COMPLETE_COMMIT
        # The producer's retry starts the next transaction the ordinary way.
        assert set((await h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 1)])).values()) == {E.NONE}

    run(scenario())


def test_a_fenced_waiter_does_not_strand_the_previous_transaction():
    """An add with a stale epoch waiting for the completion is refused; the completion
    it held back still writes its Complete record."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        zombie = await _commit_then_add(h, pid, epoch, epoch, ("orders", 1))
        h.markers.gate.set()
        assert set((await zombie).values()) == {E.PRODUCER_FENCED}
        await h.settle()
        assert h.md("t").state is S.COMPLETE_COMMIT

    run(scenario())


def test_without_the_epoch_bump_the_next_handover_waits_for_its_own_markers():
    """Transaction version 1 keeps the epoch across transactions: the markers written
    for one transaction must not let the one after next start early."""
    async def scenario():
        h = Harness()
        await h.elect()
        pid, epoch = await h.begin("t")
        second = await _commit_then_add(h, pid, epoch, epoch, ("orders", 1), transaction_version=1)
        h.markers.gate.set()
        assert set((await second).values()) == {E.NONE}
        # The second transaction's markers are held back now.
        third = await _commit_then_add(h, pid, epoch, epoch, ("orders", 2), transaction_version=1)
        for _ in range(5):
            await asyncio.sleep(0)
        assert not third.done() and h.md("t").state is S.PREPARE_COMMIT
        h.markers.gate.set()
        assert set((await third).values()) == {E.NONE}
        assert [tp for _, tp in h.markers.written_for(pid)] == [("orders", 0), ("orders", 1)]
        assert h.md("t").partitions == {("orders", 2)}

    run(scenario())


# ---------------------------------------------------------------- Completion, one id's

NOW = 1_000_000


def _prepared(state: TxnState = S.PREPARE_COMMIT) -> TransactionMetadata:
    return TransactionMetadata("t", 7, producer_epoch=4, txn_timeout_ms=60000, state=state,
                               partitions=[("a", 0)], txn_start_timestamp=NOW, txn_last_update_timestamp=NOW)


def test_start_runs_one_task_and_the_registry_forgets_it_when_done():
    async def scenario():
        registry: dict[str, Completion] = {}
        gate = asyncio.Event()
        spawned = []

        def spawn() -> asyncio.Task:
            spawned.append(asyncio.create_task(gate.wait()))
            return spawned[-1]
        c = Completion.of(registry, "t")
        assert Completion.of(registry, "t") is c and registry == {"t": c}
        task = c.start(spawn)
        assert c.start(spawn) is task and len(spawned) == 1 and c.running and Completion.runs(registry, "t")
        gate.set()
        await task
        await asyncio.sleep(0)  # the done callback
        assert registry == {} and not c.running

    asyncio.run(scenario())


def test_markers_done_records_the_fact_on_the_metadata_only_while_a_next_add_waits():
    async def scenario():
        registry: dict[str, Completion] = {}
        md = _prepared()
        prepared = md.snapshot()
        c = Completion.of(registry, "t")
        assert not c.markers_done(md, prepared) and not md.markers_written  # nobody waits: append Complete
        with c.next_add_waiting():
            assert c.waiting == 1
            assert c.markers_done(md, prepared) and md.markers_written
        assert registry == {}  # nothing runs, nobody waits: the fact lives on the metadata
        transit = md.prepare_next_transaction(frozenset({("b", 0)}), NOW + 1)
        assert transit.state is S.ONGOING and md._pending_guard is Guard.MARKERS_WRITTEN
        md.complete_transition(transit)
        assert md.state is S.ONGOING and not md.markers_written  # forgotten by the transition

    asyncio.run(scenario())


def test_markers_done_records_nothing_for_another_transaction():
    md = _prepared(S.PREPARE_ABORT)
    c = Completion("t", {})
    c.waiting = 1
    earlier = replace(md.snapshot(), producer_epoch=3)  # an earlier epoch's markers
    assert not c.markers_done(md, earlier) and not md.markers_written
    with pytest.raises(GuardNotHeldError):
        md.prepare_next_transaction(frozenset({("b", 0)}), NOW)
    assert md.pending_state is None


def test_resume_only_a_prepared_transaction_nobody_completes():
    md = _prepared()
    assert Completion.resume(None, md)
    c = Completion("t", {})
    assert Completion.resume(c, md)
    c.waiting = 1
    assert not Completion.resume(c, md)  # the waiting add takes over or resumes it
    c.waiting = 0
    assert not Completion.resume(c, _prepared(S.ONGOING))


# ---------------------------------------------------------------- the handover wait
# exactly.txn.handover.wait.ms: the completion of a producer running transactions back to
# back waits, once its markers are written, for that producer's next add, so that the add's
# Ongoing record also completes it. The harness's clock moves only when a test moves it.

HANDOVER_WAIT_MS = 5


async def _spin(times: int = 50) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


async def _ended_back_to_back() -> tuple["Harness", int, int]:
    """A harness with the wait on, "t" back to back (`_back_to_back`) and its open
    transaction ended, the completion waiting for the next add: (harness, pid, epoch of
    the ended transaction)."""
    h = Harness(txn_settings({"exactly.txn.handover.wait.ms": HANDOVER_WAIT_MS}))
    pid, epoch = await _back_to_back(h)
    assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
    await _spin()
    return h, pid, epoch


async def _back_to_back(h) -> tuple[int, int]:
    """"t" committed once (its own Complete record: nothing marked it back to back yet)
    and its next transaction started at once: (pid, epoch of the open transaction)."""
    await h.elect()
    pid, epoch = await h.begin("t")
    assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
    await h.settle()
    assert h.log.states("t")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
    res = await h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 1)])
    assert set(res.values()) == {E.NONE}
    assert "t" in h.coord.partitions.get(0).back_to_back
    return pid, epoch + 1


def test_a_back_to_back_producers_next_add_completes_the_previous_transaction():
    """The next add comes after the markers are written, within the wait: one record,
    Ongoing, completes the previous transaction and starts the next; no Complete
    record of its own, and the next transaction holds only its own partition."""
    async def scenario():
        h, pid, epoch = await _ended_back_to_back()
        completion = h.coord.partitions.get(0).completions["t"].task
        assert not completion.done()  # its markers written, waiting for the next add
        assert [tp for m, tp in h.markers.written_for(pid) if m.producer_epoch == epoch + 1] == [("orders", 1)]
        res = await h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 2)])
        assert set(res.values()) == {E.NONE}
        await h.settle()
        assert h.log.states("t")[-3:] == [S.ONGOING, S.PREPARE_COMMIT, S.ONGOING]
        md = h.md("t")
        assert (md.state, md.producer_epoch, md.partitions) == (S.ONGOING, epoch + 1, {("orders", 2)})

    run(scenario())


def test_no_next_add_within_the_wait_the_complete_record_after_it():
    async def scenario():
        h, pid, epoch = await _ended_back_to_back()
        completion = h.coord.partitions.get(0).completions["t"].task
        h.clock.advance(HANDOVER_WAIT_MS - 1)
        await _spin()
        assert not completion.done() and h.log.states("t")[-1] is S.PREPARE_COMMIT
        h.clock.advance(1)
        await h.settle()
        assert h.log.states("t")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
        assert "t" not in h.coord.partitions.get(0).back_to_back  # the next completion does not wait

    run(scenario())


def test_init_producer_id_during_the_wait_gets_the_complete_record_at_once():
    """A new instance's InitProducerId while the completion waits: CONCURRENT_TRANSACTIONS
    as for any completing transaction, and the Complete record without the rest of the
    wait, so its retry finds the transaction complete."""
    async def scenario():
        h, pid, epoch = await _ended_back_to_back()
        assert (await h.coord.init_producer_id("t", 60000)).error == E.CONCURRENT_TRANSACTIONS
        await h.settle()  # the clock did not move
        assert h.log.states("t")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
        retry = await h.coord.init_producer_id("t", 60000)
        assert (retry.error, retry.producer_epoch) == (E.NONE, epoch + 2)

    run(scenario())


def test_a_producer_that_paused_longer_than_the_wait_is_not_waited_for():
    async def scenario():
        h = Harness(txn_settings({"exactly.txn.handover.wait.ms": HANDOVER_WAIT_MS}))
        await h.elect()
        pid, epoch = await h.begin("t")
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        await h.settle()
        h.clock.advance(HANDOVER_WAIT_MS + 1)
        assert set((await h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 1)])).values()) == {E.NONE}
        assert "t" not in h.coord.partitions.get(0).back_to_back
        assert (await h.coord.end_txn("t", pid, epoch + 1, True)).error == E.NONE
        await h.settle()  # no wait: the clock did not move
        assert h.log.states("t")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]

    run(scenario())


def test_no_handover_wait_when_end_txn_waits_for_the_complete_record():
    """exactly.txn.end.completion.wait.ms > 0: EndTxn answers after the Complete record,
    so no next add can come before it: the completion does not wait for one."""
    async def scenario():
        h = Harness(txn_settings({"exactly.txn.handover.wait.ms": HANDOVER_WAIT_MS,
                                  "exactly.txn.end.completion.wait.ms": 1000}))
        await h.elect()
        pid, epoch = await h.begin("t")
        assert (await h.coord.end_txn("t", pid, epoch, True)).error == E.NONE
        assert set((await h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 1)])).values()) == {E.NONE}
        assert "t" not in h.coord.partitions.get(0).back_to_back
        assert (await h.coord.end_txn("t", pid, epoch + 1, True)).error == E.NONE  # the clock does not move
        assert h.log.states("t")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]

    run(scenario())


def test_a_zombies_add_during_the_wait_is_fenced_and_the_transaction_still_completes():
    """An add under the previous epoch (an old instance's batch) arrives during the wait:
    it ends the wait and is refused PRODUCER_FENCED; the transaction gets its Complete
    record, and the producer's own next add starts the next transaction."""
    async def scenario():
        h, pid, epoch = await _ended_back_to_back()
        zombie = await h.coord.add_partitions_to_txn("t", pid, epoch, [("orders", 2)])
        assert set(zombie.values()) == {E.PRODUCER_FENCED}
        await h.settle()  # the clock did not move
        assert h.log.states("t")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
        assert set((await h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 0)])).values()) == {E.NONE}
        assert h.md("t").partitions == {("orders", 0)}

    run(scenario())


def test_a_new_owner_completes_a_transaction_whose_owner_resigned_during_the_wait():
    """The coordinator loses the partition while the completion waits for the next add
    (its markers written, no Complete record): the new owner loads PrepareCommit, writes
    the markers again (idempotent) and the Complete record; the producer's next add goes
    to it."""
    async def scenario():
        h, pid, epoch = await _ended_back_to_back()
        assert h.log.states("t")[-1] is S.PREPARE_COMMIT
        await h.coord.on_resigned(0)
        await h.elect(0, 2)
        await h.settle()
        assert h.log.states("t")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
        written = [m for m, tp in h.markers.written_for(pid) if m.producer_epoch == epoch + 1]
        assert [m.coordinator_epoch for m in written] == [1, 2]  # again by the new owner
        assert set((await h.coord.add_partitions_to_txn("t", pid, epoch + 1, [("orders", 2)])).values()) == {E.NONE}

    run(scenario())


def test_the_wait_without_a_timer_task_returns_on_the_first_done_future_or_the_deadline():
    """completion._first_done, the wait of a production coordinator (asyncio.sleep): it
    returns when one future is done, never cancels the others, and leaves no callback on
    them; with the deadline reached it returns with them still pending."""
    from services.txn_coordinator.completion import _first_done

    async def scenario():
        loop = asyncio.get_running_loop()
        a, b = loop.create_future(), loop.create_future()
        loop.call_soon(a.set_result, 1)
        await _first_done({a, b}, 3600)
        assert a.done() and not b.done()
        await _first_done({b}, 0)  # the deadline is now: the timer is due at once
        assert not b.done() and not b.cancelled()
        assert not b._callbacks  # the waits' callbacks were removed
        b.set_result(2)
        await asyncio.sleep(0)
    run(scenario())
