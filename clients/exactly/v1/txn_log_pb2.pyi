from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TxnLogTopicPartitions(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class TransactionLogValue(_message.Message):
    __slots__ = ("version", "producer_id", "last_producer_id", "producer_epoch", "last_producer_epoch", "transaction_timeout_ms", "state", "partitions", "txn_last_update_timestamp_ms", "txn_start_timestamp_ms", "consumer_group_id", "generation_id", "assigned_partitions", "prepared_timestamp_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TXN_LAST_UPDATE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    TXN_START_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PREPARED_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    version: int
    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    transaction_timeout_ms: int
    state: int
    partitions: _containers.RepeatedCompositeFieldContainer[TxnLogTopicPartitions]
    txn_last_update_timestamp_ms: int
    txn_start_timestamp_ms: int
    consumer_group_id: str
    generation_id: int
    assigned_partitions: _containers.RepeatedCompositeFieldContainer[TxnLogTopicPartitions]
    prepared_timestamp_ms: int
    def __init__(self, version: _Optional[int] = ..., producer_id: _Optional[int] = ..., last_producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., last_producer_epoch: _Optional[int] = ..., transaction_timeout_ms: _Optional[int] = ..., state: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[TxnLogTopicPartitions, _Mapping]]] = ..., txn_last_update_timestamp_ms: _Optional[int] = ..., txn_start_timestamp_ms: _Optional[int] = ..., consumer_group_id: _Optional[str] = ..., generation_id: _Optional[int] = ..., assigned_partitions: _Optional[_Iterable[_Union[TxnLogTopicPartitions, _Mapping]]] = ..., prepared_timestamp_ms: _Optional[int] = ...) -> None: ...
