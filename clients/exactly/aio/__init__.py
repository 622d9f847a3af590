"""exactly.aio: the SDK for asyncio, on grpc.aio.

`AIOProducer`, `AIOConsumer` and `AIOAdminClient` take the settings of their
synchronous counterparts and run the same I/O-free rules (transaction state,
batching, partitioning, fetch decoding, read_committed filtering, the group
protocol), performing their I/O with `await` (docs/design.md, "SDK"). Create them
inside a running event loop.
"""
from .admin import AIOAdminClient
from .consumer import AIOConsumer
from .producer import AIOProducer

__all__ = ["AIOProducer", "AIOConsumer", "AIOAdminClient"]
