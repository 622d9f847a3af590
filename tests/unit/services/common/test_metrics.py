"""services.common.metrics: error codes of responses, the RPC interceptor on a real
in-process grpc.aio server, the /metrics HTTP endpoint, scrape-time collectors."""
from __future__ import annotations

import asyncio
import threading
import urllib.request

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from exactly_tools import design_docs
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg
from services.common import metrics


def sample(name: str, **labels) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


# ------------------------------------------------------------------ error codes

def test_error_codes_at_every_depth_each_once():
    resp = pb.ProduceResponse()
    t = resp.topics.add(name="a")
    t.partitions.add(partition=0, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER)
    t.partitions.add(partition=1, error_code=ErrorCode.NONE)
    t.partitions.add(partition=2, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER)
    resp.topics.add(name="b").partitions.add(partition=0, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert metrics.response_error_codes(resp) == {ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                                  ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}


def test_error_codes_top_level_and_nested_markers():
    assert metrics.response_error_codes(pb.EndTxnResponse(error_code=ErrorCode.PRODUCER_FENCED)) == \
        {ErrorCode.PRODUCER_FENCED}
    assert metrics.response_error_codes(pb.EndTxnResponse()) == set()
    resp = pb.WriteTxnMarkersResponse()
    resp.markers.add(producer_id=1).topics.add(topic="t").partitions.add(
        partition=0, error_code=ErrorCode.TRANSACTION_COORDINATOR_FENCED)
    assert metrics.response_error_codes(resp) == {ErrorCode.TRANSACTION_COORDINATOR_FENCED}


def test_fetch_records_are_not_walked_but_partition_codes_are():
    resp = pb.FetchResponse()
    part = resp.responses.add(topic="t").partitions.add(partition=0, error_code=ErrorCode.OFFSET_OUT_OF_RANGE,
                                                        records=b"x" * 100)
    part.aborted_transactions.add(producer_id=7, first_offset=3)
    assert metrics.response_error_codes(resp) == {ErrorCode.OFFSET_OUT_OF_RANGE}


def test_names():
    assert metrics.code_name(16) == "NOT_COORDINATOR"
    assert metrics.code_name(99999) == "99999"
    assert metrics.split_method("/exactly.v1.PartitionLeader/Produce") == ("PartitionLeader", "Produce")
    assert metrics.split_method("/grpc.health.v1.Health/Check") == ("Health", "Check")


# ------------------------------------------------------------------ the interceptor

class _Coordinator(pbg.TransactionCoordinatorServicer):
    async def EndTxn(self, request, context):
        if request.transactional_id == "boom":
            raise RuntimeError("bug")
        if request.transactional_id == "abort":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no")
        if request.transactional_id == "fenced":
            return pb.EndTxnResponse(error_code=ErrorCode.PRODUCER_FENCED)
        return pb.EndTxnResponse()

    async def AddPartitionsToTxn(self, request, context):
        resp = pb.AddPartitionsToTxnResponse()
        topic = resp.results.add(topic="t")
        topic.partitions.add(partition=0, error_code=ErrorCode.CONCURRENT_TRANSACTIONS)
        topic.partitions.add(partition=1, error_code=ErrorCode.CONCURRENT_TRANSACTIONS)
        return resp


def test_interceptor_times_calls_and_counts_codes_and_transport_failures():
    def err(method: str, code: str) -> float:
        return sample("exactly_rpc_errors_total", service="TransactionCoordinator", method=method, error_code=code)

    before = {
        "count": sample("exactly_rpc_request_duration_seconds_count", service="TransactionCoordinator",
                        method="EndTxn"),
        "fenced": err("EndTxn", "PRODUCER_FENCED"),
        "unknown": err("EndTxn", "GRPC_UNKNOWN"),
        "precondition": err("EndTxn", "GRPC_FAILED_PRECONDITION"),
        "concurrent": err("AddPartitionsToTxn", "CONCURRENT_TRANSACTIONS"),
    }

    async def body():
        server = grpc.aio.server(interceptors=[metrics.RpcMetricsInterceptor()])
        pbg.add_TransactionCoordinatorServicer_to_server(_Coordinator(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pbg.TransactionCoordinatorStub(ch)
                assert (await stub.EndTxn(pb.EndTxnRequest(transactional_id="ok"))).error_code == 0
                assert (await stub.EndTxn(pb.EndTxnRequest(transactional_id="fenced"))).error_code == \
                    ErrorCode.PRODUCER_FENCED
                for tid, status in (("boom", grpc.StatusCode.UNKNOWN), ("abort", grpc.StatusCode.FAILED_PRECONDITION)):
                    with pytest.raises(grpc.aio.AioRpcError) as exc:
                        await stub.EndTxn(pb.EndTxnRequest(transactional_id=tid))
                    assert exc.value.code() == status
                await stub.AddPartitionsToTxn(pb.AddPartitionsToTxnRequest(transactional_id="x"))
        finally:
            await server.stop(None)

    asyncio.run(asyncio.wait_for(body(), 20))
    assert sample("exactly_rpc_request_duration_seconds_count", service="TransactionCoordinator",
                  method="EndTxn") == before["count"] + 4
    assert err("EndTxn", "PRODUCER_FENCED") == before["fenced"] + 1
    assert err("EndTxn", "GRPC_UNKNOWN") == before["unknown"] + 1
    assert err("EndTxn", "GRPC_FAILED_PRECONDITION") == before["precondition"] + 1
    # one answer with the same code on two partitions counts once
    assert err("AddPartitionsToTxn", "CONCURRENT_TRANSACTIONS") == before["concurrent"] + 1


def test_declared_series_exist_at_zero():
    metrics.declare_service(pb.DESCRIPTOR.services_by_name["GroupCoordinator"])
    text = generate_latest(metrics.REGISTRY).decode()
    assert 'exactly_rpc_request_duration_seconds_count{method="SyncGroup",service="GroupCoordinator"}' in text
    assert 'exactly_rpc_errors_total{error_code="NOT_COORDINATOR",method="Heartbeat",service="GroupCoordinator"}' \
        in text


# ------------------------------------------------------------------ /metrics over HTTP

def test_build_info_names_the_release_and_the_python_version():
    import platform
    import tomllib
    release = tomllib.loads((design_docs.ROOT / "pyproject.toml").read_text())
    metrics.declare_build_info()
    labels = {"version": release["project"]["version"], "python_version": platform.python_version()}
    assert sample("exactly_build_info", **labels) == 1
    assert b'exactly_build_info{python_version="%s",version="%s"} 1.0' % (
        labels["python_version"].encode(), labels["version"].encode()) in generate_latest(metrics.REGISTRY)


def test_metrics_server_serves_the_registry_and_stops():
    server = metrics.start_metrics_server(0, "127.0.0.1")
    try:
        host, port = server.address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert "exactly_rpc_request_duration_seconds" in text
        assert "process_cpu_seconds_total" in text or "python_info" in text
        assert "_created" not in text
    finally:
        server.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2)


# ------------------------------------------------------------------ collectors on the loop

class _Things(metrics.LoopCollector):
    def families(self, objects):
        threads = {threading.get_ident()}
        family = GaugeMetricFamily("test_things", "things", labels=["name"])
        for obj in objects:
            family.add_metric([obj.name], obj.value)
        self.threads = threads
        return [family]


class _Thing:
    def __init__(self, name, value):
        self.name, self.value = name, value


def test_loop_collector_reads_on_the_loop_of_the_tracked_objects():
    registry = CollectorRegistry()
    collector = _Things(registry=registry)
    thing = _Thing("a", 3)

    async def body():
        collector.track(thing)
        loop_thread = threading.get_ident()
        # a scrape from another thread while the loop runs
        value = await asyncio.to_thread(registry.get_sample_value, "test_things", {"name": "a"})
        assert value == 3
        assert collector.threads == {loop_thread}

    asyncio.run(body())
    # the loop is gone: read in the scraping thread
    assert registry.get_sample_value("test_things", {"name": "a"}) == 3


def test_loop_collector_failure_gives_an_empty_scrape_not_an_error():
    class Broken(metrics.LoopCollector):
        def families(self, objects):
            raise RuntimeError("bug")

    registry = CollectorRegistry()
    Broken(registry=registry)
    assert generate_latest(registry) == b""
