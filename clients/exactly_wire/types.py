"""Value types of the protocol vocabulary shared by the services and the SDK."""
from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    """One partition of a topic; hashable and ordered (topic, then partition).

    A plain `(topic, partition)` tuple compares and hashes equal to it, so domain
    code may key maps by either."""

    topic: str
    partition: int


__all__ = ["TopicPartition"]
