"""Exactly: the Python SDK of an exactly-once streaming log (Kafka KIP-98 / KIP-447
semantics over gRPC). See DESIGN.md §7 for the client API."""
from . import errors
from .types import (ConsumerGroupMetadata, ConsumerRecord, NewTopic, OffsetAndMetadata,
                    RecordMetadata, TopicPartition)

__all__ = ["errors", "NewTopic", "TopicPartition", "OffsetAndMetadata", "ConsumerRecord",
           "RecordMetadata", "ConsumerGroupMetadata"]
