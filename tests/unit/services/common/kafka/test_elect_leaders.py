"""ElectLeaders under Exactly's controller (services.common.kafka.cluster_api.election_result):
leadership moves only on a leader's failure and never outside the ISR, so an election is
either not needed or refused with the reason."""
from __future__ import annotations

from exactly_wire.error_codes import ErrorCode
from services.common.cluster.state import PartitionState
from services.common.kafka.cluster_api import PREFERRED, UNCLEAN, election_result

REPLICAS = ["pl-0", "pl-1", "pl-2"]
ALL = {"pl-0", "pl-1", "pl-2"}


def test_preferred_leader_leading_needs_no_election():
    assert election_result(PREFERRED, REPLICAS, PartitionState("pl-0", 3, tuple(REPLICAS)), ALL) == \
        (ErrorCode.ELECTION_NOT_NEEDED, None)


def test_preferred_election_refused_with_the_reason():
    moved = PartitionState("pl-1", 4, ("pl-1", "pl-2"))
    code, msg = election_result(PREFERRED, REPLICAS, moved, ALL)
    assert code == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE and "not in the ISR" in msg
    code, msg = election_result(PREFERRED, REPLICAS, moved, {"pl-1", "pl-2"})
    assert code == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE and "not live" in msg
    code, msg = election_result(PREFERRED, REPLICAS, PartitionState("pl-1", 4, tuple(REPLICAS)), ALL)
    assert code == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE and "only when a leader fails" in msg


def test_unclean_election_is_never_made():
    assert election_result(UNCLEAN, REPLICAS, PartitionState("pl-2", 1, ("pl-2",)), ALL)[0] == \
        ErrorCode.ELECTION_NOT_NEEDED
    code, msg = election_result(UNCLEAN, REPLICAS, PartitionState(None, 2, ("pl-2",)), {"pl-0", "pl-1"})
    assert code == ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE and "outside the ISR" in msg
