"""Error codes and exceptions of the SDK.

One exception class per Kafka error code (`ErrorCode`, Kafka's names and numbers),
each a subclass of `ExactlyError`, written out below so that grep, IDEs and type
checkers see them. Protocol outcomes travel as these codes inside responses
(docs/design.md, "Errors"); the SDK raises the matching class via `for_code(code)`.

Every error carries the classification of Kafka's KIP-1050, as class attributes:

- `retriable`: the same request may succeed if sent again (after backoff and a
  metadata refresh). The SDK already retries these internally until its timeouts;
  when one reaches the application the operation may be called again.
- `txn_requires_abort`: the open transaction cannot commit; call
  `abort_transaction()`, rewind the input and run the transaction again
  (KIP-1050's "abortable" errors).
- `fatal`: the producer instance can do nothing useful any more (fenced by a newer
  instance, not authorized, misconfigured, KIP-98 design document "Error Handling");
  close it (and, for a fenced zombie, stop working on its input).

Exactly one of the three holds for every class with a code of its own. The sets they derive from are
`exactly_wire.error_codes.RETRIABLE` and `FATAL`.

    try:
        with producer.transaction():
            ...
    except errors.ExactlyError as e:
        if e.fatal:
            raise          # the producer is closed
        ...                # abortable: the transaction was aborted; rewind, go on
"""
from __future__ import annotations

from typing import ClassVar, Iterable

from exactly_wire import config
from exactly_wire.error_codes import FATAL, RETRIABLE, ErrorCode
from exactly_wire.types import TopicPartition


class ExactlyError(Exception):
    """Base of every SDK error.

    Attributes: `code` (ErrorCode), `message` (str), and the class-level
    classification `retriable`, `fatal`, `txn_requires_abort` (see the module
    docstring). Subclasses set only `code`; the classification follows from it.
    """

    code: ClassVar[ErrorCode] = ErrorCode.UNKNOWN_SERVER_ERROR
    retriable: ClassVar[bool] = False
    fatal: ClassVar[bool] = False
    txn_requires_abort: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            cls.retriable = cls.code in RETRIABLE
            cls.fatal = cls.code in FATAL
            cls.txn_requires_abort = not (cls.retriable or cls.fatal)

    def __init__(self, message: str | None = None):
        super().__init__(message or self.code.name)
        self.message = message or self.code.name


class UnknownServerError(ExactlyError):
    """The server hit an unexpected error while processing the request.

    Kafka error code -1 (UNKNOWN_SERVER_ERROR)."""

    code = ErrorCode.UNKNOWN_SERVER_ERROR


