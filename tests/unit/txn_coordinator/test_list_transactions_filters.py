"""ListTransactions filters (KIP-664 / KIP-994): state, producer id, duration."""
from __future__ import annotations

from test_coordinator_logic import _write
from txn_coordinator_fakes import FakeLog, Harness, run

from exactly_wire.error_codes import ErrorCode as E
from services.txn_coordinator.state import TxnState as S


def test_state_producer_id_and_duration_filters():
    async def scenario():
        log = FakeLog()
        h = Harness(log=log, txn_partitions=1)
        now = h.clock()
        _write(log, "old", S.ONGOING, pid=1, start=now - 600_000, last_update=now - 600_000)
        _write(log, "young", S.ONGOING, pid=2, start=now - 1_000, last_update=now - 1_000)
        _write(log, "idle", S.EMPTY, pid=3, start=-1)
        await h.elect()
        err, listing = h.coord.list_transactions()
        assert err == E.NONE and [s.transactional_id for s in listing] == ["idle", "old", "young"]
        assert [s.transactional_id for s in h.coord.list_transactions(["Ongoing"])[1]] == ["old", "young"]
        assert [s.transactional_id for s in h.coord.list_transactions((), [2, 3])[1]] == ["idle", "young"]
        assert [s.transactional_id for s in h.coord.list_transactions((), (), 60_000)[1]] == ["old"]
        assert h.coord.list_transactions(["Ongoing"], [2], 60_000)[1] == []
        assert h.coord.list_transactions(["NoSuchState"])[1] == []

    run(scenario())
