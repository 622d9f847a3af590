"""ClientCore: bootstrap parsing, the transport-error seam, metadata and
coordinator caches, and the retry helper (docs/design.md, "Code conventions"), against
exactly.testing.MockCluster (and a closed port for the real transport's errors)."""
import socket

import grpc
import pytest

from exactly import errors
from exactly._client import COORDINATOR_GROUP, COORDINATOR_TRANSACTION, ClientCore, translate_rpc_error
from exactly.config import AdminSchema
from exactly_wire.config import parse
from exactly_wire.clock import SYSTEM_CLOCK
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb

from exactly.testing import MockCluster, MockTime


@pytest.fixture
def fc():
    with MockCluster({"t": 2}) as cluster:
        yield cluster


def dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def core_for(*addresses, clock=SYSTEM_CLOCK, transport=None, **conf) -> ClientCore:
    """A core bootstrapping from `addresses`, over `transport` (a MockCluster), else the network."""
    return ClientCore(parse(AdminSchema, {"bootstrap.servers": ",".join(addresses), "retry.backoff.ms": 10,
                                          "retry.backoff.max.ms": 40, "request.timeout.ms": 2000, **conf}), clock,
                      transport)


def mock_core(cluster, clock=SYSTEM_CLOCK, **conf) -> ClientCore:
    return core_for(cluster.bootstrap_servers, clock=clock, transport=cluster, **conf)


def calls(cluster, rpc):
    return len(cluster.requests_of(rpc))


def test_bootstrap_servers_are_host_port_entries():
    assert parse(AdminSchema, {"bootstrap.servers": "a:1, b:2,"}).bootstrap_addresses == ["a:1", "b:2"]
    for bad in ("", ",", "host", "h:x", ":1"):
        with pytest.raises(errors.ConfigurationError, match="bootstrap.servers") as info:
            parse(AdminSchema, {"bootstrap.servers": bad})
        assert info.value.key == "bootstrap.servers"
    with pytest.raises(errors.ConfigurationError, match="bootstrap.servers is required"):
        parse(AdminSchema, {})


class _RpcError(grpc.RpcError):
    def __init__(self, code, details="boom"):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("status,cls,retriable", [
    (grpc.StatusCode.UNAVAILABLE, errors.NetworkException, True),
    (grpc.StatusCode.CANCELLED, errors.NetworkException, True),
    (grpc.StatusCode.DEADLINE_EXCEEDED, errors.RequestTimedOutError, True),
    (grpc.StatusCode.UNIMPLEMENTED, errors.UnsupportedVersionError, False),
    (grpc.StatusCode.INTERNAL, errors.UnknownServerError, False),
    (grpc.StatusCode.UNKNOWN, errors.UnknownServerError, False),
])
def test_transport_errors_become_sdk_errors(status, cls, retriable):
    exc = translate_rpc_error(_RpcError(status))
    assert type(exc) is cls and exc.retriable is retriable and "boom" in str(exc)


def test_call_translates_and_never_leaks_grpc():
    core = core_for(dead_address())
    with pytest.raises(errors.NetworkException) as info:
        core.call(core.cluster_stub().Metadata, pb.MetadataRequest())
    assert not isinstance(info.value, grpc.RpcError) and info.value.retriable
    fut = core.call_future(core.cluster_stub().Metadata, pb.MetadataRequest())
    assert isinstance(fut.exception(5), errors.NetworkException)
    core.close()


def test_metadata_is_cached_and_refreshed(fc):
    core = mock_core(fc)
    md = core.metadata()
    assert md.partitions("t") == [0, 1] and md.leader("t", 1) == fc.address_of("leader-0")
    assert md.leader("t", 9) is None and md.partitions("missing") == []
    assert core.metadata() is md and calls(fc, "Metadata") == 1
    assert core.metadata(refresh=True) is not md and calls(fc, "Metadata") == 2
    fc.create_topic("new", 3)
    assert core.partitions_for("new") == [0, 1, 2]  # a missing topic triggers a refresh
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        core.partitions_for("missing")
    assert core.leader_for("t", 0) == fc.address_of("leader-0")
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        core.leader_for("t", 7)
    core.close()


def test_metadata_max_age(fc):
    clock = MockTime()
    core = mock_core(fc, clock=clock, **{"metadata.max.age.ms": 5})
    core.metadata()
    clock.advance(5)
    core.metadata()
    assert calls(fc, "Metadata") == 1  # not older than metadata.max.age.ms yet
    clock.advance(1)
    core.metadata()
    assert calls(fc, "Metadata") == 2
    core.close()


def test_bootstrap_skips_a_node_that_is_down(fc):
    fc.take_down("leader-0")
    core = core_for(fc.address_of("leader-0"), fc.bootstrap_servers, transport=fc)
    for _ in range(3):
        assert core.metadata(refresh=True).partitions("t") == [0, 1]
    assert calls(fc, "Metadata") == 3  # the node that is down answered none
    core.close()


