"""bench.transport_floor.floors: the transport's floor of each transaction path counts
the round trips no batching removes (a lone SDK producer's commit: 2 unary calls + 3
stream round trips in sequence; per transaction: the SDK's 2 unary calls, librdkafka's
3 Kafka requests) and the unary call rate of the InitProducerId clients."""
from __future__ import annotations

import pytest

from bench.transport_floor import floors


def _fig(unary: dict, stream: dict, tcp: dict, many: float = 1.0) -> dict:
    base = {"p50_ms": 0.0, "p99_ms": 0.0, "server_cpu_ms_sequential": 0.0, "client_cpu_ms_sequential": 0.0,
            "server_cpu_ms": 0.0, "client_cpu_ms": 0.0, "per_s": 0.0}
    return {"unary": {**base, **unary}, "stream": {**base, **stream}, "tcp": {**base, **tcp},
            "unary_many": {"per_s": many, "server_cpu_ms": 0.0, "client_cpu_ms": 0.0}}


def test_floors_count_the_round_trips_of_each_path():
    f = floors(_fig(unary={"p50_ms": 0.6, "server_cpu_ms": 0.5, "client_cpu_ms_sequential": 0.3},
                    stream={"p50_ms": 0.3, "server_cpu_ms": 0.15, "client_cpu_ms": 0.25},
                    tcp={"server_cpu_ms": 0.04}, many=2000))
    assert f["sdk_commit_p50_ms"] == pytest.approx(2 * 0.6 + 3 * 0.3)
    assert f["sdk_client_cpu_ms_per_txn"] == pytest.approx(2 * 0.3)
    assert f["sdk_server_cpu_ms_per_txn"] == pytest.approx(2 * 0.5)
    assert f["librdkafka_server_cpu_ms_per_txn"] == pytest.approx(3 * 0.04)
    assert f["unary_calls_per_s"] == 2000


def test_stream_round_trips_count_only_in_the_lone_producers_commit():
    cheap = floors(_fig({"p50_ms": 0.6}, {"p50_ms": 0.3, "server_cpu_ms": 0.1, "client_cpu_ms": 0.1}, {}))
    dear = floors(_fig({"p50_ms": 0.6}, {"p50_ms": 0.6, "server_cpu_ms": 0.2, "client_cpu_ms": 0.2}, {}))
    assert dear["sdk_commit_p50_ms"] == pytest.approx(cheap["sdk_commit_p50_ms"] + 3 * 0.3)
    for key in ("sdk_client_cpu_ms_per_txn", "sdk_server_cpu_ms_per_txn", "librdkafka_server_cpu_ms_per_txn"):
        assert dear[key] == cheap[key], key