class OffsetOutOfRangeError(ExactlyError):
    """The requested offset is not within the partition's range (below the log start offset or above
    the high watermark).

    Kafka error code 1 (OFFSET_OUT_OF_RANGE)."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE


class CorruptMessageError(ExactlyError):
    """A record batch failed its CRC check or is malformed.

    Kafka error code 2 (CORRUPT_MESSAGE)."""

    code = ErrorCode.CORRUPT_MESSAGE


class UnknownTopicOrPartitionError(ExactlyError):
    """The topic or partition does not exist (or its metadata has not reached this service yet).

    Kafka error code 3 (UNKNOWN_TOPIC_OR_PARTITION)."""

    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class InvalidFetchSizeError(ExactlyError):
    """The requested fetch size is invalid.

    Kafka error code 4 (INVALID_FETCH_SIZE)."""

    code = ErrorCode.INVALID_FETCH_SIZE


class LeaderNotAvailableError(ExactlyError):
    """The partition has no leader right now (an election is in progress).

    Kafka error code 5 (LEADER_NOT_AVAILABLE)."""

    code = ErrorCode.LEADER_NOT_AVAILABLE


class NotLeaderOrFollowerError(ExactlyError):
    """The service addressed is not the partition's leader: refresh metadata and retry.

    Kafka error code 6 (NOT_LEADER_OR_FOLLOWER)."""

    code = ErrorCode.NOT_LEADER_OR_FOLLOWER


class RequestTimedOutError(ExactlyError):
    """The request or a client-side wait (flush, commit, init) ran out of time.

    Kafka error code 7 (REQUEST_TIMED_OUT)."""

    code = ErrorCode.REQUEST_TIMED_OUT


class BrokerNotAvailableError(ExactlyError):
    """The service is not available.

    Kafka error code 8 (BROKER_NOT_AVAILABLE)."""

    code = ErrorCode.BROKER_NOT_AVAILABLE


class ReplicaNotAvailableError(ExactlyError):
    """The replica is not available for the requested partition.

    Kafka error code 9 (REPLICA_NOT_AVAILABLE)."""

    code = ErrorCode.REPLICA_NOT_AVAILABLE


class MessageTooLargeError(ExactlyError):
    """The record batch is larger than the largest size the service accepts.

    Kafka error code 10 (MESSAGE_TOO_LARGE)."""

    code = ErrorCode.MESSAGE_TOO_LARGE


class StaleControllerEpochError(ExactlyError):
    """The request carries an old controller epoch.

    Kafka error code 11 (STALE_CONTROLLER_EPOCH)."""

    code = ErrorCode.STALE_CONTROLLER_EPOCH


class OffsetMetadataTooLargeError(ExactlyError):
    """The metadata string of a committed offset is too large.

    Kafka error code 12 (OFFSET_METADATA_TOO_LARGE)."""

    code = ErrorCode.OFFSET_METADATA_TOO_LARGE


class NetworkException(ExactlyError):
    """The connection was lost before a response arrived.

    Kafka error code 13 (NETWORK_EXCEPTION)."""

    code = ErrorCode.NETWORK_EXCEPTION


class CoordinatorLoadInProgressError(ExactlyError):
    """The coordinator is still loading its partition of the internal topic.

    Kafka error code 14 (COORDINATOR_LOAD_IN_PROGRESS)."""

    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


class CoordinatorNotAvailableError(ExactlyError):
    """The coordinator is not available.

    Kafka error code 15 (COORDINATOR_NOT_AVAILABLE)."""

    code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class NotCoordinatorError(ExactlyError):
    """This service is not the coordinator of that transactional.id or group.

    Kafka error code 16 (NOT_COORDINATOR)."""

    code = ErrorCode.NOT_COORDINATOR


class InvalidTopicException(ExactlyError):
    """The request names an invalid topic (or an internal one the caller may not write).

    Kafka error code 17 (INVALID_TOPIC_EXCEPTION)."""

    code = ErrorCode.INVALID_TOPIC_EXCEPTION


class RecordListTooLargeError(ExactlyError):
    """The request holds more record bytes than the service accepts.

    Kafka error code 18 (RECORD_LIST_TOO_LARGE)."""

    code = ErrorCode.RECORD_LIST_TOO_LARGE


class NotEnoughReplicasError(ExactlyError):
    """Fewer in-sync replicas than min.insync.replicas: the write was refused.

    Kafka error code 19 (NOT_ENOUGH_REPLICAS)."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS


