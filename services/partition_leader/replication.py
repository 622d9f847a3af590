"""Replication decisions of one partition: follower progress, the in-sync replica set
(ISR), the high watermark, and where a follower truncates on a leader change.

Pure logic, driven by the partition with an injected clock (ms), as Kafka's
`Partition` / `Replica` classes and `AbstractFetcherThread` do it:

- A follower's log end offset (LEO) is the offset of its last fetch. It is caught up
  when it fetched up to the leader's LEO, or up to the LEO the leader had at its
  previous fetch (then it was caught up at that previous fetch time), so a follower
  that keeps fetching under continuous load stays in sync.
- An ISR follower not caught up for more than `replica.lag.time.max.ms` is dropped
  from the ISR; a follower caught up within that time whose LEO reached both the high
  watermark and the start offset of the leader's epoch joins it again. The leader
  itself is always in it.
- High watermark = min LEO over the ISR (an ISR follower with unknown LEO holds it);
  it never moves back.
- On a leader change, a follower asks the new leader where its latest epoch ends
  (OffsetForLeaderEpoch, KIP-101 with the KIP-279 refinement) and truncates to the
  point where both logs agree; never below its own high watermark.

ISR changes take effect only once written to ZooKeeper with compare-and-set (the
partition applies them through `set_isr`), so the high watermark never advances on an
ISR that was not durable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .leader_epoch import UNDEFINED_EPOCH, UNDEFINED_OFFSET, EpochEndOffset, LeaderEpochCache

UNKNOWN_OFFSET = -1


@dataclass
class FollowerState:
    """What the leader knows of one follower. Offsets are absolute; times in ms.

    log_end_offset: offset of its last fetch (-1 until it fetched in this epoch);
    last_caught_up_ms: last time it was known to be caught up with the leader;
    last_fetch_ms / last_fetch_leader_leo: time of its previous fetch and the
    leader's LEO then."""

    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    last_fetch_leader_leo: int = UNKNOWN_OFFSET


