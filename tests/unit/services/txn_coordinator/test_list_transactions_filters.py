"""ListTransactions filters (KIP-664 / KIP-994): state, producer id, duration."""
from __future__ import annotations

from txn_coordinator_fakes import FakeLog, Harness, run, write_record

from exactly_wire.error_codes import ErrorCode as E
from services.txn_coordinator.state import TxnState as S


def test_state_producer_id_and_duration_filters():
    async def scenario():
        log = FakeLog()
        h = Harness(log=log, txn_partitions=1)
        now = h.clock()
        write_record(log, "old", S.ONGOING, pid=1, start=now - 600_000, last_update=now - 600_000)
        write_record(log, "young", S.ONGOING, pid=2, start=now - 1_000, last_update=now - 1_000)
        write_record(log, "idle", S.EMPTY, pid=3, start=-1)
        await h.elect()
        err, listing = h.coord.list_transactions()
        assert err == E.NONE and [s.transactional_id for s in listing] == ["idle", "old", "young"]
        assert [s.transactional_id for s in h.coord.list_transactions(["Ongoing"])[1]] == ["old", "young"]
        assert [s.transactional_id for s in h.coord.list_transactions((), [2, 3])[1]] == ["idle", "young"]
        assert [s.transactional_id for s in h.coord.list_transactions((), (), 60_000)[1]] == ["old"]
        assert h.coord.list_transactions(["Ongoing"], [2], 60_000)[1] == []
        assert h.coord.list_transactions(["NoSuchState"])[1] == []

    run(scenario())
