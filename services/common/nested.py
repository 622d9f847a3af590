"""Two-level maps (key -> inner key -> value), as the coordinators' caches keep
group assignments and committed offsets: a record sets one inner value, a tombstone
removes it, and an inner map left empty goes too."""
from __future__ import annotations

from typing import Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
J = TypeVar("J", bound=Hashable)  # the inner key
V = TypeVar("V")


def put_or_remove(outer: dict[K, dict[J, V]], key: K, inner: J, value: V | None) -> None:
    """Set outer[key][inner] = value, or, for value None (a tombstone), remove
    outer[key][inner] and outer[key] when that leaves it empty. Never raises for a
    missing key."""
    if value is not None:
        outer.setdefault(key, {})[inner] = value
        return
    members = outer.get(key)
    if members is not None:
        members.pop(inner, None)
        if not members:
            del outer[key]


__all__ = ["put_or_remove"]
