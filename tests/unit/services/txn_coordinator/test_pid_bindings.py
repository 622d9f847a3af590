"""Producer-id bindings in the transaction log (docs/design.md, "Producer-id bindings"):
issued in partition producer id % n, checked by VerifyProducerId, replayed by a new
owner, expired with producer state."""
from __future__ import annotations

import asyncio

import pytest
from txn_coordinator_fakes import FakeLog, GroupCommitLog, Harness, run, txn_settings, replayed

from exactly_wire.error_codes import ErrorCode
from services.txn_coordinator import txn_log
from services.txn_coordinator.pid_manager import ProducerIdManager

E = ErrorCode
N = 4
CONFIG = txn_settings({"producer.id.expiration.ms": 1000, "transactional.id.expiration.ms": 5000})


async def _owner_of_all(log: FakeLog | None = None, epoch: int = 1) -> Harness:
    h = Harness(CONFIG, txn_partitions=N, log=log, bind_producer_ids=True)
    for p in range(N):
        await h.elect(p, epoch)
    return h


def _owned(fn):
    """A test `async fn(h)` run over a fresh harness owning every partition, as a
    plain test function."""
    def test():
        async def scenario():
            await fn(await _owner_of_all())
        run(scenario())
    test.__name__, test.__doc__ = fn.__name__, fn.__doc__
    return test


def _code(h: Harness, producer_id: int, principal: str, transactional_id: str = "") -> ErrorCode:
    """VerifyProducerId's answer for a batch of `producer_id` from `principal`
    (transactional when `transactional_id` is given)."""
    return h.coord.verify_producer_id(producer_id, principal, transactional_id, bool(transactional_id))[0]


def _bindings(log: FakeLog, partition: int) -> dict[int, txn_log.ProducerIdBinding]:
    return replayed(log.entries(partition)).bindings


@_owned
async def test_an_idempotent_producer_id_is_bound_in_its_partition_before_it_is_handed_out(h: Harness):
    pids = []
    for _ in range(8):
        r = await h.coord.init_producer_id("", 0, principal="User:alice")
        assert (r.error, r.producer_epoch) == (E.NONE, 0)
        pids.append(r.producer_id)
    assert len(set(pids)) == 8
    assert {pid % N for pid in pids} == set(range(N))  # spread over the owned partitions
    for pid in pids:
        assert _bindings(h.log, pid % N)[pid].principal == "User:alice"
        assert _code(h, pid, "User:alice", "") == E.NONE
        code, why = h.coord.verify_producer_id(pid, "User:mallory", "", False)
        assert code == E.CLUSTER_AUTHORIZATION_FAILED and "another principal" in why
    assert _code(h, 10**9, "User:alice", "") == E.UNKNOWN_PRODUCER_ID  # never issued: bound to no one
    # Below metadata.version 2 partition leaders of versions before it may ask: they
    # know no UNKNOWN_PRODUCER_ID answer, so the refusal is theirs.
    h.topology.level = 1
    assert _code(h, 10**9, "User:alice", "") == E.CLUSTER_AUTHORIZATION_FAILED
    assert _code(h, -1, "User:alice", "") == E.CLUSTER_AUTHORIZATION_FAILED
    assert _code(h, 10**9, "User:alice", "tx") == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


@_owned
async def test_a_transactional_producer_id_lives_with_its_transactional_id_and_can_be_rebound(h: Harness):
    r = await h.coord.init_producer_id("tx-a", 60000, principal="User:alice")
    assert r.error == E.NONE
    partition = h.topology.txn_partition_for("tx-a")
    assert r.producer_id % N == partition
    assert _code(h, r.producer_id, "User:alice", "tx-a") == E.NONE
    assert _code(h, r.producer_id, "User:alice", "tx-b") == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    records_before = len(h.log.entries(partition))
    again = await h.coord.init_producer_id("tx-a", 60000, principal="User:alice")
    assert (again.producer_id, again.producer_epoch) == (r.producer_id, 1)
    assert len(h.log.entries(partition)) == records_before + 1  # the epoch bump only, no new binding
    bob = await h.coord.init_producer_id("tx-a", 60000, principal="User:bob")
    assert bob.producer_id == r.producer_id
    assert _code(h, r.producer_id, "User:bob", "tx-a") == E.NONE
    assert _code(h, r.producer_id, "User:alice", "tx-a") == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