class NotEnoughReplicasAfterAppendError(ExactlyError):
    """The write was appended but fewer in-sync replicas than min.insync.replicas confirmed it.

    Kafka error code 20 (NOT_ENOUGH_REPLICAS_AFTER_APPEND)."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


class InvalidRequiredAcksError(ExactlyError):
    """The acks value of the request is invalid.

    Kafka error code 21 (INVALID_REQUIRED_ACKS)."""

    code = ErrorCode.INVALID_REQUIRED_ACKS


class IllegalGenerationError(ExactlyError):
    """The generation id is not the group's current generation.

    Kafka error code 22 (ILLEGAL_GENERATION)."""

    code = ErrorCode.ILLEGAL_GENERATION


class InconsistentGroupProtocolError(ExactlyError):
    """The member's protocol type or assignors do not match the group's.

    Kafka error code 23 (INCONSISTENT_GROUP_PROTOCOL)."""

    code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL


class InvalidGroupIdError(ExactlyError):
    """The group id is empty or invalid.

    Kafka error code 24 (INVALID_GROUP_ID)."""

    code = ErrorCode.INVALID_GROUP_ID


class UnknownMemberIdError(ExactlyError):
    """The member id is not a member of the group.

    Kafka error code 25 (UNKNOWN_MEMBER_ID)."""

    code = ErrorCode.UNKNOWN_MEMBER_ID


class InvalidSessionTimeoutError(ExactlyError):
    """The session timeout is outside the coordinator's allowed range.

    Kafka error code 26 (INVALID_SESSION_TIMEOUT)."""

    code = ErrorCode.INVALID_SESSION_TIMEOUT


class RebalanceInProgressError(ExactlyError):
    """The group is rebalancing: rejoin.

    Kafka error code 27 (REBALANCE_IN_PROGRESS)."""

    code = ErrorCode.REBALANCE_IN_PROGRESS


class InvalidCommitOffsetSizeError(ExactlyError):
    """The committed offset data is too large.

    Kafka error code 28 (INVALID_COMMIT_OFFSET_SIZE)."""

    code = ErrorCode.INVALID_COMMIT_OFFSET_SIZE


class TopicAuthorizationFailedError(ExactlyError):
    """The principal is not authorized for the topic.

    Kafka error code 29 (TOPIC_AUTHORIZATION_FAILED)."""

    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


class GroupAuthorizationFailedError(ExactlyError):
    """The principal is not authorized for the group.

    Kafka error code 30 (GROUP_AUTHORIZATION_FAILED)."""

    code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class ClusterAuthorizationFailedError(ExactlyError):
    """The principal is not authorized for this cluster operation.

    Kafka error code 31 (CLUSTER_AUTHORIZATION_FAILED)."""

    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class InvalidTimestampError(ExactlyError):
    """A record's timestamp is out of the accepted range.

    Kafka error code 32 (INVALID_TIMESTAMP)."""

    code = ErrorCode.INVALID_TIMESTAMP


class UnsupportedSaslMechanismError(ExactlyError):
    """The SASL mechanism is not enabled.

    Kafka error code 33 (UNSUPPORTED_SASL_MECHANISM)."""

    code = ErrorCode.UNSUPPORTED_SASL_MECHANISM


class IllegalSaslStateError(ExactlyError):
    """The SASL request is not valid in the current authentication state.

    Kafka error code 34 (ILLEGAL_SASL_STATE)."""

    code = ErrorCode.ILLEGAL_SASL_STATE


class UnsupportedVersionError(ExactlyError):
    """The service does not support this request or record format version.

    Kafka error code 35 (UNSUPPORTED_VERSION)."""

    code = ErrorCode.UNSUPPORTED_VERSION


class TopicAlreadyExistsError(ExactlyError):
    """A topic with this name already exists.

    Kafka error code 36 (TOPIC_ALREADY_EXISTS)."""

    code = ErrorCode.TOPIC_ALREADY_EXISTS


class InvalidPartitionsError(ExactlyError):
    """The number of partitions is invalid.

    Kafka error code 37 (INVALID_PARTITIONS)."""

    code = ErrorCode.INVALID_PARTITIONS


class InvalidReplicationFactorError(ExactlyError):
    """The replication factor is invalid (or larger than the number of partition leaders).

    Kafka error code 38 (INVALID_REPLICATION_FACTOR)."""

    code = ErrorCode.INVALID_REPLICATION_FACTOR


class InvalidReplicaAssignmentError(ExactlyError):
    """The replica assignment is invalid.

    Kafka error code 39 (INVALID_REPLICA_ASSIGNMENT)."""

    code = ErrorCode.INVALID_REPLICA_ASSIGNMENT


class InvalidConfigError(ExactlyError):
    """A configuration key or value is invalid.

    Kafka error code 40 (INVALID_CONFIG)."""

    code = ErrorCode.INVALID_CONFIG


class NotControllerError(ExactlyError):
    """This service is not the controller.

    Kafka error code 41 (NOT_CONTROLLER)."""

    code = ErrorCode.NOT_CONTROLLER


class InvalidRequestError(ExactlyError):
    """The request is malformed or its fields contradict each other.

    Kafka error code 42 (INVALID_REQUEST)."""

    code = ErrorCode.INVALID_REQUEST


class UnsupportedForMessageFormatError(ExactlyError):
    """The record format does not support this operation.

    Kafka error code 43 (UNSUPPORTED_FOR_MESSAGE_FORMAT)."""

    code = ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT


class PolicyViolationError(ExactlyError):
    """The request violates a configured policy.

    Kafka error code 44 (POLICY_VIOLATION)."""

    code = ErrorCode.POLICY_VIOLATION


class OutOfOrderSequenceNumberError(ExactlyError):
    """The partition leader received a sequence number that is not the next one expected for the
    producer id.

    Kafka error code 45 (OUT_OF_ORDER_SEQUENCE_NUMBER)."""

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class DuplicateSequenceNumberError(ExactlyError):
    """The batch is a duplicate of one already written.

    Kafka error code 46 (DUPLICATE_SEQUENCE_NUMBER)."""

    code = ErrorCode.DUPLICATE_SEQUENCE_NUMBER


class InvalidProducerEpochError(ExactlyError):
    """The producer epoch is older than the one the partition leader knows: a newer producer instance
    fenced this one.

    Kafka error code 47 (INVALID_PRODUCER_EPOCH)."""

    code = ErrorCode.INVALID_PRODUCER_EPOCH


class InvalidTxnStateError(ExactlyError):
    """The request is not valid in the transaction's current state.

    Kafka error code 48 (INVALID_TXN_STATE)."""

    code = ErrorCode.INVALID_TXN_STATE


class InvalidProducerIdMappingError(ExactlyError):
    """The producer id does not match the transactional.id's current producer id.

    Kafka error code 49 (INVALID_PRODUCER_ID_MAPPING)."""

    code = ErrorCode.INVALID_PRODUCER_ID_MAPPING


class InvalidTransactionTimeoutError(ExactlyError):
    """transaction.timeout.ms is larger than the coordinator's transaction.max.timeout.ms.

    Kafka error code 50 (INVALID_TRANSACTION_TIMEOUT)."""

    code = ErrorCode.INVALID_TRANSACTION_TIMEOUT


class ConcurrentTransactionsError(ExactlyError):
    """The previous transaction of this producer is still being completed: retry shortly.

    Kafka error code 51 (CONCURRENT_TRANSACTIONS)."""

    code = ErrorCode.CONCURRENT_TRANSACTIONS


class TransactionCoordinatorFencedError(ExactlyError):
    """The transaction coordinator sending markers was superseded by a newer coordinator epoch.

    Kafka error code 52 (TRANSACTION_COORDINATOR_FENCED)."""

    code = ErrorCode.TRANSACTION_COORDINATOR_FENCED


class TransactionalIdAuthorizationFailedError(ExactlyError):
    """The principal is not authorized for the transactional.id.

    Kafka error code 53 (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)."""

    code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


class SecurityDisabledError(ExactlyError):
    """Security features are disabled.

    Kafka error code 54 (SECURITY_DISABLED)."""

    code = ErrorCode.SECURITY_DISABLED


class OperationNotAttemptedError(ExactlyError):
    """The operation was not attempted because an earlier part of the request failed.

    Kafka error code 55 (OPERATION_NOT_ATTEMPTED)."""

    code = ErrorCode.OPERATION_NOT_ATTEMPTED


class KafkaStorageError(ExactlyError):
    """The service could not read or write its disk.

    Kafka error code 56 (KAFKA_STORAGE_ERROR)."""

    code = ErrorCode.KAFKA_STORAGE_ERROR


class SaslAuthenticationFailedError(ExactlyError):
    """The SASL user name or password was not accepted (or SASL was used over a
    plaintext listener). Fatal: fix the credentials.

    Kafka error code 58 (SASL_AUTHENTICATION_FAILED)."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED


