"""The fork-safe transport (exactly._fork, grpclib) with SASL, against an in-process
gRPC server: one SaslAuthenticate exchange, then only the session token in each call's
metadata, never the password (docs/design.md, "SASL")."""
from __future__ import annotations

import asyncio

import grpc

from exactly._fork import _Connection
from exactly_wire.security import SASL_TOKEN_HEADER, TransportSecurity
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.security.auth import UserStore, create_user_credentials, parse_user_credentials
from services.common.security.sasl import SaslGateway, SessionTokens
from services.common.transport.server import sasl_authenticate

PASSWORD = "fork-safe secret"


def test_the_fork_transport_authenticates_once_and_sends_only_the_token():
    users = UserStore()
    users.put("dave", *parse_user_credentials(create_user_credentials(PASSWORD, 4096)).values())
    gateway = SaslGateway(users, tokens=SessionTokens(b"k" * 32, users), failed_delay_ms=0)
    seen: list[tuple[str, dict, bytes]] = []

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            method = details.method

            async def handle(request: bytes, context):
                md = {k: v for k, v in context.invocation_metadata()}
                seen.append((method, md, request))
                if method.endswith("/SaslAuthenticate"):
                    resp = await sasl_authenticate(gateway, pb.SaslAuthenticateRequest.FromString(request),
                                                   context.peer())
                    return resp.SerializeToString()
                assert gateway.tokens.verify(md[SASL_TOKEN_HEADER]) == "dave"
                return pb.MetadataResponse().SerializeToString()
            return grpc.unary_unary_rpc_method_handler(handle)

    async def main():
        server = grpc.aio.server(handlers=[Handler()])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        security = TransportSecurity.from_conf({"security.protocol": "SASL_PLAINTEXT",
                                                    "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "dave",
                                                    "sasl.password": PASSWORD})
        conn = _Connection(f"127.0.0.1:{port}", security)
        try:
            for _ in range(3):
                await conn.call("/exactly.v1.Cluster/Metadata", pb.MetadataRequest(),
                                pb.MetadataRequest.SerializeToString, pb.MetadataResponse.FromString, 10)
        finally:
            conn.close()
            await server.stop(0)
    asyncio.run(asyncio.wait_for(main(), 30))
    methods = [m for m, _, _ in seen]
    assert methods.count("/exactly.v1.Cluster/SaslAuthenticate") == 2 and methods.count(
        "/exactly.v1.Cluster/Metadata") == 3
    for _, md, body in seen:
        assert PASSWORD not in "".join(f"{k}{v}" for k, v in md.items()) and PASSWORD.encode() not in body