@_owned
async def test_a_new_owner_replays_the_bindings(h: Harness):
    idem = await h.coord.init_producer_id("", 0, principal="User:alice")
    txn = await h.coord.init_producer_id("tx-a", 60000, principal="User:bob")
    successor = await _owner_of_all(h.log, epoch=2)
    assert _code(successor, idem.producer_id, "User:alice", "") == E.NONE
    assert _code(successor, txn.producer_id, "User:bob", "tx-a") == E.NONE
    assert _code(successor, idem.producer_id, "User:bob", "") == E.CLUSTER_AUTHORIZATION_FAILED


@_owned
async def test_a_failed_binding_hands_out_nothing(h: Harness):
    h.log.append_errors.append(E.NOT_ENOUGH_REPLICAS)
    r = await h.coord.init_producer_id("", 0, principal="User:alice")
    assert (r.error, r.producer_id) == (E.COORDINATOR_NOT_AVAILABLE, -1)
    h.log.append_errors.append(E.NOT_ENOUGH_REPLICAS)
    t = await h.coord.init_producer_id("tx-a", 60000, principal="User:alice")
    assert (t.error, t.producer_id) == (E.COORDINATOR_NOT_AVAILABLE, -1)
    assert not h.md("tx-a", h.topology.txn_partition_for("tx-a")).pending_transition_in_progress
    ok = await h.coord.init_producer_id("tx-a", 60000, principal="User:alice")
    assert ok.error == E.NONE


@_owned
async def test_idle_idempotent_bindings_expire_and_used_ones_stay(h: Harness):
    idle = (await h.coord.init_producer_id("", 0, principal="User:alice")).producer_id
    used = (await h.coord.init_producer_id("", 0, principal="User:alice")).producer_id
    h.clock.advance(600)
    assert _code(h, used, "User:alice", "") == E.NONE  # a use
    h.clock.advance(600)
    assert await h.coord.scans.expire_producer_id_bindings() == 1
    # Kafka's answer for an idempotent producer id whose state expired: the producer takes a new one.
    assert _code(h, idle, "User:alice", "") == E.UNKNOWN_PRODUCER_ID
    assert _code(h, idle, "User:alice", "tx-a") == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert _code(h, used, "User:alice", "") == E.NONE
    assert idle not in _bindings(h.log, idle % N)  # the tombstone is in the log
    h.clock.advance(1001)
    assert await h.coord.scans.expire_producer_id_bindings() == 1
    assert all(not _bindings(h.log, p) for p in range(N))


@_owned
async def test_a_transactional_binding_lives_as_long_as_its_transactional_id_holds_it(h: Harness):
    r = await h.coord.init_producer_id("tx-a", 60000, principal="User:alice")
    h.clock.advance(4000)
    assert await h.coord.scans.expire_producer_id_bindings() == 0  # held by tx-a
    h.clock.advance(2000)
    assert await h.coord.scans.expire_transactional_ids() == 1  # tx-a idle > transactional.id.expiration.ms
    assert await h.coord.scans.expire_producer_id_bindings() == 1
    assert _code(h, r.producer_id, "User:alice", "tx-a") == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_a_coordinator_owning_no_partition_issues_no_bound_producer_id():
    async def scenario():
        h = Harness(CONFIG, txn_partitions=N, bind_producer_ids=True)
        r = await h.coord.init_producer_id("", 0, principal="User:alice")
        assert r.error == E.NOT_COORDINATOR
        assert _code(h, 5, "User:alice", "") == E.NOT_COORDINATOR
    run(scenario())


def test_next_pid_in_takes_only_the_residues_asked_for():
    async def scenario():
        blocks = iter([(0, 9), (10, 19), (20, 29)])

        async def allocate():
            return next(blocks)
        pids = ProducerIdManager(allocate)
        await pids.ensure_available()
        assert [pids.next_pid_in({1}, 4), pids.next_pid_in({1}, 4), pids.next_pid_in({1}, 4)] == [1, 5, 9]
        assert pids.next_pid_in({1}, 4) is None
        await pids.ensure_available()
        assert [pids.next_pid_in({0, 3}, 4) for _ in range(3)] == [11, 12, 15]
    run(scenario())


