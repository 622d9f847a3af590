"""The controller's choice of a partition's next state (services.common.cluster.controller.
plan_partition): keep a live leader, drop dead replicas from the ISR, elect from the
live ISR in assignment order, go offline rather than elect an out-of-sync replica
(unclean election off), re-elect when the leader registered again (restarted)."""
from __future__ import annotations

import pytest

from services.common.cluster.state import PartitionState
from services.common.cluster.controller import plan_partition

REPLICAS = ("pl-0", "pl-1", "pl-2")
MZXID = 100  # when the state was last written


def state(leader, epoch, isr):
    return PartitionState(leader, epoch, tuple(isr), version=3, mzxid=MZXID)


def live(*nodes, restarted=()):
    """Registrations: before the state was written, or after it for `restarted`."""
    return {n: (MZXID + 50 if n in restarted else MZXID - 50) for n in nodes}


@pytest.mark.parametrize("current, alive, expected", [
    # Healthy: nothing to do.
    (state("pl-0", 4, REPLICAS), live(*REPLICAS), None),
    # A dead follower leaves the ISR; leader and epoch stay.
    (state("pl-0", 4, REPLICAS), live("pl-0", "pl-1"), PartitionState("pl-0", 4, ("pl-0", "pl-1"))),
    # A dead leader: the first live ISR member in assignment order, epoch + 1.
    (state("pl-0", 4, REPLICAS), live("pl-1", "pl-2"), PartitionState("pl-1", 5, ("pl-1", "pl-2"))),
    (state("pl-0", 4, ("pl-0", "pl-2")), live("pl-1", "pl-2"), PartitionState("pl-2", 5, ("pl-2",))),
    # No live ISR member: offline, ISR kept (no unclean election of pl-1).
    (state("pl-0", 4, ("pl-0", "pl-2")), live("pl-1"), PartitionState(None, 5, ("pl-0", "pl-2"))),
    # Already offline and still no candidate: nothing to write.
    (state(None, 5, ("pl-0", "pl-2")), live("pl-1"), None),
    # An ISR member is back: it leads.
    (state(None, 5, ("pl-0", "pl-2")), live("pl-1", "pl-2"), PartitionState("pl-2", 6, ("pl-2",))),
    # The leader restarted (registered after the state): another in-sync replica leads ...
    (state("pl-0", 4, REPLICAS), live(*REPLICAS, restarted=("pl-0",)), PartitionState("pl-1", 5, REPLICAS)),
    # ... or itself again when it is the only one, in a new epoch.
    (state("pl-0", 4, ("pl-0",)), live(*REPLICAS, restarted=("pl-0",)), PartitionState("pl-0", 5, ("pl-0",))),
    # A restarted follower changes nothing by itself.
    (state("pl-0", 4, REPLICAS), live(*REPLICAS, restarted=("pl-1",)), None),
])
def test_plan_partition(current, alive, expected):
    assert plan_partition(REPLICAS, current, alive) == expected


def test_isr_members_outside_the_assignment_come_last():
    current = state(None, 1, ("zz", "pl-2"))
    assert plan_partition(REPLICAS, current, live("zz", "pl-2")) == PartitionState("pl-2", 2, ("pl-2", "zz"))


def test_state_encoding_round_trip():
    st = PartitionState("pl-1", 7, ("pl-1", "pl-2"))
    assert PartitionState.decode(st.encode(), 4, 99) == PartitionState("pl-1", 7, ("pl-1", "pl-2"), 4, 99)
    assert PartitionState.decode(PartitionState(None, 2, ()).encode()).leader is None
