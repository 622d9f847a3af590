"""Quota abuse over gRPC at full rate: Produce calls of one 16 KB record, as fast as 200
calls in flight allow, ignoring every throttle, for a while.

    python quota_flood.py MODE LEADER_HOST:PORT TOPIC SECONDS CERTS_DIR [USER]

USER (default mallory) authenticates with CERTS_DIR/USER.pem and .key. MODE "deadline":
0.3 s deadlines; "clientids": a client id per channel of 64, used in turn; "denied": to
a topic USER may not write (refused by the authorizer); any other mode: 5 s deadlines,
four channels. Prints {"answered": n, "failed": n, "throttled": n} at the end."""
from __future__ import annotations

import json
import sys
import threading
import time

from exactly_wire import records
from exactly_wire.clock import wall_clock_ms
from exactly_wire.security import TransportSecurity, secure_channel
from exactly_wire.v1 import exactly_pb2 as pb
from exactly_wire.v1 import exactly_pb2_grpc as pbg

IN_FLIGHT = 200
RECORD_BYTES = 16384


def main() -> None:
    mode, address, topic, seconds, certs = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
    user = sys.argv[6] if len(sys.argv) > 6 else "mallory"
    security = TransportSecurity.from_conf({
        "security.protocol": "SSL", "ssl.ca.location": f"{certs}/ca.pem",
        "ssl.certificate.location": f"{certs}/{user}.pem", "ssl.key.location": f"{certs}/{user}.key"})
    agents = [f"exactly/c{i}" for i in range(64)] if mode == "clientids" else [None] * 4
    stubs = [pbg.PartitionLeaderStub(secure_channel(address, security, [("grpc.primary_user_agent", a)] if a else []))
             for a in agents]
    request = pb.ProduceRequest(acks=1, timeout_ms=10000, topics=[pb.TopicProduceData(name=topic, partitions=[
        pb.PartitionProduceData(partition=0, records=records.encode_batch(
            [(None, b"m" * RECORD_BYTES, (), wall_clock_ms())]))])])
    counts = {"answered": 0, "failed": 0, "throttled": 0}
    lock, slots = threading.Lock(), threading.Semaphore(IN_FLIGHT)

    def done(f):
        slots.release()
        with lock:
            if f.exception() is not None:
                counts["failed"] += 1
            elif f.result().topics[0].partitions[0].error_code == 89:  # THROTTLING_QUOTA_EXCEEDED
                counts["throttled"] += 1
            else:
                counts["answered"] += 1
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        slots.acquire()
        stubs[i % len(stubs)].Produce.future(request, timeout=0.3 if mode == "deadline" else 5).add_done_callback(done)
        i += 1
    for _ in range(IN_FLIGHT):
        slots.acquire(timeout=10)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
