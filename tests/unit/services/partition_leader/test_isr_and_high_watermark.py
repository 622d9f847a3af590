"""Replication decisions with an injected clock: follower catch-up, ISR shrink and
expand, the high watermark (min LEO over the ISR), and where a follower truncates
after a leader change (KIP-101 / KIP-279)."""
from __future__ import annotations

import pytest

from services.partition_leader.leader_epoch import UNDEFINED_EPOCH, UNDEFINED_OFFSET, EpochEndOffset, EpochEntry, \
    LeaderEpochCache
from services.partition_leader.replication import LeaderReplication, truncation_offset

LAG = 10_000
T0 = 1_000_000


def leader(isr=("a", "b", "c"), epoch_start=0) -> LeaderReplication:
    return LeaderReplication("a", ("a", "b", "c"), isr, zk_version=3, epoch_start_offset=epoch_start, now_ms=T0)


# ---------------------------------------------------------------- high watermark

def test_high_watermark_is_the_min_leo_over_the_isr():
    r = leader()
    assert r.high_watermark(50) == -1  # followers have not fetched in this epoch yet
    r.update_follower("b", 40, 50, T0)
    assert r.high_watermark(50) == -1
    r.update_follower("c", 45, 50, T0)
    assert r.high_watermark(50) == 40
    r.set_isr(("a", "c"), 4)
    assert r.high_watermark(50) == 45 and r.zk_version == 4
    r.set_isr((), 5)  # the leader is always in sync
    assert r.isr == ("a",) and r.high_watermark(50) == 50


def test_out_of_sync_followers_do_not_hold_the_high_watermark():
    r = leader(isr=("a", "b"))
    r.update_follower("b", 50, 50, T0)
    r.update_follower("c", 0, 50, T0)
    assert r.high_watermark(50) == 50


# ---------------------------------------------------------------- catch-up and ISR

def test_a_follower_fetching_the_leader_log_end_is_caught_up():
    r = leader()
    r.update_follower("b", 50, 50, T0 + 5_000)
    assert r.followers["b"].last_caught_up_ms == T0 + 5_000
    # Behind the current log end, but at the log end of its previous fetch: it was
    # caught up at that previous fetch.
    r.update_follower("b", 50, 80, T0 + 6_000)
    assert r.followers["b"].last_caught_up_ms == T0 + 5_000
    r.update_follower("b", 80, 95, T0 + 7_000)
    assert r.followers["b"].last_caught_up_ms == T0 + 6_000
    # Falling behind its previous fetch's log end: no progress.
    r.update_follower("b", 85, 120, T0 + 8_000)
    r.update_follower("b", 90, 130, T0 + 9_000)
    assert r.followers["b"].last_caught_up_ms == T0 + 6_000


def test_isr_shrinks_after_replica_lag_time_max():
    r = leader()
    r.update_follower("b", 10, 10, T0 + 1_000)
    assert r.shrink_candidate(T0 + LAG, LAG) is None  # c started as caught up at T0
    assert r.out_of_sync(T0 + LAG + 1, LAG) == ("c",)
    assert r.shrink_candidate(T0 + LAG + 1, LAG) == ("a", "b")
    assert r.shrink_candidate(T0 + LAG + 1_001, LAG) == ("a",)


def test_a_follower_outside_the_isr_joins_once_caught_up():
    r = leader(isr=("a", "b"), epoch_start=30)
    assert r.followers["c"].last_caught_up_ms == 0  # not in sync when the epoch started
    r.update_follower("c", 20, 60, T0)
    assert r.expand_candidate("c", high_watermark=20, now_ms=T0, max_lag_ms=LAG) is None  # before the epoch start
    r.update_follower("c", 60, 60, T0 + 100)
    assert r.expand_candidate("c", high_watermark=60, now_ms=T0 + 100, max_lag_ms=LAG) == ("a", "b", "c")
    assert r.expand_candidate("c", high_watermark=61, now_ms=T0 + 100, max_lag_ms=LAG) is None  # below the HW
    # A follower that stopped fetching long ago is not added back.
    assert r.expand_candidate("c", high_watermark=60, now_ms=T0 + LAG + 101, max_lag_ms=LAG) is None
    assert r.expand_candidate("b", high_watermark=0, now_ms=T0, max_lag_ms=LAG) is None  # already in
    assert r.expand_candidate("zz", high_watermark=0, now_ms=T0, max_lag_ms=LAG) is None  # not assigned


def test_fetches_from_unassigned_replicas_are_ignored():
    r = leader()
    r.update_follower("zz", 10, 10, T0)
    assert "zz" not in r.followers


