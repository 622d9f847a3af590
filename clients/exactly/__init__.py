"""Exactly: the Python SDK of an exactly-once streaming log (Kafka KIP-98 / KIP-447
semantics over gRPC). See docs/design.md, "SDK" for the client API."""
import os as _os

# grpcio's fork handlers off unless the application chose (docs/design.md, "SDK", Fork):
# with them on, PySpark's fork of its JVM gateway sometimes dies during SDK calls.
# grpc reads this once, at its first import.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from exactly_wire import version as _version

from . import errors
from .admin import AclBinding, AdminClient, FeatureUpdate
from ._two_phase import PreparedTransaction, PreparedTxnState, complete_transaction
from .consumer import Consumer, rewind_to_committed
from .producer import Producer, decide_prepared_transaction
from .types import (ConsumerGroupMetadata, ConsumerRecord, NewTopic, OffsetAndMetadata,
                    OffsetAndTimestamp, RecordMetadata, TopicPartition)

__all__ = ["Producer", "Consumer", "AdminClient", "errors", "NewTopic", "TopicPartition",
           "OffsetAndMetadata", "OffsetAndTimestamp", "ConsumerRecord", "RecordMetadata", "ConsumerGroupMetadata",
           "PreparedTransaction", "PreparedTxnState", "complete_transaction", "decide_prepared_transaction",
           "rewind_to_committed", "AclBinding", "FeatureUpdate"]

__version__ = _version()  # the release, as `exactly --version` prints it (pyproject.toml)
