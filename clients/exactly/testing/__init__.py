"""Test doubles for applications that use the SDK: `MockCluster`, a whole cluster in
the test's process that a Producer, Consumer or AdminClient (sync or asyncio) takes as
its `transport` instead of the network, with the services' own transaction, log and
consumer-group logic (as httpx ships `MockTransport`); and `MockTime`, a monotonic
clock that moves only when told (Kafka's MockTime), for the cluster's waits and the
project's own tests. docs/testing.md shows a transactional application's unit test."""
from __future__ import annotations

from ._cluster import MockCluster

__all__ = ["MockCluster"]