def test_a_call_without_metadata_names_why_the_last_refresh_failed(fc):
    fc.take_down("leader-0")
    core = core_for(fc.address_of("leader-0"), transport=fc)
    with pytest.raises(errors.NetworkException, match="^no cluster metadata yet$"):
        core.metadata_nowait()  # a refresh starts in the background
    refresh = core.pending_refresh()
    if refresh is not None:
        refresh.exception(5)  # wait: it fails, the only service is down
    with pytest.raises(errors.NetworkException, match="no cluster metadata yet: UNAVAILABLE: leader-0 is down") as info:
        core.metadata_nowait()
    assert info.value.retriable
    core.close()


def test_find_coordinator_retries_and_caches(fc):
    clock = MockTime(runs=True)
    core = mock_core(fc, clock=clock)
    txn_coordinator = fc.address_of("txn-coordinator")
    fc.fail_next("FindCoordinator", ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    assert core.find_coordinator("tx", COORDINATOR_TRANSACTION) == txn_coordinator
    assert calls(fc, "FindCoordinator") == 3
    core.find_coordinator("tx", COORDINATOR_TRANSACTION)
    assert calls(fc, "FindCoordinator") == 3  # cached
    assert core.find_coordinator("tx", COORDINATOR_GROUP) == fc.address_of("group-coordinator")  # another entry
    assert calls(fc, "FindCoordinator") == 4
    core.invalidate_coordinator("tx", COORDINATOR_TRANSACTION)
    core.find_coordinator("tx", COORDINATOR_TRANSACTION)
    assert calls(fc, "FindCoordinator") == 5
    fc.take_down("txn-coordinator")  # FindCoordinator answers COORDINATOR_NOT_AVAILABLE
    start = clock.now_s()
    with pytest.raises(errors.CoordinatorNotAvailableError):
        core.find_coordinator("other", COORDINATOR_TRANSACTION, timeout_s=0.2)
    # retried until 0.2 s (virtual); the last try starts less than one backoff (40 ms + jitter) before
    assert 0.2 - 0.05 <= clock.now_s() - start < 1.0
    core.close()


def test_coordinator_call_refinds_on_not_coordinator(fc):
    core = mock_core(fc)
    init = core.call(core.cluster_stub().FindCoordinator, pb.FindCoordinatorRequest(key="tx", key_type=1))
    pid = core.call(core.txn_stub(f"{init.host}:{init.port}").InitProducerId, pb.InitProducerIdRequest(
        transactional_id="tx", transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1)).producer_id
    finds = calls(fc, "FindCoordinator")
    fc.fail_next("EndTxn", ErrorCode.NOT_COORDINATOR)
    end = pb.EndTxnRequest(transactional_id="tx", producer_id=pid, producer_epoch=0)
    with pytest.raises(errors.InvalidTxnStateError):  # asked again, the coordinator: nothing to end
        core.coordinator_call("tx", COORDINATOR_TRANSACTION, lambda a: core.txn_stub(a).EndTxn, end)
    assert calls(fc, "EndTxn") == 2 and calls(fc, "FindCoordinator") == finds + 2
    core.close()


def test_retry_helper():
    clock = MockTime(runs=True)
    core = core_for("127.0.0.1:1", clock=clock)
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise errors.NotLeaderOrFollowerError()
        return "ok"

    seen = []
    assert core.retry(flaky, timeout_s=5, on_retry=seen.append) == "ok"
    assert len(attempts) == 3 and all(isinstance(e, errors.NotLeaderOrFollowerError) for e in seen)

    def fatal():
        attempts.append(1)
        raise errors.InvalidRequestError()

    attempts.clear()
    with pytest.raises(errors.InvalidRequestError):
        core.retry(fatal, timeout_s=5)
    assert len(attempts) == 1

    start = clock.now_s()
    with pytest.raises(errors.LeaderNotAvailableError):
        core.retry(lambda: (_ for _ in ()).throw(errors.LeaderNotAvailableError()), timeout_s=0.2)
    assert 0.2 - 0.05 <= clock.now_s() - start < 1.0  # virtual time
    core.close()


def test_closed_core_refuses_new_channels():
    core = core_for("127.0.0.1:1")
    core.close()
    core.close()
    with pytest.raises(errors.IllegalStateError):
        core.cluster_stub("127.0.0.1:2")


def test_cancelling_a_call_future_cancels_quietly(fc):
    core = mock_core(fc)
    held = fc.hold_next("Produce")
    fut = core.call_future(core.leader_stub(fc.address_of("leader-0")).Produce, pb.ProduceRequest())
    assert held.arrived.is_set() and not fut.done()
    assert fut.cancel()
    assert fut.cancelled()
    held.release()  # its answer comes to nobody
    ok = core.call_future(core.cluster_stub().Metadata, pb.MetadataRequest())
    assert ok.result(5).nodes
    core.close()
