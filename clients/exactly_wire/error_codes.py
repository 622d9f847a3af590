"""Kafka's error codes: one enum with Kafka's names and numbers, shared by the services
and the SDK.

Protocol outcomes travel as these codes inside responses (per partition where the RPC
is per partition); gRPC status codes signal transport failures only (docs/design.md,
"Errors"). `RETRIABLE` lists the codes after which the same request may succeed when
sent again (after backoff and a metadata refresh), as Kafka's `RetriableException`
subclasses; `FATAL` the codes after which a producer must be closed (KIP-1050).
"""
from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    STALE_CONTROLLER_EPOCH = 11
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTION_COORDINATOR_FENCED = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    SECURITY_DISABLED = 54
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    MEMBER_ID_REQUIRED = 79
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    THROTTLING_QUOTA_EXCEEDED = 89  # KIP-599; retriable after the response's throttle_time_ms
    PRODUCER_FENCED = 90
    UNACCEPTABLE_CREDENTIAL = 93  # a SCRAM credential outside the accepted iteration counts
    INVALID_UPDATE_VERSION = 95  # UpdateFeatures: a level that cannot be finalized (KIP-584)
    FEATURE_UPDATE_FAILED = 96  # UpdateFeatures: the finalized features kept changing
    TRANSACTIONAL_ID_NOT_FOUND = 105
    UNSUPPORTED_ENDPOINT_TYPE = 115
    # KIP-447 draft codes. The draft gives both the number 85, which Kafka has since
    # assigned to NO_REASSIGNMENT_IN_PROGRESS; Exactly uses two distinct numbers outside
    # Kafka's range so they can never collide with a Kafka code.
    CONCURRENT_PRODUCER_COMMIT = 1001  # another producer owns the partition in this generation
    PENDING_TRANSACTION = 1002  # an older transaction on newly assigned partitions is completing


RETRIABLE: frozenset[ErrorCode] = frozenset({
    ErrorCode.THROTTLING_QUOTA_EXCEEDED,
    ErrorCode.CORRUPT_MESSAGE,  # Kafka marks it retriable: a resend may arrive intact
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.BROKER_NOT_AVAILABLE,
    ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.CONCURRENT_TRANSACTIONS,
    ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,  # Kafka's InvalidMetadataException subclasses
    ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.UNSTABLE_OFFSET_COMMIT,
    ErrorCode.PENDING_TRANSACTION,
})


# Errors after which a producer instance can do nothing useful and must be closed
# (KIP-98 design document, "Error Handling": a zombie, an invalid timeout, a protocol
# violation; KIP-1050's "application-recoverable" and fatal categories). Every other
# non-retriable error that reaches a transactional producer only aborts the transaction
# (KIP-1050's "abortable"). OUT_OF_ORDER_SEQUENCE_NUMBER is abortable (Kafka >= 2.5,
# KIP-360): the abort ends the transaction under a new epoch, which restarts sequences.
FATAL: frozenset[ErrorCode] = frozenset({
    ErrorCode.PRODUCER_FENCED,
    ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.INVALID_TRANSACTION_TIMEOUT,
    ErrorCode.INVALID_TXN_STATE,
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ErrorCode.SASL_AUTHENTICATION_FAILED,
    ErrorCode.UNSUPPORTED_VERSION,
    ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    ErrorCode.INVALID_CONFIG,
})


__all__ = ["ErrorCode", "RETRIABLE", "FATAL"]
