"""The consumer tests' cluster: an exactly.testing.MockCluster with topic "t" of two
partitions, one per partition leader (t-0 on leader-0, t-1 on leader-1), on the
consumers' virtual clock (group sessions expire as the test moves it); its logs written
by real producers (cluster_logs.Logs)."""
from __future__ import annotations

import pytest

from exactly.testing import MockCluster

from .cluster_logs import Logs, consumer_clock


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
