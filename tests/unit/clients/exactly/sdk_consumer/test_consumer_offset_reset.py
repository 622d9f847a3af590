"""Offset reset policy (auto.offset.reset, seek_to_beginning / seek_to_end) and
position initialisation from committed offsets."""
from __future__ import annotations

import pytest

from exactly._consumer_state import (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, LSO_TIMESTAMP, ResetStrategy,
                                     SubscriptionState, reset_timestamp)
from exactly.errors import NoOffsetForPartitionError
from exactly.types import TopicPartition

A = TopicPartition("t", 0)


@pytest.mark.parametrize("text,strategy", [("earliest", ResetStrategy.EARLIEST), ("LATEST", ResetStrategy.LATEST),
                                           ("none", ResetStrategy.NONE), ("smallest", ResetStrategy.EARLIEST),
                                           ("largest", ResetStrategy.LATEST)])
def test_parse(text, strategy):
    assert ResetStrategy.parse(text) is strategy


def test_parse_rejects_unknown():
    with pytest.raises(ValueError):
        ResetStrategy.parse("middle")


@pytest.mark.parametrize("strategy,read_committed,ts", [
    (ResetStrategy.EARLIEST, False, EARLIEST_TIMESTAMP),
    (ResetStrategy.EARLIEST, True, EARLIEST_TIMESTAMP),
    (ResetStrategy.LATEST, False, LATEST_TIMESTAMP),
    (ResetStrategy.LATEST, True, LSO_TIMESTAMP),  # design doc "Discussion on Seeks"
])
def test_reset_timestamp(strategy, read_committed, ts):
    assert reset_timestamp(strategy, read_committed) == ts
    assert (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, LSO_TIMESTAMP) == (-2, -1, -3)


def test_none_has_no_timestamp():
    with pytest.raises(ValueError):
        reset_timestamp(ResetStrategy.NONE, False)


def test_partition_backoff_is_exponential_in_ms_and_cleared_by_success():
    subs = SubscriptionState(default_reset=ResetStrategy.EARLIEST)
    subs.assign_from_user([A])
    st = subs.state(A)
    assert st.ready(0)
    st.backoff(1_000, 100, 250)
    assert not st.ready(1_099) and st.ready(1_100)
    st.backoff(1_100, 100, 250)
    assert not st.ready(1_299) and st.ready(1_300)
    st.backoff(1_300, 100, 250)  # 400 ms capped at 250
    assert not st.ready(1_549) and st.ready(1_550)
    st.succeeded()
    assert st.ready(0) and st.failures == 0


def test_committed_offset_sets_position():
    subs = SubscriptionState(default_reset=ResetStrategy.EARLIEST)
    subs.assign_from_user([A])
    st = subs.state(A)
    assert st.awaiting_committed and not st.has_position
    subs.apply_committed(A, st.epoch, 42)
    assert st.has_position and st.position == 42


@pytest.mark.parametrize("policy", [ResetStrategy.EARLIEST, ResetStrategy.LATEST, ResetStrategy.NONE])
def test_no_committed_offset_falls_back_to_policy(policy):
    subs = SubscriptionState(default_reset=policy)
    subs.assign_from_user([A])
    subs.apply_committed(A, subs.state(A).epoch, None)
    assert subs.state(A).reset_strategy is policy
    assert subs.awaiting_reset() == [A]


def test_stale_committed_or_reset_result_is_ignored_after_seek():
    subs = SubscriptionState(default_reset=ResetStrategy.EARLIEST)
    subs.assign_from_user([A])
    st = subs.state(A)
    old = st.epoch
    st.seek(5)
    subs.apply_committed(A, old, 99)
    assert st.position == 5
    st.request_reset(ResetStrategy.LATEST)
    subs.apply_reset(A, old, 1000)
    assert st.reset_strategy is ResetStrategy.LATEST
    subs.apply_reset(A, st.epoch, 1000)
    assert st.position == 1000 and st.has_position


def test_no_offset_error_lists_partitions():
    err = NoOffsetForPartitionError([TopicPartition("b", 1), A])
    assert err.partitions == [TopicPartition("b", 1), A]
