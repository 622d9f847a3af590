"""Exactly: the Python SDK of an exactly-once streaming log (Kafka KIP-98 / KIP-447
semantics over gRPC). See docs/design.md, "SDK" for the client API."""
import os as _os

# grpcio's fork handlers, on by default, make a child forked while calls are in flight
# crash now and then before it can exec (about 1 fork in 50 with three busy client
# threads) -- PySpark starts its JVM gateway with exactly such a fork. An Exactly client
# is never shared across fork (a child builds its own), so the handlers buy nothing here.
# Off unless the application chose; grpc reads this once, at its first import.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from . import errors
from .admin import AclBinding, AdminClient
from .consumer import Consumer
from .producer import PreparedTransaction, Producer, complete_transaction, rewind_to_committed
from .types import (ConsumerGroupMetadata, ConsumerRecord, NewTopic, OffsetAndMetadata,
                    OffsetAndTimestamp, RecordMetadata, TopicPartition)

__all__ = ["Producer", "Consumer", "AdminClient", "errors", "NewTopic", "TopicPartition",
           "OffsetAndMetadata", "OffsetAndTimestamp", "ConsumerRecord", "RecordMetadata", "ConsumerGroupMetadata",
           "PreparedTransaction", "complete_transaction", "rewind_to_committed", "AclBinding"]
