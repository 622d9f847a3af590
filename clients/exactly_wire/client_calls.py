"""`Client/Calls`: an SDK's transaction-path calls on one gRPC stream per service,
defined once for the SDK (`exactly._streams`) and the services
(`services.common.transport.tunnel`).

A unary gRPC call costs the client its set-up, headers, trailers and, for a call
started with no other in flight, a thread to drive the channel; a message each way
on an open stream costs a fraction of that. So the SDK sends the calls a
transaction is made of (CARRIED) on one `Client/Calls` stream per service and
matches replies by correlation id, as a Kafka client pipelines its requests on one
connection per broker. Each call is still authenticated, authorized, held by quotas
and handled as the same method called directly.
"""
from __future__ import annotations

import grpc

CLIENT_CALLS_METHOD = "/exactly.v1.Client/Calls"

# The methods carried on `Client/Calls`: the transaction path's calls. The others
# (fetches that park, group membership, metadata, admin) stay direct calls.
CARRIED = frozenset((
    "/exactly.v1.PartitionLeader/Produce",
    "/exactly.v1.TransactionCoordinator/AddPartitionsToTxn",
    "/exactly.v1.TransactionCoordinator/AddOffsetsToTxn",
    "/exactly.v1.TransactionCoordinator/EndTxn",
    "/exactly.v1.GroupCoordinator/TxnOffsetCommit",
))

# The largest request (bytes, serialized) the SDK carries on Client/Calls; a larger one is a
# direct call (its cost is its bytes, which a stream message would copy once more).
MAX_CARRIED_REQUEST_BYTES = 32 * 1024

# What one message carries at most, both ways (and the services' tunnel too): this many
# calls (or replies) and, past the first, this many bytes of requests (or responses).
MAX_BATCH_CALLS = 64
MAX_BATCH_BYTES = 1 << 20
# The largest request (bytes) the SDK carries on a link (Client/Attach), where a frame costs its
# bytes and no flow-control round trips: one message's worth.
MAX_LINKED_REQUEST_BYTES = MAX_BATCH_BYTES


def fits(count: int, size: int, more: int) -> bool:
    """Whether a message of `count` entries and `size` payload bytes takes one more
    entry of `more` bytes (MAX_BATCH_CALLS, MAX_BATCH_BYTES)."""
    return count < MAX_BATCH_CALLS and size + more <= MAX_BATCH_BYTES


class StreamedCallError(grpc.RpcError):
    """A call carried on a stream (Client/Calls, the services' tunnel) that did not get
    a response, as grpc.RpcError of a direct call: the status its method ended with
    (`code()`, `details()`), or the stream's own status when the stream broke."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


_STATUS_BY_VALUE = {s.value[0]: s for s in grpc.StatusCode}


def status(value: int) -> grpc.StatusCode:
    """The grpc.StatusCode of a TunneledReply's `status_code` (UNKNOWN for a value
    gRPC does not define)."""
    return _STATUS_BY_VALUE.get(value, grpc.StatusCode.UNKNOWN)
