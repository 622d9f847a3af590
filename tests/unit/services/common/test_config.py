"""services.common.config (bind vs advertised host), the event loop a service runs on
(exactly.event.loop), and the health status that services.common.transport.server
derives from a service's `loading` state."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from waiting import wait_for_async
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.transport import server
from services.common.config import ServiceConfig, parse_args

BASE = ["--node-id", "pl-0", "--zookeeper", "zk:2181", "--data-dir", "/tmp/x"]


def test_advertised_host_defaults_to_the_bind_host():
    cfg = parse_args("partition_leader", BASE + ["--host", "10.0.0.5"])
    assert (cfg.host, cfg.advertised_host, cfg.advertised) == ("10.0.0.5", "10.0.0.5", "10.0.0.5")


def test_bind_every_interface_and_advertise_a_name():
    cfg = parse_args("partition_leader", BASE + ["--host", "0.0.0.0", "--advertised-host", "pl-0.pl.ns.svc"])
    assert (cfg.host, cfg.advertised) == ("0.0.0.0", "pl-0.pl.ns.svc")


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
def test_a_wildcard_bind_needs_an_advertised_host(wildcard, capsys):
    with pytest.raises(SystemExit):
        parse_args("txn_coordinator", BASE + ["--host", wildcard])
    assert "--advertised-host" in capsys.readouterr().err


def test_config_built_in_code_advertises_its_host():
    assert ServiceConfig("n", "partition_leader", host="127.0.0.1").advertised == "127.0.0.1"
    assert server._bracketed("::") == "[::]" and server._bracketed("0.0.0.0") == "0.0.0.0"


class _Service:
    loading = False


def test_event_loop_is_uvloop_by_default_and_asyncio_on_request_or_without_uvloop(monkeypatch, caplog):
    import uvloop
    assert parse_args("partition_leader", BASE).settings.event_loop == "uvloop"
    assert server.loop_factory("uvloop") is uvloop.new_event_loop
    assert server.loop_factory("asyncio") is None
    cfg = parse_args("partition_leader", BASE + ["--set", "exactly.event.loop=asyncio"])
    assert cfg.settings.event_loop == "asyncio"
    with pytest.raises(SystemExit):
        parse_args("partition_leader", BASE + ["--set", "exactly.event.loop=trio"])
    monkeypatch.setitem(__import__("sys").modules, "uvloop", None)  # as if not installed
    assert server.loop_factory("uvloop") is None
    assert "uvloop package is not installed" in caplog.text


def test_health_follows_the_loading_state():
    async def body():
        grpc_server = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, grpc_server)
        port = grpc_server.add_insecure_port("127.0.0.1:0")
        await grpc_server.start()
        service = _Service()
        await server._set_health(servicer, health_pb2.HealthCheckResponse.SERVING)
        await server._set_health(servicer, health_pb2.HealthCheckResponse.SERVING, server.LIVENESS)
        watcher = asyncio.create_task(server._follow_loading(service, servicer, 0.01))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = health_pb2_grpc.HealthStub(ch)

                async def status(name: str = "") -> int:
                    return (await stub.Check(health_pb2.HealthCheckRequest(service=name))).status

                async def becomes(expected: int) -> None:
                    async def reached():
                        return await status() == expected
                    await wait_for_async(reached, 5, f"health status {expected}")

                await becomes(health_pb2.HealthCheckResponse.SERVING)
                service.loading = True
                await becomes(health_pb2.HealthCheckResponse.NOT_SERVING)
                assert await status(server.LIVENESS) == health_pb2.HealthCheckResponse.SERVING
                service.loading = False
                await becomes(health_pb2.HealthCheckResponse.SERVING)
        finally:
            watcher.cancel()
            await grpc_server.stop(None)

    asyncio.run(asyncio.wait_for(body(), 20))
