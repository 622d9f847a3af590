"""The compatibility suite (docs/kafka-clients.md, "Compatibility"): unmodified third-party Kafka
clients and stream-processing frameworks against a dev cluster's Kafka listeners.

`make compat` runs it at full size (EXACTLY_COMPAT_FULL=1); `make test` runs the same
tests at a short size (support.size). The suite's modules share one cluster, started by
the `kc` fixture (each test uses its own topics, groups and transactional ids)."""
from __future__ import annotations

import pytest

from clusters import module_cluster


@pytest.fixture(scope="package")
def kc(zk, tmp_path_factory):
    """One dev cluster for tests/compat: 3 partition leaders, 2 transaction
    coordinators, 2 group coordinators, each with its Kafka listener."""
    yield from module_cluster(zk, tmp_path_factory, "compat", leaders=3, txn_coordinators=2,
                              group_coordinators=2)
