"""The principal of the call in progress (docs/design.md, "Security").

`current_principal` is a contextvar holding a principal as Kafka writes it
(`User:<name>`), `ANONYMOUS` when the call presented no identity. The gRPC
authentication interceptor (services.common.security.auth) sets it for every call and the Kafka
listener for each connection's requests; authorization (services.common.security.authz), quotas
and the servicers read it.
"""
from __future__ import annotations

import contextvars

ANONYMOUS = "User:ANONYMOUS"
current_principal: contextvars.ContextVar[str] = contextvars.ContextVar("principal", default=ANONYMOUS)