def test_binding_records_round_trip():
    batch = txn_log.encode_binding_batch([(7, txn_log.ProducerIdBinding("User:a", "t", 5)), (8, None)], 9)
    entries, _ = txn_log.decode_fetched(batch)
    assert [(e.producer_id, e.binding) for e in entries] == [(7, txn_log.ProducerIdBinding("User:a", "t", 5)),
                                                             (8, None)]
    assert replayed(entries).txns == {}
    assert replayed(entries).bindings == {7: txn_log.ProducerIdBinding("User:a", "t", 5)}


def test_a_producer_id_issued_before_bindings_is_replaced_by_one_of_its_partition():
    async def scenario():
        before = Harness(CONFIG, txn_partitions=N)
        for p in range(N):
            await before.elect(p, 1)
        partition = before.topology.txn_partition_for("tx-a")
        old = None
        for _ in range(N):  # until the unbound coordinator hands out a producer id of another residue
            tid = f"tx-{_}"
            r = await before.coord.init_producer_id(tid, 60000)
            if r.producer_id % N != before.topology.txn_partition_for(tid):
                old, partition = (tid, r.producer_id), before.topology.txn_partition_for(tid)
                break
        assert old is not None
        h = await _owner_of_all(before.log, epoch=2)
        r = await h.coord.init_producer_id(old[0], 60000, principal="User:alice")
        assert r.error == E.NONE and r.producer_id != old[1] and r.producer_id % N == partition
        assert h.coord.verify_producer_id(r.producer_id, "User:alice", old[0], True) == (E.NONE, "")
    run(scenario())


@pytest.mark.parametrize("transactional", [True, False], ids=["transactional", "idempotent"])
def test_an_init_cancelled_while_its_binding_record_waits_in_the_group_commit(transactional):
    """InitProducerId is cancelled (a client deadline, a disconnect) while the binding
    record of its producer id waits in the partition leader's group-commit queue. The
    record goes out all the same; the binding and the transition it precedes are
    applied from the append's own result, so the transactional.id is not left with an
    epoch bump pending (every later request CONCURRENT_TRANSACTIONS) and the cache's
    bindings agree with the log."""
    async def scenario():
        log = GroupCommitLog()
        h = await _owner_of_all(log)
        tid = "tx-cancelled" if transactional else ""
        log.request_gate = asyncio.Event()
        request = asyncio.create_task(h.coord.init_producer_id(tid, 60000, principal="User:alice"))
        await log.requested.wait()  # the binding record is in the request held at the leader
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        log.request_gate.set()
        await log.answered.wait()
        await h.settle()
        log.request_gate = None
        if transactional:
            part = h.topology.txn_partition_for(tid)
            md = h.md(tid, part)
            again = await h.coord.init_producer_id(tid, 60000, principal="User:alice")
            assert (again.error, again.producer_id, again.producer_epoch) == (E.NONE, md.producer_id, 1)
            assert _bindings(log, part)[md.producer_id] == txn_log.ProducerIdBinding("User:alice", tid,
                                                                                     h.wall())
        else:
            assert sum(len(_bindings(log, p)) for p in range(N)) == 1
        for p in range(N):
            assert h.coord.partitions.get(p).bindings == _bindings(log, p)
    run(scenario())


# ---------------------------------------------------------------- per-principal caps (KIP-936's intent)
CAPPED = txn_settings({"producer.id.expiration.ms": 1000, "transactional.id.expiration.ms": 5000,
                       "exactly.producer.ids.max.per.principal": 5,
                       "exactly.transactional.ids.max.per.principal": 3})


async def _capped_owner() -> Harness:
    h = Harness(CAPPED, txn_partitions=N, bind_producer_ids=True)
    for p in range(N):
        await h.elect(p, 1)
    return h


def test_idempotent_producer_ids_per_principal_are_capped_until_some_expire():
    async def scenario():
        h = await _capped_owner()
        for _ in range(5):
            assert (await h.coord.init_producer_id("", 0, principal="User:mallory")).error == E.NONE
        over = await h.coord.init_producer_id("", 0, principal="User:mallory")
        assert over.error == E.POLICY_VIOLATION and over.producer_id == -1
        assert "exactly.producer.ids.max.per.principal" in over.message and "holds 5" in over.message
        assert (await h.coord.init_producer_id("", 0, principal="User:alice")).error == E.NONE  # her own count
        h.clock.advance(1001)  # producer.id.expiration.ms
        assert await h.coord.scans.expire_producer_id_bindings() == 6
        assert (await h.coord.init_producer_id("", 0, principal="User:mallory")).error == E.NONE
    run(scenario())