# ---------------------------------------------------------------- truncation

def epochs(*entries) -> LeaderEpochCache:
    return LeaderEpochCache(None, [EpochEntry(e, s) for e, s in entries])


@pytest.mark.parametrize("answer, follower, leo, hw, expected", [
    # Same epoch: keep the common part of it.
    (EpochEndOffset(1, 120), ((0, 0), (1, 100)), 150, 90, (120, True)),
    (EpochEndOffset(1, 160), ((0, 0), (1, 100)), 150, 90, (150, True)),
    # The leader never saw our newer epoch 2: cut at its end of epoch 1.
    (EpochEndOffset(1, 110), ((0, 0), (1, 100), (2, 130)), 150, 90, (110, True)),
    (EpochEndOffset(1, 140), ((0, 0), (1, 100), (2, 130)), 150, 90, (130, True)),
    # The leader's answer (epoch 1) is an epoch we never had: cut at the end of our
    # older epoch 0 (or the leader's end of 1) and ask again with epoch 0.
    (EpochEndOffset(1, 120), ((0, 0), (2, 100)), 150, 50, (100, False)),
    (EpochEndOffset(1, 80), ((0, 0), (2, 100)), 150, 50, (80, False)),
    # ... but never below the high watermark; then that is final.
    (EpochEndOffset(1, 40), ((0, 0), (2, 100)), 150, 90, (90, True)),
    # The leader knows no epoch <= ours: keep what precedes its first epoch.
    (EpochEndOffset(UNDEFINED_EPOCH, 70), ((4, 0),), 150, 20, (70, True)),
    # No epoch information at the leader: the high watermark.
    (EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET), ((0, 0),), 150, 90, (90, True)),
    # Never below the high watermark.
    (EpochEndOffset(1, 60), ((0, 0), (1, 50)), 150, 90, (90, True)),
])
def test_truncation_offset(answer, follower, leo, hw, expected):
    assert truncation_offset(answer, epochs(*follower), leo, hw) == expected


def test_truncation_rounds_converge():
    """Leader epochs 0, 3 (it never had our 1 and 2): first round answers for epoch 0."""
    leader_epochs = epochs((0, 0), (3, 80))
    follower = epochs((0, 0), (1, 60), (2, 90))
    leo, hw = 120, 40
    for _ in range(5):
        answer = leader_epochs.end_offset_for(follower.latest_epoch, 200)
        offset, complete = truncation_offset(answer, follower, leo, hw)
        leo = min(leo, offset)
        follower.truncate_from_end(leo)
        if complete:
            break
    assert (leo, complete, follower.entries) == (60, True, [EpochEntry(0, 0)])


# ---------------------------------------------------------------- replicas changed within an epoch

def test_a_replica_added_within_the_epoch_is_tracked_and_joins_the_isr_once_caught_up():
    # A coordinator-led internal partition gains its new owner as a replica (metadata.version 3).
    r = LeaderReplication("a", ("a", "b"), ("a", "b"), zk_version=3, epoch_start_offset=10, now_ms=T0)
    r.update_follower("b", 50, 50, T0)
    assert r.expand_candidate("new", 50, T0, LAG) is None  # not a replica yet: ignored
    r.update_follower("new", 50, 50, T0)
    assert "new" not in r.followers
    r.set_replicas(("new", "a", "b"))
    assert r.followers["b"].log_end_offset == 50  # the others keep their progress
    assert r.followers["new"].last_caught_up_ms == 0 and r.high_watermark(50) == 50  # outside the ISR
    r.update_follower("new", 30, 50, T0 + 1)
    assert r.expand_candidate("new", 50, T0 + 1, LAG) is None  # behind the high watermark
    r.update_follower("new", 50, 50, T0 + 2)
    assert r.expand_candidate("new", 50, T0 + 2, LAG) == ("new", "a", "b")  # in assignment order


def test_a_removed_replica_counts_until_it_leaves_the_isr_too():
    r = LeaderReplication("a", ("a", "b", "c"), ("a", "b", "c"), zk_version=3, now_ms=T0)
    r.update_follower("b", 40, 50, T0)
    r.update_follower("c", 50, 50, T0)
    r.set_replicas(("a", "b"))  # the topic znode's change arrived before the state's
    assert r.high_watermark(50) == 40 and "c" in r.followers
    r.set_isr(("a", "b"), 4)  # then the state's: it stops counting
    assert "c" not in r.followers and r.high_watermark(50) == 40
    r.update_follower("b", 50, 50, T0)
    assert r.high_watermark(50) == 50
