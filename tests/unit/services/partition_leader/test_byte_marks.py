"""Byte positions of a replica's recent offsets (services.partition_leader.byte_marks)."""
from __future__ import annotations

from services.partition_leader.byte_marks import ByteMarks


def test_the_byte_position_of_an_offset_is_what_was_appended_before_its_batch():
    marks = ByteMarks(10)
    marks.appended(13, 300)  # offsets 10..12
    marks.appended(14, 50)  # offset 13
    assert [marks.at(o) for o in (10, 11, 12, 13, 14, 99)] == [0, 0, 0, 300, 350, 350]
    assert marks.at(9) is None  # before the marks began
    assert marks.total == 350


def test_marks_below_the_last_stable_offset_are_forgotten_and_capacity_is_bounded():
    marks = ByteMarks(0, capacity=100)
    for i in range(1, 1001):
        marks.appended(i, 10)
    assert len(marks) == 100 and marks.at(901) == 9010 and marks.at(900) is None
    marks.forget_below(950)
    assert len(marks) == 51 and marks.at(950) == 9500 and marks.at(949) is None
    assert marks.at(1000) == 10000


def test_reset_starts_again_at_the_new_log_end():
    marks = ByteMarks(0)
    marks.appended(5, 500)
    marks.reset(3)
    assert marks.total == 0 and marks.at(3) == 0 and marks.at(2) is None
