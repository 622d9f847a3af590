"""Shared fixtures: a real ZooKeeper server per test session and real service
processes per test (exactly_tools.devcluster.DevCluster)."""
from __future__ import annotations

import pathlib
import shutil
import signal

import pytest

import exactly  # noqa: F401  (first: it settles grpc's fork handling before grpc is imported)
from clusters import new_chroot, running_postgres
from exactly_tools.devcluster import DevCluster


def pytest_configure(config) -> None:
    """Stop signals at their defaults in the test processes, and so in every process they
    start, as when `make test` is typed at a terminal. A run started in the background
    (`cmd &` ignores SIGINT) or under nohup (SIGHUP) hands these signals down ignored,
    and an ignored disposition survives exec: a service or example the tests stop with
    SIGTERM or SIGINT would then run on."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def zk(tmp_path_factory) -> str:
    """Address "127.0.0.1:PORT" of a real ZooKeeper server for the whole session."""
    if shutil.which("java") is None:
        pytest.fail("java is required to run ZooKeeper (see README: make test installs it)")
    d = tmp_path_factory.mktemp("zookeeper")
    (d / "logs").mkdir()
    server = DevCluster(d)
    server.start_zookeeper()
    yield server.zookeeper
    server.down()


def _chroot(zk: str, level: int | None = None) -> str:
    return new_chroot(zk, "t", level)


@pytest.fixture
def make_cluster(zk, tmp_path):
    """Factory: make_cluster(partition_leaders=3, txn_coordinators=1, group_coordinators=1,
    props=None, level=None) -> a started DevCluster in its own ZooKeeper chroot (with
    `level`, at that metadata.version instead of the newest); all are torn down after
    the test. Each cluster has .bootstrap_servers, .zookeeper, .services, .kill(name),
    .stop(name), .restart(name), .signal(name, sig)."""
    clusters: list[DevCluster] = []

    def factory(partition_leaders: int = 3, txn_coordinators: int = 1, group_coordinators: int = 1,
                props: dict[str, str] | None = None, level: int | None = None) -> DevCluster:
        d = tmp_path / f"cluster-{len(clusters)}"
        c = DevCluster(pathlib.Path(d), props=dict(props or {}))
        clusters.append(c)
        c.up(partition_leaders, txn_coordinators, group_coordinators, zookeeper=_chroot(zk, level))
        return c

    yield factory
    for c in clusters:
        c.down()


@pytest.fixture
def cluster(make_cluster) -> DevCluster:
    """A started cluster: 3 partition leaders, 1 transaction coordinator, 1 group coordinator."""
    return make_cluster()


@pytest.fixture
def postgres():
    """A started PostgreSQL server (Debian's postgresql, exactly_tools.pgserver) with a
    private data directory on a free port; `.dsn`, `.stop()`, `.start()`, `.kill()`.
    Stopped and deleted after the test."""
    yield from running_postgres()