def test_transactional_ids_per_principal_are_capped_and_a_held_one_is_always_served():
    async def scenario():
        h = await _capped_owner()
        for i in range(3):
            assert (await h.coord.init_producer_id(f"m-{i}", 60000, principal="User:mallory")).error == E.NONE
        over = await h.coord.init_producer_id("m-3", 60000, principal="User:mallory")
        assert over.error == E.POLICY_VIOLATION and "exactly.transactional.ids.max.per.principal" in over.message
        assert "m-3" not in h.coord.partitions.get(h.topology.txn_partition_for("m-3")).txns  # nothing kept for it
        again = await h.coord.init_producer_id("m-1", 60000, principal="User:mallory")  # one she holds: bumped
        assert again.error == E.NONE and again.producer_epoch == 1
        assert (await h.coord.init_producer_id("a-0", 60000, principal="User:alice")).error == E.NONE
    run(scenario())


def test_concurrent_inits_cannot_pass_the_cap_together():
    """20 idempotent InitProducerIds of one principal at once, under a cap of 5: the
    ones in flight count, so 5 are bound and 15 refused."""
    async def scenario():
        h = await _capped_owner()
        answers = await asyncio.gather(*(h.coord.init_producer_id("", 0, principal="User:mallory")
                                         for _ in range(20)))
        codes = sorted(a.error.name for a in answers)
        assert codes.count("NONE") == 5 and codes.count("POLICY_VIOLATION") == 15, codes
        held = sum(p.held.idempotent["User:mallory"] for p in h.coord.partitions.values())
        assert held == 5
    run(scenario())


def test_what_a_principal_holds_is_replayed_with_the_bindings():
    async def scenario():
        h = await _capped_owner()
        for i in range(3):
            assert (await h.coord.init_producer_id(f"m-{i}", 60000, principal="User:mallory")).error == E.NONE
        successor = Harness(CAPPED, txn_partitions=N, log=h.log, bind_producer_ids=True)
        for p in range(N):
            await successor.elect(p, 2)
        over = await successor.coord.init_producer_id("m-9", 60000, principal="User:mallory")
        assert over.error == E.POLICY_VIOLATION, over
    run(scenario())


def test_memory_per_binding_and_per_transactional_id():
    """Bytes a coordinator keeps per idempotent producer-id binding and per
    transactional id with its binding (tracemalloc, 20,000 of each, principal and
    transactional.id names of 20 characters): printed, and bounded, to size
    exactly.producer.ids.max.per.principal and exactly.transactional.ids.max.per.principal."""
    import tracemalloc

    from services.txn_coordinator.partition import TxnPartition
    from services.txn_coordinator.state import TransactionMetadata

    n = 20_000
    principal = "User:" + "p" * 15
    tracemalloc.start()
    try:
        part = TxnPartition(0, 1)
        base = tracemalloc.get_traced_memory()[0]
        for pid in range(n):
            part.bind(pid, txn_log.ProducerIdBinding(principal, "", 1_700_000_000_000), 1_000)
        per_binding = (tracemalloc.get_traced_memory()[0] - base) / n
        part = TxnPartition(1, 1)
        base = tracemalloc.get_traced_memory()[0]
        for pid in range(n):
            tid = f"tx-{pid:017d}"
            part.txns[tid] = TransactionMetadata(tid, pid, txn_timeout_ms=60000, txn_last_update_timestamp=0)
            part.bind(pid, txn_log.ProducerIdBinding(principal, tid, 1_700_000_000_000), 1_000)
        per_tid = (tracemalloc.get_traced_memory()[0] - base) / n
    finally:
        tracemalloc.stop()
    print(f"coordinator memory: {per_binding:.0f} B per idempotent producer-id binding, {per_tid:.0f} B per "
          f"transactional id with its binding")
    # The defaults (100,000 and 10,000) then hold a principal to some 19 MB and 5 MB per coordinator.
    assert per_binding < 400, per_binding
    assert per_tid < 2000, per_tid