class UnknownProducerIdError(ExactlyError):
    """The partition leader has no state for this producer id (it expired or was never seen).

    Kafka error code 59 (UNKNOWN_PRODUCER_ID)."""

    code = ErrorCode.UNKNOWN_PRODUCER_ID


class NonEmptyGroupError(ExactlyError):
    """The group still has members (DeleteGroups deletes only Empty groups).

    Kafka error code 68 (NON_EMPTY_GROUP)."""

    code = ErrorCode.NON_EMPTY_GROUP


class GroupIdNotFoundError(ExactlyError):
    """The group does not exist.

    Kafka error code 69 (GROUP_ID_NOT_FOUND)."""

    code = ErrorCode.GROUP_ID_NOT_FOUND


class FencedLeaderEpochError(ExactlyError):
    """The request carries a leader epoch older than the partition's.

    Kafka error code 74 (FENCED_LEADER_EPOCH)."""

    code = ErrorCode.FENCED_LEADER_EPOCH


class UnknownLeaderEpochError(ExactlyError):
    """The request carries a leader epoch newer than this replica knows.

    Kafka error code 75 (UNKNOWN_LEADER_EPOCH)."""

    code = ErrorCode.UNKNOWN_LEADER_EPOCH


class MemberIdRequiredError(ExactlyError):
    """The group requires a member id: rejoin with the one returned.

    Kafka error code 79 (MEMBER_ID_REQUIRED)."""

    code = ErrorCode.MEMBER_ID_REQUIRED


