"""Per-partition bookkeeping of the Consumer: assignment, positions, pending offset
resets and fetch backoff. Pure (no I/O); the Consumer and the Fetcher drive it.

A partition's position is the offset of the next record `poll` will return. It is
unknown (None) until it is initialised from the group's committed offset or by the
offset reset policy (`auto.offset.reset`, or `seek_to_beginning` / `seek_to_end`,
which are evaluated lazily on the next `poll` / `position` as in Kafka).
Every change of position that is not the result of consuming bumps the partition's
`epoch`, so responses to requests sent for an older position are discarded.

A paused partition (`pause`) stays assigned and keeps its position and buffered
records, but is neither fetched nor drained until `resume`. A subscription is a
list of topics or a regular expression (`subscribe_pattern`), matched against the
cluster's topics on each metadata refresh (`update_pattern_topics`; internal
topics, named `__*`, never match), as Kafka's `SubscriptionState`.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from exactly import errors
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from ._fetched import AbortedTransactions, FetchedRecords

# ListOffsets sentinel timestamps (design doc "ListOffsetRequest").
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
LSO_TIMESTAMP = -3


class ResetStrategy(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"

    @classmethod
    def parse(cls, value: str) -> "ResetStrategy":
        """'earliest' | 'latest' | 'none' ('smallest'/'largest' accepted as Kafka
        aliases). Raises ValueError."""
        v = str(value).strip().lower()
        v = {"smallest": "earliest", "beginning": "earliest", "largest": "latest", "end": "latest"}.get(v, v)
        try:
            return cls(v)
        except ValueError:
            raise ValueError(f"auto.offset.reset must be earliest, latest or none, not {value!r}") from None


def matching_topics(pattern: re.Pattern, topics: Iterable[str]) -> tuple[str, ...]:
    """Sorted names of `topics` that `pattern` matches from their start
    (`re.match`, as Kafka's Pattern.matcher(topic).matches() with a leading "^";
    a "$" anchors the end). Internal topics (`__*`) are excluded."""
    return tuple(sorted(t for t in set(topics) if not t.startswith("__") and pattern.match(t)))


def reset_timestamp(strategy: ResetStrategy, read_committed: bool) -> int:
    """ListOffsets timestamp for a reset: earliest -2; latest -1 (high watermark)
    or, under read_committed, -3 (the LSO: design doc "Discussion on Seeks").
    Raises ValueError for NONE, which has no offset to reset to."""
    if strategy is ResetStrategy.EARLIEST:
        return EARLIEST_TIMESTAMP
    if strategy is ResetStrategy.LATEST:
        return LSO_TIMESTAMP if read_committed else LATEST_TIMESTAMP
    raise ValueError("reset strategy none has no timestamp")


@dataclass(slots=True)
class TopicPartitionState:
    """State of one assigned partition."""

    position: int | None = None
    reset_strategy: ResetStrategy | None = None  # a pending reset (ListOffsets)
    awaiting_committed: bool = False            # position comes from OffsetFetch first
    epoch: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    buffered: "FetchedRecords | None" = None
    aborted: "AbortedTransactions | None" = None
    backoff_until: int = 0                      # ms of the consumer's monotonic clock
    failures: int = 0
    paused: bool = False                        # pause(): not fetched, position kept

    @property
    def has_position(self) -> bool:
        return self.position is not None and self.reset_strategy is None and not self.awaiting_committed

    def seek(self, offset: int) -> None:
        """Move to `offset`, dropping buffered records and read_committed state
        (design doc "Consumer": cleared on seek, rebuilt from the next fetch)."""
        self.position = offset
        self.reset_strategy = None
        self.awaiting_committed = False
        self._invalidate()

    def request_reset(self, strategy: ResetStrategy) -> None:
        self.reset_strategy = strategy
        self.awaiting_committed = False
        self._invalidate()

    def _invalidate(self) -> None:
        self.epoch += 1
        self.buffered = None
        self.aborted = None
        self.backoff_until = 0
        self.failures = 0

    def advance(self, position: int) -> None:
        """Consumption moved the position forward (keeps buffered/aborted state)."""
        self.position = position

    def backoff(self, now_ms: int, base_ms: float, max_ms: float) -> None:
        """Exponential backoff after a failed request for this partition: not ready
        for min(max_ms, base_ms * 2**(failures - 1)) ms after `now_ms`."""
        self.failures += 1
        self.backoff_until = now_ms + min(max_ms, base_ms * (2 ** (self.failures - 1)))

    def succeeded(self) -> None:
        self.failures = 0
        self.backoff_until = 0

    def ready(self, now_ms: int) -> bool:
        return now_ms >= self.backoff_until


@dataclass
class SubscriptionState:
    """What the consumer reads: a topic subscription (group-managed assignment) or
    a user assignment, and the TopicPartitionState of each assigned partition."""

    default_reset: ResetStrategy = ResetStrategy.LATEST
    subscription: tuple[str, ...] | None = None
    pattern: re.Pattern | None = None
    user_assigned: bool = False
    assignment: dict[TopicPartition, TopicPartitionState] = field(default_factory=dict)

    def subscribe(self, topics: Iterable[str]) -> None:
        """Raises errors.IllegalStateError when partitions were assigned manually."""
        if self.user_assigned:
            raise errors.IllegalStateError("subscribe() is not allowed after assign(); call unsubscribe() first")
        self.pattern = None
        self.subscription = tuple(dict.fromkeys(topics))

    def subscribe_pattern(self, pattern: re.Pattern) -> None:
        """Subscribe to the topics matching `pattern` (none until
        `update_pattern_topics`). Raises errors.IllegalStateError after assign."""
        if self.user_assigned:
            raise errors.IllegalStateError("subscribe() is not allowed after assign(); call unsubscribe() first")
        self.pattern = pattern
        self.subscription = ()

    def update_pattern_topics(self, topics: Iterable[str]) -> bool:
        """With a pattern subscription, set the subscription to the topics of
        `topics` (all the cluster's topic names) that match it. Returns True when
        the subscription changed (the member must rejoin)."""
        if self.pattern is None:
            return False
        matched = matching_topics(self.pattern, topics)
        if matched == self.subscription:
            return False
        self.subscription = matched
        return True

    def unsubscribe(self) -> None:
        """Forget the subscription or user assignment and every partition state."""
        self.subscription = None
        self.pattern = None
        self.user_assigned = False
        self.assignment = {}

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching `partitions` (positions and buffered records are kept).
        Raises errors.IllegalStateError for a partition not assigned (nothing paused)."""
        states = [self.state(TopicPartition(*tp)) for tp in partitions]
        for st in states:
            st.paused = True

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        """Fetch `partitions` again. Raises errors.IllegalStateError for a
        partition not assigned (nothing resumed)."""
        states = [self.state(TopicPartition(*tp)) for tp in partitions]
        for st in states:
            st.paused = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, st in self.assignment.items() if st.paused}

    def assign_from_user(self, partitions: Iterable[TopicPartition]) -> None:
        """Raises errors.IllegalStateError when subscribed to topics."""
        if self.subscription is not None:
            raise errors.IllegalStateError("assign() is not allowed after subscribe(); call unsubscribe() first")
        self.user_assigned = True
        self._set_assignment(partitions)

    def assign_from_group(self, partitions: Iterable[TopicPartition]) -> None:
        self._set_assignment(partitions)

    def _set_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        new: dict[TopicPartition, TopicPartitionState] = {}
        for tp in sorted(set(TopicPartition(*tp) for tp in partitions)):
            new[tp] = self.assignment.get(tp) or TopicPartitionState(awaiting_committed=True)
        self.assignment = new

    def state(self, tp: TopicPartition) -> TopicPartitionState:
        """Raises errors.IllegalStateError for a partition not assigned to this consumer."""
        st = self.assignment.get(tp)
        if st is None:
            raise errors.IllegalStateError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return st

    def positions(self) -> dict[TopicPartition, int]:
        """Known positions of all assigned partitions (what `commit()` commits)."""
        return {tp: st.position for tp, st in self.assignment.items() if st.has_position}

    def fetchable(self, now: float) -> list[TopicPartition]:
        """Partitions with a position, nothing buffered, not paused and not backing off."""
        return [tp for tp, st in self.assignment.items()
                if st.has_position and st.buffered is None and not st.paused and st.ready(now)]

    def awaiting_committed(self) -> list[TopicPartition]:
        return [tp for tp, st in self.assignment.items() if st.awaiting_committed]

    def awaiting_reset(self) -> list[TopicPartition]:
        return [tp for tp, st in self.assignment.items() if st.reset_strategy is not None]

    def apply_committed(self, tp: TopicPartition, epoch: int, offset: int | None) -> None:
        """Result of OffsetFetch sent at `epoch`: seek to `offset`, or, with no
        committed offset (None / -1), fall back to the default reset policy."""
        st = self.assignment.get(tp)
        if st is None or st.epoch != epoch or not st.awaiting_committed:
            return
        if offset is not None and offset >= 0:
            st.seek(offset)
        else:
            st.request_reset(self.default_reset)

    def apply_reset(self, tp: TopicPartition, epoch: int, offset: int) -> None:
        """Result of ListOffsets sent at `epoch` for a pending reset."""
        st = self.assignment.get(tp)
        if st is None or st.epoch != epoch or st.reset_strategy is None:
            return
        st.seek(offset)
