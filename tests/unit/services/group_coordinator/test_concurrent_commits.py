"""KIP-447 draft CONCURRENT_PRODUCER_COMMIT: which partitions of a TxnOffsetCommit
another producer owns (group.concurrent_commits, pure)."""
from __future__ import annotations

from types import SimpleNamespace

from exactly_wire.types import TopicPartition
from services.group_coordinator.group import concurrent_commits

P0, P1, P2 = (TopicPartition("in", p) for p in range(3))


def group(generation: int, assignment: dict[str, dict[str, list[int]]]):
    members = {m: SimpleNamespace(member_id=m, assignment=a) for m, a in assignment.items()}
    return SimpleNamespace(generation=generation, members=members)


G = group(4, {"a": {"in": [0, 1]}, "b": {"in": [2]}})


def test_partitions_assigned_to_another_member_in_this_generation_are_refused():
    assert concurrent_commits(G, "a", 4, "tx-a", [P0, P1, P2], {}) == {P2}
    assert concurrent_commits(G, "b", 4, "tx-b", [P2], {}) == set()


def test_no_assignment_check_without_a_current_generation():
    # An older generation is ILLEGAL_GENERATION elsewhere; -1 skips the member check.
    assert concurrent_commits(G, "a", -1, "tx-a", [P2], {}) == set()
    assert concurrent_commits(None, "a", 1, "tx-a", [P2], {}) == set()


def test_a_stale_producer_of_a_mixed_group_is_refused():
    committers = {P0: ("tx-new", 4)}
    # A per-partition producer without a generation, after a group-aware one took over:
    assert concurrent_commits(G, "", -1, "tx-old", [P0], committers) == {P0}
    # An older generation than the last committer's:
    assert concurrent_commits(G, "a", 3, "tx-old", [P0], committers) == {P0}
    # The same producer, or a newer generation, go on:
    assert concurrent_commits(G, "a", 4, "tx-new", [P0], committers) == set()
    assert concurrent_commits(G, "a", 4, "tx-other", [P0], committers) == set()


def test_ownership_ends_when_the_generation_moves_on():
    # tx-a committed P0 in generation 3; the group is now in generation 4.
    committers = {P0: ("tx-a", 3)}
    assert concurrent_commits(G, "", -1, "tx-legacy", [P0], committers) == set()
    assert concurrent_commits(G, "a", 4, "tx-new", [P0], committers) == set()
    # An empty group that moved on owns nothing either.
    assert concurrent_commits(group(5, {}), "", -1, "tx-legacy", [P0], committers) == set()


def test_a_committer_newer_than_the_group_owns_nothing():
    # Recorded for generation 7 of a group that was deleted and created again: the new
    # group's generations start over, and its producers are not zombies of generation 7.
    committers = {P0: ("tx-deleted-group", 7)}
    assert concurrent_commits(G, "", -1, "tx-classic", [P0], committers) == set()
    assert concurrent_commits(G, "a", 4, "tx-classic", [P0], committers) == set()


def test_a_committer_without_a_generation_owns_nothing():
    committers = {P0: ("tx-legacy", -1)}
    assert concurrent_commits(G, "", -1, "tx-other", [P0], committers) == set()
    assert concurrent_commits(None, "", -1, "tx-other", [P0], committers) == set()


def test_a_group_without_membership_is_generation_zero():
    committers = {P0: ("tx-aware", 0)}
    assert concurrent_commits(None, "", -1, "tx-legacy", [P0], committers) == {P0}
    assert concurrent_commits(None, "", 0, "tx-other", [P0], committers) == set()
    assert concurrent_commits(None, "", -1, "tx-legacy", [P0], {P0: ("tx-aware", 2)}) == set()


def test_only_the_owned_partitions_are_refused():
    committers = {P0: ("tx-aware", 4), P1: ("tx-aware", 3), P2: ("tx-legacy", 4)}
    assert concurrent_commits(G, "", -1, "tx-legacy", [P0, P1, P2], committers) == {P0}
