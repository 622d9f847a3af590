"""Coordinator-led internal partitions (metadata.version 3; services/common/cluster/
coordinator_replicas.py and the controller's rule in controller.plan_partition): a claim
makes the owner the first replica and lists the replica leaving so that the replication
factor stays; the controller moves leadership to the first replica once it is live and in
sync, and drops the leaving replicas only once it leads."""
from __future__ import annotations

from services.common.cluster.controller import plan_partition
from services.common.cluster.coordinator_replicas import claim_assignment, plan_removal
from services.common.cluster.state import PartitionState


def staying(plan):
    replicas, leaving = plan
    return [r for r in replicas if r not in leaving]


def test_the_first_claim_at_level_3_replaces_the_last_partition_leader():
    # RF 1: the partition leader's copy is caught up from, then leaves.
    assert claim_assignment(["pl-0"], [], "txn-0", None) == (["txn-0", "pl-0"], ["pl-0"])
    # RF 3, the claim made before the level was raised (previous owner: itself, not a replica).
    plan = claim_assignment(["pl-1", "pl-2", "pl-0"], [], "txn-0", "txn-0")
    assert plan == (["txn-0", "pl-1", "pl-2", "pl-0"], ["pl-0"])
    assert staying(plan) == ["txn-0", "pl-1", "pl-2"]


def test_a_new_owner_replaces_the_previous_one_and_keeps_the_partition_leaders():
    plan = claim_assignment(["txn-0", "pl-1", "pl-2"], [], "txn-1", "txn-0")
    assert plan == (["txn-1", "txn-0", "pl-1", "pl-2"], ["txn-0"])
    # The same owner again (a restart): nothing to write.
    assert claim_assignment(["txn-1", "pl-1", "pl-2"], [], "txn-1", "txn-1") is None


def test_moves_that_did_not_finish_keep_the_replication_factor():
    # txn-1 claimed from txn-0 and died before leading; txn-2 claims: both leave.
    plan = claim_assignment(["txn-1", "txn-0", "pl-1", "pl-2"], ["txn-0"], "txn-2", "txn-1")
    assert plan == (["txn-2", "txn-1", "txn-0", "pl-1", "pl-2"], ["txn-0", "txn-1"])
    assert staying(plan) == ["txn-2", "pl-1", "pl-2"]
    # txn-0, still a replica on its way out, claims back: it stays, txn-1 leaves.
    plan = claim_assignment(["txn-1", "txn-0", "pl-1", "pl-2"], ["txn-0"], "txn-0", "txn-1")
    assert plan == (["txn-0", "txn-1", "pl-1", "pl-2"], ["txn-1"])
    # RF 1 with the only copy on a dead owner: the new owner waits for it as a replica.
    assert claim_assignment(["txn-0"], [], "txn-1", "txn-0") == (["txn-1", "txn-0"], ["txn-0"])


def test_leaving_replicas_go_only_once_the_first_replica_leads():
    replicas, removing = ["txn-1", "txn-0", "pl-1"], ["txn-0"]
    assert plan_removal(replicas, removing, "pl-1", ("txn-0", "pl-1", "txn-1"), True) is None  # interim leader
    assert plan_removal(replicas, removing, None, ("txn-0",), False) is None  # offline
    assert plan_removal(replicas, removing, "txn-1", ("txn-1", "txn-0", "pl-1"), True) == \
        (["txn-1", "pl-1"], ("txn-1", "pl-1"))
    assert plan_removal(replicas, [], "txn-1", ("txn-1",), True) is None
    assert plan_removal(["txn-1", "pl-0"], ["pl-0"], "txn-1", ("txn-1", "pl-0"), True) == (["txn-1"], ("txn-1",))


def test_leaving_replicas_stay_while_the_leader_is_not_current_or_a_staying_replica_lags():
    # RF 1: leadership just moved to txn-0, which died (or restarted) before the removal:
    # pl-0 holds the only other copy and must stay to be elected.
    assert plan_removal(["txn-0", "pl-0"], ["pl-0"], "txn-0", ("txn-0", "pl-0"), False) is None
    # RF 3 with the partition leaders lagging: removing txn-0 would leave acknowledged
    # records (min.insync.replicas 2) on txn-1 alone.
    assert plan_removal(["txn-1", "txn-0", "pl-1", "pl-2"], ["txn-0"], "txn-1", ("txn-0", "txn-1"), True) is None
    # Once both are in sync the move completes.
    assert plan_removal(["txn-1", "txn-0", "pl-1", "pl-2"], ["txn-0"], "txn-1",
                        ("txn-0", "txn-1", "pl-1", "pl-2"), True) == \
        (["txn-1", "pl-1", "pl-2"], ("txn-1", "pl-1", "pl-2"))


def test_the_controller_moves_leadership_to_the_first_replica_once_it_is_live_and_in_sync():
    live = {"txn-1": 5, "pl-1": 3, "pl-2": 4}
    replicas = ("txn-1", "pl-1", "pl-2")
    interim = PartitionState("pl-1", 7, ("pl-1", "pl-2"), version=3, mzxid=10)
    # Not in sync yet: the interim leader keeps it.
    assert plan_partition(replicas, interim, live, prefer_first=True) is None
    caught_up = PartitionState("pl-1", 7, ("pl-1", "pl-2", "txn-1"), version=4, mzxid=11)
    assert plan_partition(replicas, caught_up, live, prefer_first=True) == \
        PartitionState("txn-1", 8, ("pl-1", "pl-2", "txn-1"))
    # Only for coordinator-led partitions: a data partition keeps its leader.
    assert plan_partition(replicas, caught_up, live, prefer_first=False) is None
    # A first replica that registered again after the state was written (restarted) waits for
    # the next state write: its log may be shorter than the ISR says.
    assert plan_partition(replicas, caught_up, {**live, "txn-1": 12}, prefer_first=True) is None
    # Dead: the ISR loses it and the leader stays.
    assert plan_partition(replicas, caught_up, {"pl-1": 3, "pl-2": 4}, prefer_first=True) == \
        PartitionState("pl-1", 7, ("pl-1", "pl-2"))


def test_when_the_coordinator_leader_dies_an_in_sync_partition_leader_is_elected():
    state = PartitionState("txn-1", 8, ("txn-1", "pl-1", "pl-2"), version=5, mzxid=12)
    assert plan_partition(("txn-1", "pl-1", "pl-2"), state, {"pl-1": 3, "pl-2": 4}, prefer_first=True) == \
        PartitionState("pl-1", 9, ("pl-1", "pl-2"))
    # RF 1: no in-sync replica left, the partition goes offline (no unclean election).
    alone = PartitionState("txn-1", 8, ("txn-1",), version=5, mzxid=12)
    assert plan_partition(("txn-1",), alone, {"pl-0": 3}, prefer_first=True) == \
        PartitionState(None, 9, ("txn-1",))


def test_the_topic_znode_body_keeps_removing_only_for_partitions_that_have_some():
    from services.common.cluster.coordinator_replicas import with_assignment
    body = {"partitions": {"0": ["pl-0"], "1": ["txn-0"]}, "configs": {"a": "b"}, "internal": True}
    moved = with_assignment(body, 0, ["txn-1", "pl-0"], ["pl-0"])
    assert moved == {**body, "partitions": {"0": ["txn-1", "pl-0"], "1": ["txn-0"]}, "removing": {"0": ["pl-0"]}}
    assert body["partitions"]["0"] == ["pl-0"] and "removing" not in body  # a copy
    assert with_assignment(moved, 0, ["txn-1"], ()) == {**body, "partitions": {"0": ["txn-1"], "1": ["txn-0"]}}
