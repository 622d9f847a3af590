"""Startup, readiness and liveness probe of a secured Exactly pod (exec probe).

    python /etc/exactly/probe.py PORT [SERVICE]

Calls grpc.health.v1 Check(SERVICE) (default "": ready; "liveness": the process runs) on
the pod's own gRPC port over TLS, with the pod's certificate as client certificate (the
services require one; the kubelet's native gRPC probe cannot present it). It connects to
the pod IP and verifies the server's certificate against the CA for the pod's DNS name,
as every other client does. Exits 0 when the answer is SERVING, 1 otherwise.

Environment (set by the chart): POD_NAME, POD_IP, POD_FQDN; the TLS material is in
EXACTLY_TLS_DIR (default /etc/exactly-tls): ca.crt, <POD_NAME>.crt, <POD_NAME>.key.
"""
from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    if not 2 <= len(argv) <= 3:
        print("usage: probe.py PORT [SERVICE]", file=sys.stderr)
        return 2
    port, service = argv[1], argv[2] if len(argv) == 3 else ""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    tls_dir = os.environ.get("EXACTLY_TLS_DIR", "/etc/exactly-tls")
    pod = os.environ["POD_NAME"]

    def read(name: str) -> bytes:
        with open(os.path.join(tls_dir, name), "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(root_certificates=read("ca.crt"), private_key=read(f"{pod}.key"),
                                               certificate_chain=read(f"{pod}.crt"))
    host = os.environ.get("POD_IP") or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    options = [("grpc.ssl_target_name_override", os.environ["POD_FQDN"])]
    timeout_s = float(os.environ.get("EXACTLY_PROBE_TIMEOUT_S", "2"))
    with grpc.secure_channel(f"{host}:{port}", credentials, options=options) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            print(f"health check {service!r} failed: {exc.code().name} {exc.details()}", file=sys.stderr)
            return 1
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"health check {service!r}: {health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
