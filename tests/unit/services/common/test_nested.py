"""services.common.nested: the two-level maps of the coordinators' caches."""
from services.common.nested import put_or_remove


def test_a_value_is_set_and_a_tombstone_removes_it_with_its_empty_inner_map():
    groups: dict[str, dict[str, int]] = {}
    put_or_remove(groups, "g", "t1", 1)
    put_or_remove(groups, "g", "t2", 2)
    put_or_remove(groups, "g", "t1", 3)
    assert groups == {"g": {"t1": 3, "t2": 2}}
    put_or_remove(groups, "g", "t1", None)
    assert groups == {"g": {"t2": 2}}
    put_or_remove(groups, "g", "t2", None)
    assert groups == {}


def test_a_tombstone_of_an_unknown_key_changes_nothing():
    groups = {"g": {"t": 1}}
    put_or_remove(groups, "other", "t", None)
    put_or_remove(groups, "g", "unknown", None)
    assert groups == {"g": {"t": 1}}
