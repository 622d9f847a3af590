"""Test doubles for applications that use the SDK: `MockCluster`, a whole cluster in
the test's process that a Producer, Consumer or AdminClient (sync or asyncio) takes as
its `transport` instead of the network, with the services' own transaction, log and
consumer-group logic (as httpx ships `MockTransport`), and faults a test injects (a node
down, a partition's leader moved, the next answers of an RPC, a request held); and
`MockTime`, a clock that moves only when told (Kafka's MockTime), for the cluster's time
and the project's own tests. The project's own tests use them as its users do.
docs/testing.md shows a transactional application's unit test and the fault injection."""
from __future__ import annotations

from ._cluster import CompletedTransaction, MockCluster, Request
from ._faults import Held
from ._time import MockTime

__all__ = ["MockCluster", "MockTime", "Held", "Request", "CompletedTransaction"]
