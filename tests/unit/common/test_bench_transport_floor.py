"""bench.transport_floor.floors: the transaction path's floors add up the round trips
each path makes (2 unary + 3 stream for an SDK commit; 3 Kafka requests + 5 stream
round trips, both ends, for the services' CPU per librdkafka transaction)."""
from __future__ import annotations

import pytest

from bench.transport_floor import floors


def _fig(unary: dict, stream: dict, tcp: dict) -> dict:
    base = {"p50_ms": 0.0, "p99_ms": 0.0, "server_cpu_ms_sequential": 0.0, "client_cpu_ms_sequential": 0.0,
            "server_cpu_ms": 0.0, "client_cpu_ms": 0.0, "per_s": 0.0}
    return {"unary": {**base, **unary}, "stream": {**base, **stream}, "tcp": {**base, **tcp}}


def test_floors_add_up_the_round_trips_of_each_path():
    f = floors(_fig(unary={"p50_ms": 0.6, "server_cpu_ms": 0.5, "client_cpu_ms_sequential": 0.3, "per_s": 2000},
                    stream={"p50_ms": 0.3, "server_cpu_ms": 0.15, "client_cpu_ms": 0.25},
                    tcp={"server_cpu_ms": 0.04}))
    assert f["sdk_commit_p50_ms"] == pytest.approx(2 * 0.6 + 3 * 0.3)
    assert f["librdkafka_server_cpu_ms_per_txn"] == pytest.approx(3 * 0.04 + 5 * (0.15 + 0.25))
    assert f["sdk_server_cpu_ms_per_txn"] == pytest.approx(2 * 0.5 + 5 * (0.15 + 0.25))
    assert f["sdk_client_cpu_ms_per_txn"] == pytest.approx(2 * 0.3)
    assert f["unary_calls_per_s"] == 2000


def test_a_costlier_stream_round_trip_raises_every_floor_that_uses_it():
    cheap = floors(_fig({"p50_ms": 0.6}, {"p50_ms": 0.3, "server_cpu_ms": 0.1}, {}))
    dear = floors(_fig({"p50_ms": 0.6}, {"p50_ms": 0.6, "server_cpu_ms": 0.2}, {}))
    for key in ("sdk_commit_p50_ms", "librdkafka_server_cpu_ms_per_txn", "sdk_server_cpu_ms_per_txn"):
        assert dear[key] > cheap[key], key
    assert dear["sdk_client_cpu_ms_per_txn"] == cheap["sdk_client_cpu_ms_per_txn"]
