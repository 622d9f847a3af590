"""A process using the SDK can start children with a preexec_fn fork (as PySpark starts
its JVM gateway) while gRPC calls are in flight: no child dies or hangs before it execs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

# Run in a fresh interpreter: with grpc's fork handlers on, a fork can hang in them, and a
# hang must fail this test, not the test process.
SCENARIO = r'''
import json, subprocess, sys, threading
from concurrent import futures
import exactly
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

server = grpc.server(futures.ThreadPoolExecutor(4))
health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
stop = threading.Event()
calls = [0, 0, 0]

def busy(i):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while not stop.is_set():
            stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            calls[i] += 1

threads = [threading.Thread(target=busy, args=(i,), daemon=True) for i in range(3)]
for t in threads:
    t.start()
codes = [subprocess.Popen(["/bin/true"], stdin=subprocess.PIPE, preexec_fn=lambda: None).wait()
         for _ in range(int(sys.argv[1]))]
stop.set()
for t in threads:
    t.join(timeout=10)
server.stop(0)
print(json.dumps({"calls": calls, "codes": codes}))
'''


def test_the_sdk_turns_grpcs_fork_handlers_off_in_this_process():
    """tests/conftest.py imports exactly before anything imports grpc, so the test process
    (which starts PySpark's JVM gateway) gets the setting too."""
    assert os.environ["GRPC_ENABLE_FORK_SUPPORT"] == "false"


def test_children_forked_during_grpc_calls_all_exec():
    # With grpc's fork handlers on, about 1 child in 50 died before exec (SIGABRT, or an
    # early exit) or hung; 300 forks then fail with probability above 99 %.
    forks = 300
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    scenario = subprocess.Popen([sys.executable, "-c", SCENARIO, str(forks)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = scenario.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(scenario.pid, signal.SIGKILL)  # the scenario and any child hung before exec
        scenario.communicate()
        raise AssertionError("a fork hung: no answer within 120 s") from None
    assert scenario.returncode == 0, err[-2000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert min(result["calls"]) > 0, "the gRPC calls must be in flight while forking"
    codes = result["codes"]
    assert codes == [0] * forks, f"{sum(c != 0 for c in codes)} children died: {sorted(set(codes))}"
