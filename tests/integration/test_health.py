"""grpc.health.v1 on real service processes: every service kind answers SERVING once
it is ready (and "liveness" SERVING while it runs); a coordinator answers NOT_SERVING
while it loads a partition of its log, at start-up and after it takes over the
partitions of a coordinator that stopped, then SERVING again.

Loads of an empty log take milliseconds, so the coordinator tests stretch them with
the test-only setting `exactly.test.load.delay.ms` (every read of a partition that is
still loading waits that long first; see the coordinators' service.py)."""
from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clusters import REPLICATED_TXN_LOG
from waiting import wait_for

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNREACHABLE = -1
LOAD_DELAY_MS = 1500


def check(address: str, service: str = "") -> int:
    """Health status of `service` at `address`; UNREACHABLE when nothing answers."""
    with grpc.insecure_channel(address) as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=1).status
        except grpc.RpcError:
            return UNREACHABLE


class HealthRecorder:
    """Polls the health of one address every 20 ms in a thread and records changes
    of (overall status, liveness status) with their time."""

    def __init__(self, address: str):
        self.address = address
        self.changes: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "HealthRecorder":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        # Reconnect fast: the process may not listen yet (a restart).
        options = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.min_reconnect_backoff_ms", 20),
                   ("grpc.max_reconnect_backoff_ms", 50)]
        with grpc.insecure_channel(self.address, options=options) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not self._stop.is_set():
                statuses = []
                for name in ("", "liveness"):
                    try:
                        statuses.append(stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=1).status)
                    except grpc.RpcError:
                        statuses.append(UNREACHABLE)
                if not self.changes or self.changes[-1][1:] != tuple(statuses):
                    self.changes.append((time.monotonic(), *statuses))
                time.sleep(0.02)

    def statuses(self) -> list[int]:
        return [overall for _, overall, _ in self.changes]

    def wait_seen(self, status: int, since: int, timeout_s: float) -> None:
        """Wait until `status` was recorded at or after change number `since` (it may
        have come and gone already)."""
        wait_for(lambda: any(overall == status for _, overall, _ in self.changes[since:]), timeout_s,
                 lambda: f"{self.address}: health {status} since change {since}; recorded {self.changes}",
                 interval_s=0.02)

    def wait_status(self, status: int, timeout_s: float) -> None:
        """Until the last recorded overall status is `status`."""
        wait_for(lambda: self.changes and self.changes[-1][1] == status, timeout_s,
                 lambda: f"{self.address}: health {status}; recorded {self.changes}", interval_s=0.02)

    def not_serving_seconds(self) -> float:
        """Length of the longest NOT_SERVING stretch that SERVING ended."""
        stretches = [t1 - t0 for (t0, s0, _), (t1, s1, _) in zip(self.changes, self.changes[1:])
                     if s0 == NOT_SERVING and s1 == SERVING]
        assert stretches, f"{self.address}: no NOT_SERVING -> SERVING in {self.changes}"
        return max(stretches)


def test_every_service_kind_serves_once_ready(make_cluster):
    cluster = make_cluster(partition_leaders=1, txn_coordinators=1, group_coordinators=1)
    assert {s.role for s in cluster.services.values()} == {"partition_leader", "txn_coordinator",
                                                           "group_coordinator"}
    for svc in cluster.services.values():
        assert check(svc.address) == SERVING, svc.name
        assert check(svc.address, "liveness") == SERVING, svc.name
        # exactly.event.loop's default: every service runs on uvloop.
        assert "event loop uvloop" in (cluster.dir / "logs" / f"{svc.name}.log").read_text(), svc.name
        with grpc.insecure_channel(svc.address) as channel:
            with pytest.raises(grpc.RpcError) as exc:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="nope"), timeout=2)
            assert exc.value.code() == grpc.StatusCode.NOT_FOUND

    # A restarted partition leader serves again (its partitions are open before SERVING).
    leader = cluster.services["pl-0"]
    cluster.stop("pl-0")
    assert check(leader.address) == UNREACHABLE
    with HealthRecorder(leader.address) as rec:
        cluster.restart("pl-0")
        rec.wait_status(SERVING, 10)
    assert NOT_SERVING not in rec.statuses()[rec.statuses().index(SERVING):]


@pytest.mark.parametrize("role,prefix", [("txn_coordinator", "txn"), ("group_coordinator", "group")])
def test_coordinator_is_not_serving_while_it_loads_a_partition(make_cluster, role, prefix):
    counts = {"txn_coordinators": 1, "group_coordinators": 1}
    counts[f"{prefix}_coordinators"] = 2
    cluster = make_cluster(partition_leaders=2, props={"exactly.test.load.delay.ms": str(LOAD_DELAY_MS),
                                                       **REPLICATED_TXN_LOG}, **counts)
    first, second = cluster.services[f"{prefix}-0"], cluster.services[f"{prefix}-1"]
    assert first.role == second.role == role
    assert check(first.address) == check(second.address) == SERVING

    # Take-over: once `second` stops, `first` is elected for its partitions and loads them.
    with HealthRecorder(first.address) as rec:
        rec.wait_status(SERVING, 5)
        before_stop = len(rec.changes)
        # The take-over may begin, and even end, while `stop` still waits for the
        # process to exit (it resigns its partitions first).
        cluster.stop(second.name)
        rec.wait_seen(NOT_SERVING, before_stop, 30)
        rec.wait_status(SERVING, 30)
    statuses = rec.statuses()
    assert statuses[0] == SERVING and NOT_SERVING in statuses and statuses[-1] == SERVING, rec.changes
    assert UNREACHABLE not in statuses, rec.changes
    assert rec.not_serving_seconds() >= LOAD_DELAY_MS / 1000 * 0.8, rec.changes
    assert all(live == SERVING for _, _, live in rec.changes), rec.changes  # liveness is unaffected

    # Start-up: the restarted coordinator is NOT_SERVING until its partitions are loaded.
    with HealthRecorder(second.address) as rec:
        cluster.restart(second.name)
        rec.wait_status(SERVING, 10)
    statuses = [s for s in rec.statuses() if s != UNREACHABLE]
    assert statuses[0] == NOT_SERVING and statuses[-1] == SERVING, rec.changes
    assert rec.not_serving_seconds() >= LOAD_DELAY_MS / 1000 * 0.8, rec.changes
    assert check(first.address) == SERVING  # giving partitions away needs no load
