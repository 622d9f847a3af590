"""The leader-epoch cache (KIP-101): assignment, OffsetForLeaderEpoch answers,
truncation and the checkpoint file."""
from __future__ import annotations

import pytest

from services.partition_leader.leader_epoch import (CHECKPOINT_FILE, UNDEFINED_EPOCH, UNDEFINED_OFFSET,
                                                    EpochEndOffset, EpochEntry, LeaderEpochCache)


@pytest.fixture
def cache(tmp_path) -> LeaderEpochCache:
    c = LeaderEpochCache(tmp_path)
    for epoch, start in ((0, 0), (2, 10), (5, 25)):
        assert c.assign(epoch, start)
    return c


def test_assign_keeps_epochs_and_offsets_increasing(cache):
    assert not cache.assign(5, 30) and not cache.assign(3, 30)  # not newer than the latest
    assert cache.assign(6, 25)  # same start offset: epoch 5 had no batch, it is replaced
    assert cache.entries == [EpochEntry(0, 0), EpochEntry(2, 10), EpochEntry(6, 25)]
    assert cache.assign(7, 12)  # a start offset inside older epochs drops them (truncated tail)
    assert cache.entries == [EpochEntry(0, 0), EpochEntry(2, 10), EpochEntry(7, 12)]
    assert cache.latest_epoch == 7 and cache.start_offset_of(2) == 10 and cache.start_offset_of(3) is None


@pytest.mark.parametrize("requested, expected", [
    (5, EpochEndOffset(5, 40)),      # the latest epoch ends at the log end
    (9, EpochEndOffset(5, 40)),      # newer than any: the latest
    (2, EpochEndOffset(2, 25)),      # ends where the next epoch starts
    (3, EpochEndOffset(2, 25)),      # unknown epoch: the largest older one
    (0, EpochEndOffset(0, 10)),
    (-1, EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)),
])
def test_end_offset_for(cache, requested, expected):
    assert cache.end_offset_for(requested, log_end_offset=40) == expected


def test_end_offset_for_an_epoch_older_than_all(tmp_path):
    c = LeaderEpochCache(tmp_path, [EpochEntry(3, 7)])
    assert c.end_offset_for(1, 20) == EpochEndOffset(UNDEFINED_EPOCH, 7)
    assert LeaderEpochCache(tmp_path).end_offset_for(1, 20) == EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)


def test_truncate_from_end(cache):
    assert not cache.truncate_from_end(26)
    assert cache.truncate_from_end(25)
    assert cache.entries == [EpochEntry(0, 0), EpochEntry(2, 10)]
    assert cache.truncate_from_end(3) and cache.entries == [EpochEntry(0, 0)]


def test_checkpoint_round_trip_and_kafka_format(cache, tmp_path):
    assert (tmp_path / CHECKPOINT_FILE).read_text() == "0\n3\n0 0\n2 10\n5 25\n"
    assert LeaderEpochCache.load(tmp_path).entries == cache.entries
    cache.truncate_from_end(10)
    assert LeaderEpochCache.load(tmp_path).entries == [EpochEntry(0, 0)]


@pytest.mark.parametrize("text", ["", "1\n1\n0 0\n", "0\n2\n0 0\n", "0\n2\n3 5\n1 9\n", "0\n1\nx y\n"],
                         ids=["empty", "version", "short", "unordered", "garbage"])
def test_unreadable_checkpoints_are_rebuilt(tmp_path, text):
    (tmp_path / CHECKPOINT_FILE).write_text(text)
    assert LeaderEpochCache.load(tmp_path) is None


def test_missing_checkpoint(tmp_path):
    assert LeaderEpochCache.load(tmp_path) is None
