"""The consumer tests' cluster: an exactly.testing.MockCluster with topic "t" of two
partitions, one per partition leader (t-0 on leader-0, t-1 on leader-1), on the
consumers' virtual clock (group sessions expire as the test moves it); its logs written
by real producers (cluster_logs.Logs)."""
from __future__ import annotations

import pytest

from exactly.testing import MockCluster

from .cluster_logs import Logs, consumer_clock, make_consumer


@pytest.fixture
def clock():
    return consumer_clock()


@pytest.fixture
def cluster(clock):
    with MockCluster({"t": 2}, {"auto.create.topics.enable": False}, clock, partition_leaders=2) as c:
        yield c


@pytest.fixture
def logs(cluster):
    written = Logs(cluster)
    yield written
    written.close()


@pytest.fixture
def consumer_defaults() -> dict:
    """Settings every consumer of `make` starts from (a test module overrides it)."""
    return {}


@pytest.fixture
def make(cluster, clock, consumer_defaults):
    """make(**conf) -> a Consumer of the cluster (`consumer_defaults` under `conf`),
    closed after the test."""
    made = []

    def _make(**conf):
        made.append(make_consumer(cluster, clock, **{**consumer_defaults, **conf}))
        return made[-1]

    yield _make
    for c in made:
        c.close()