class LeaderReplication:
    """The leader's replication state for one partition and one leader epoch.

    local_id: this replica; replicas: the assignment (node ids, order kept);
    isr: in-sync replicas as stored in ZooKeeper (the leader is added if missing);
    zk_version: version of the partition-state znode that holds this ISR (-1 unknown);
    epoch_start_offset: the leader's LEO when it took over; now_ms: current time —
    ISR followers start as caught up now, the others as never.
    """

    def __init__(self, local_id: str, replicas: Iterable[str], isr: Iterable[str], *,
                 zk_version: int = -1, epoch_start_offset: int = 0, now_ms: int = 0):
        self.local_id = local_id
        self.replicas = tuple(replicas) or (local_id,)
        isr_set = set(isr) | {local_id}
        self.isr: tuple[str, ...] = self._ordered(isr_set)
        self.zk_version = zk_version
        self.epoch_start_offset = epoch_start_offset
        self.followers: dict[str, FollowerState] = {
            r: FollowerState(last_caught_up_ms=now_ms if r in isr_set else 0)
            for r in self.replicas if r != local_id}

    def _ordered(self, ids: Iterable[str]) -> tuple[str, ...]:
        """`ids` in assignment order (unknown ids last, sorted)."""
        ids = set(ids)
        known = [r for r in self.replicas if r in ids]
        return tuple(known + sorted(ids - set(known)))

    # ------------------------------------------------------------ follower progress
    def update_follower(self, replica: str, fetch_offset: int, leader_leo: int, now_ms: int) -> None:
        """Record a fetch from `replica` at `fetch_offset` while the leader's LEO is
        `leader_leo` (Kafka's `Replica.updateFetchState`). Unknown replicas are ignored."""
        st = self.followers.get(replica)
        if st is None:
            return
        if fetch_offset >= leader_leo:
            st.last_caught_up_ms = max(st.last_caught_up_ms, now_ms)
        elif fetch_offset >= st.last_fetch_leader_leo >= 0:
            st.last_caught_up_ms = max(st.last_caught_up_ms, st.last_fetch_ms)
        st.log_end_offset = fetch_offset
        st.last_fetch_leader_leo = leader_leo
        st.last_fetch_ms = now_ms

    def high_watermark(self, leader_leo: int) -> int:
        """min LEO over the ISR (the leader counts with `leader_leo`); UNKNOWN_OFFSET
        (-1) when an ISR follower has not fetched yet in this epoch."""
        hw = leader_leo
        for r in self.isr:
            if r == self.local_id:
                continue
            st = self.followers.get(r)
            if st is None or st.log_end_offset < 0:
                return UNKNOWN_OFFSET
            hw = min(hw, st.log_end_offset)
        return hw

    # ------------------------------------------------------------ ISR decisions
    def out_of_sync(self, now_ms: int, max_lag_ms: int) -> tuple[str, ...]:
        """ISR followers not caught up for more than `max_lag_ms`."""
        return tuple(r for r in self.isr if r != self.local_id and
                     now_ms - self.followers.get(r, FollowerState()).last_caught_up_ms > max_lag_ms)

    def shrink_candidate(self, now_ms: int, max_lag_ms: int) -> tuple[str, ...] | None:
        """The ISR without its lagging followers, or None when nobody lags."""
        lagging = set(self.out_of_sync(now_ms, max_lag_ms))
        if not lagging:
            return None
        return tuple(r for r in self.isr if r not in lagging)

    def expand_candidate(self, replica: str, high_watermark: int, now_ms: int,
                         max_lag_ms: int) -> tuple[str, ...] | None:
        """The ISR plus `replica` when it is an assigned follower outside the ISR whose
        LEO reached the high watermark and the start of this leader epoch, and that
        was caught up within `max_lag_ms` (so a follower that stopped fetching is not
        added back); else None."""
        st = self.followers.get(replica)
        if st is None or replica in self.isr:
            return None
        if st.log_end_offset < max(high_watermark, self.epoch_start_offset) or \
                now_ms - st.last_caught_up_ms > max_lag_ms:
            return None
        return self._ordered(set(self.isr) | {replica})

    def set_replicas(self, replicas: Iterable[str]) -> None:
        """Adopt a new assignment in the same leader epoch (a coordinator-led internal
        partition gaining its owner or losing a replica that left, metadata.version 3):
        a new follower starts as never caught up (it joins the ISR as any does); one no
        longer assigned stops counting once it is out of the ISR as well."""
        self.replicas = tuple(replicas) or (self.local_id,)
        keep = set(self.replicas) | set(self.isr)
        self.followers = {r: self.followers.get(r) or FollowerState(last_caught_up_ms=0)
                          for r in keep if r != self.local_id}

    def set_isr(self, isr: Iterable[str], zk_version: int) -> None:
        """Adopt an ISR stored in ZooKeeper at `zk_version` (after our compare-and-set,
        or a newer one written by the controller)."""
        self.isr = self._ordered(set(isr) | {self.local_id})
        self.zk_version = zk_version
        for r in [r for r in self.followers if r not in self.replicas and r not in self.isr]:
            del self.followers[r]  # removed from the replicas earlier in this epoch (set_replicas)


def truncation_offset(leader: EpochEndOffset, follower_epochs: LeaderEpochCache,
                      follower_leo: int, high_watermark: int) -> tuple[int, bool]:
    """Where a follower truncates given the leader's OffsetForLeaderEpoch answer for the
    follower's latest epoch (Kafka `AbstractFetcherThread.getOffsetTruncationState`,
    KIP-101 / KIP-279). Returns (offset, complete): truncate the log to `offset`
    (a no-op at or beyond `follower_leo`); when not complete, ask again with the
    follower's new latest epoch. The result is never below `high_watermark`.

    - The leader has no epoch information (end offset -1): truncate to the high watermark.
    - The leader knows no epoch <= ours (epoch -1): keep what precedes its first epoch.
    - The leader's epoch is one we have: keep min(its end, our end) of that epoch.
    - We only have older epochs: cut to the end of our largest epoch below the
      leader's and ask again."""
    def bounded(offset: int) -> int:
        return max(min(offset, follower_leo), min(high_watermark, follower_leo))

    if leader.end_offset == UNDEFINED_OFFSET:
        return bounded(high_watermark), True
    if leader.epoch == UNDEFINED_EPOCH:
        return bounded(leader.end_offset), True
    mine = follower_epochs.end_offset_for(leader.epoch, follower_leo)
    if mine.epoch == UNDEFINED_EPOCH:
        return bounded(leader.end_offset), True
    if mine.epoch == leader.epoch:
        return bounded(min(leader.end_offset, mine.end_offset)), True
    offset = min(leader.end_offset, mine.end_offset)
    # Cut at our high watermark instead: nothing older can diverge, so it is final.
    return bounded(offset), offset < high_watermark
