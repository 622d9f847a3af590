from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OffsetCommitKey(_message.Message):
    __slots__ = ("group", "topic", "partition")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    partition: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class GroupMetadataKey(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class OffsetsLogKey(_message.Message):
    __slots__ = ("offset", "group")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    offset: OffsetCommitKey
    group: GroupMetadataKey
    def __init__(self, offset: _Optional[_Union[OffsetCommitKey, _Mapping]] = ..., group: _Optional[_Union[GroupMetadataKey, _Mapping]] = ...) -> None: ...

class OffsetCommitValue(_message.Message):
    __slots__ = ("offset", "leader_epoch", "metadata", "commit_timestamp_ms")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    def __init__(self, offset: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., metadata: _Optional[str] = ..., commit_timestamp_ms: _Optional[int] = ...) -> None: ...

class MemberAssignment(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class GroupMemberRecord(_message.Message):
    __slots__ = ("member_id", "group_instance_id", "session_timeout_ms", "rebalance_timeout_ms", "topics", "assignment")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    group_instance_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    topics: _containers.RepeatedScalarFieldContainer[str]
    assignment: _containers.RepeatedCompositeFieldContainer[MemberAssignment]
    def __init__(self, member_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ..., session_timeout_ms: _Optional[int] = ..., rebalance_timeout_ms: _Optional[int] = ..., topics: _Optional[_Iterable[str]] = ..., assignment: _Optional[_Iterable[_Union[MemberAssignment, _Mapping]]] = ...) -> None: ...

class GroupMetadataValue(_message.Message):
    __slots__ = ("protocol_type", "generation", "protocol_name", "leader", "state_timestamp_ms", "members", "topic_partition_counts")
    class TopicPartitionCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    STATE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_PARTITION_COUNTS_FIELD_NUMBER: _ClassVar[int]
    protocol_type: str
    generation: int
    protocol_name: str
    leader: str
    state_timestamp_ms: int
    members: _containers.RepeatedCompositeFieldContainer[GroupMemberRecord]
    topic_partition_counts: _containers.ScalarMap[str, int]
    def __init__(self, protocol_type: _Optional[str] = ..., generation: _Optional[int] = ..., protocol_name: _Optional[str] = ..., leader: _Optional[str] = ..., state_timestamp_ms: _Optional[int] = ..., members: _Optional[_Iterable[_Union[GroupMemberRecord, _Mapping]]] = ..., topic_partition_counts: _Optional[_Mapping[str, int]] = ...) -> None: ...