class PreferredLeaderNotAvailableError(ExactlyError):
    """A preferred leader election was not made: the preferred replica is down, out of the
    ISR, or the controller does not move leadership to it (ElectLeaders).

    Kafka error code 80 (PREFERRED_LEADER_NOT_AVAILABLE)."""

    code = ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE


class GroupMaxSizeReachedError(ExactlyError):
    """The group already has the largest number of members allowed.

    Kafka error code 81 (GROUP_MAX_SIZE_REACHED)."""

    code = ErrorCode.GROUP_MAX_SIZE_REACHED


class FencedInstanceIdError(ExactlyError):
    """A newer member with the same group.instance.id replaced this one (static membership, KIP-345).

    Kafka error code 82 (FENCED_INSTANCE_ID)."""

    code = ErrorCode.FENCED_INSTANCE_ID


class EligibleLeadersNotAvailableError(ExactlyError):
    """No replica may be elected leader: no in-sync replica is live, and Exactly never
    elects one outside the ISR (ElectLeaders, unclean).

    Kafka error code 83 (ELIGIBLE_LEADERS_NOT_AVAILABLE)."""

    code = ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE


class ElectionNotNeededError(ExactlyError):
    """The leader election asked for is not needed: the wanted replica leads already.

    Kafka error code 84 (ELECTION_NOT_NEEDED)."""

    code = ErrorCode.ELECTION_NOT_NEEDED


class GroupSubscribedToTopicError(ExactlyError):
    """The group's members subscribe to the topic, so its committed offsets are kept
    (OffsetDelete, KIP-496).

    Kafka error code 86 (GROUP_SUBSCRIBED_TO_TOPIC)."""

    code = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC


class InvalidRecordError(ExactlyError):
    """The partition leader refused a record batch whose records are malformed (counts, lengths or
    offset deltas that do not match, a sequence without a producer id) or otherwise invalid.

    Kafka error code 87 (INVALID_RECORD)."""

    code = ErrorCode.INVALID_RECORD


class UnstableOffsetCommitError(ExactlyError):
    """The group has a pending transactional offset commit for the partition: retry.

    Kafka error code 88 (UNSTABLE_OFFSET_COMMIT)."""

    code = ErrorCode.UNSTABLE_OFFSET_COMMIT


class ThrottlingQuotaExceededError(ExactlyError):
    """A rate quota of the caller is exceeded: the controller mutation rate (partitions
    created or deleted per second, KIP-599) or, for InitProducerId, the transaction
    coordinator's exactly.producer.ids.rate. Retry after the response's throttle_time_ms.

    Kafka error code 89 (THROTTLING_QUOTA_EXCEEDED)."""

    code = ErrorCode.THROTTLING_QUOTA_EXCEEDED


class ProducerFencedError(ExactlyError):
    """A newer producer instance with the same transactional.id has a newer epoch: this one is a
    zombie.

    Kafka error code 90 (PRODUCER_FENCED)."""

    code = ErrorCode.PRODUCER_FENCED


class UnacceptableCredentialError(ExactlyError):
    """A SCRAM credential the cluster does not accept: its iteration count is outside
    Kafka's 4096..16384 (AlterUserScramCredentials).

    Kafka error code 93 (UNACCEPTABLE_CREDENTIAL)."""

    code = ErrorCode.UNACCEPTABLE_CREDENTIAL


class InvalidUpdateVersionError(ExactlyError):
    """UpdateFeatures refused the level (KIP-584): a level a live process does not
    support (the message names them), a downgrade below a level whose formats may be
    written, or a level this version does not know.

    Kafka error code 95 (INVALID_UPDATE_VERSION)."""

    code = ErrorCode.INVALID_UPDATE_VERSION


class FeatureUpdateFailedError(ExactlyError):
    """UpdateFeatures could not finalize the level: the finalized features kept
    changing meanwhile. Ask again.

    Kafka error code 96 (FEATURE_UPDATE_FAILED)."""

    code = ErrorCode.FEATURE_UPDATE_FAILED


class TransactionalIdNotFoundError(ExactlyError):
    """The transactional.id is unknown to its coordinator.

    Kafka error code 105 (TRANSACTIONAL_ID_NOT_FOUND)."""

    code = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND


class UnsupportedEndpointTypeError(ExactlyError):
    """DescribeCluster asked for an endpoint type the cluster does not have (Exactly
    has broker endpoints only, no separate controller quorum).

    Kafka error code 115 (UNSUPPORTED_ENDPOINT_TYPE)."""

    code = ErrorCode.UNSUPPORTED_ENDPOINT_TYPE


class ConcurrentProducerCommitError(ExactlyError):
    """Another producer of the group owns this partition in the current generation (KIP-447 draft).

    Kafka error code 1001 (CONCURRENT_PRODUCER_COMMIT)."""

    code = ErrorCode.CONCURRENT_PRODUCER_COMMIT


class PendingTransactionError(ExactlyError):
    """An older transaction on the newly assigned partitions is still being completed: retry (KIP-447
    draft).

    Kafka error code 1002 (PENDING_TRANSACTION)."""

    code = ErrorCode.PENDING_TRANSACTION


class KafkaTimeoutError(RequestTimedOutError):
    """A client-side wait (flush, commit, init, send blocked on buffer.memory) ran out
    of time. Retriable: the same call may be made again (a timed-out
    commit_transaction may be retried, Kafka's Producer javadoc)."""


class ConnectionSetupError(NetworkException):
    """The connection to a service could not be set up as the client is configured: the
    service expects something else — TLS or no TLS, a client certificate, a CA that signed
    its certificate, gRPC rather than the Kafka protocol —, and the message says what and
    which setting to change. Not retriable (another try fails the same way): fatal, as
    Kafka's SslAuthenticationException."""

    retriable: ClassVar[bool] = False
    fatal: ClassVar[bool] = True
    txn_requires_abort: ClassVar[bool] = False


class IllegalStateError(InvalidTxnStateError):
    """An SDK method was called in a state that does not allow it (e.g.
    commit_transaction without begin_transaction, or a call on a closed client).
    A usage error: neither retriable, nor fatal, nor abortable; fix the calling code."""

    fatal: ClassVar[bool] = False
    txn_requires_abort: ClassVar[bool] = False


class NoOffsetForPartitionError(OffsetOutOfRangeError):
    """`auto.offset.reset` is `none` and the partition has no committed offset
    (or its position is out of range): raised by the Consumer's poll() and position().
    `partitions`: the TopicPartitions concerned, sorted. Subclass of OffsetOutOfRangeError."""

    def __init__(self, partitions: Iterable[TopicPartition], message: str | None = None):
        self.partitions = sorted(partitions)
        super().__init__(message or f"no offset to reset to for {self.partitions} (auto.offset.reset=none)")


class TransactionAbortedError(InvalidTxnStateError):
    """The record's transaction was aborted before the record was sent (the
    producer's abort_transaction, or an earlier error of the transaction). Not
    fatal: the producer can begin the next transaction."""

    fatal: ClassVar[bool] = False
    txn_requires_abort: ClassVar[bool] = True


class ConfigurationError(InvalidConfigError, config.ConfigurationError):
    """A configuration key is unknown or unsupported, or its value is of the wrong
    type or outside the allowed values (also a ValueError). Raised when a Producer,
    Consumer or AdminClient is created, before any I/O. Attributes: `key`, `value`
    (as given) and `allowed` (what the key accepts, in words)."""

    def __init__(self, message: str | None = None, key: str | None = None, value: object = None,
                 allowed: str | None = None):
        InvalidConfigError.__init__(self, message)
        self.key = key
        self.value = value
        self.allowed = allowed


_BY_CODE: dict[int, type[ExactlyError]] = {
    int(cls.code): cls for cls in ExactlyError.__subclasses__() if "code" in cls.__dict__}


def for_code(code: int, message: str | None = None) -> ExactlyError:
    """Return the exception instance for a non-zero error code (unknown codes map
    to UnknownServerError). Raises ValueError for NONE (0)."""
    if code == ErrorCode.NONE:
        raise ValueError("error code 0 (NONE) is not an error")
    cls = _BY_CODE.get(int(code), UnknownServerError)
    return cls(message)


def check(code: int, message: str | None = None) -> None:
    """Raise the matching exception when `code` is not NONE."""
    if code:
        raise for_code(code, message)


__all__ = ["ErrorCode", "ExactlyError", "KafkaTimeoutError", "IllegalStateError", "TransactionAbortedError",
           "ConnectionSetupError", "NoOffsetForPartitionError",
           "ConfigurationError", "for_code", "check"] + [c.__name__ for c in _BY_CODE.values()]
