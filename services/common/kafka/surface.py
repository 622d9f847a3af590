"""The Kafka API surface: which role serves which API key, at which versions
(docs/design.md, "Kafka protocol").

A Kafka broker serves the whole API, and clients rely on it: KafkaJS, for one, takes
the first broker's ApiVersions answer for every broker. So every Kafka port of the
cluster advertises the same set — every key of `SURFACE` (plus ApiVersions, which the
listener answers itself), at the same versions — and answers every key:

- a key of the process's own role, or of every role (`CLUSTER`), is served by the
  role's handler;
- a key of another role is answered as a Kafka broker answers a request it is not the
  right node for, so the client goes to the right one:
  * coordinator requests (group coordinator keys; transaction coordinator keys)
    answer NOT_COORDINATOR (16) in each place the response has an error code; the
    client asks FindCoordinator again, which every port answers with the right node.
    DescribeLogDirs is sent to each broker: a process that stores no partition
    answers NONE with no log directory. ListTransactions is sent by clients to every broker and merged: a port that
    coordinates nothing answers NONE with an empty list, as a broker that coordinates
    no transaction does (ListGroups is a key of every process: each answers the
    union of the group coordinators' groups, cluster_api.ClusterApis.list_groups);
  * partition requests (Produce, Fetch, ListOffsets, OffsetForLeaderEpoch,
    DeleteRecords, DescribeProducers) answer NOT_LEADER_OR_FOLLOWER (6) for every
    partition asked (a Produce with acks=0 gets no answer); the client refreshes
    its Metadata, which names the leaders;
  * a role can replace these answers for a key with its own handler (`elsewhere` of
    `apis_for`): InitProducerId without a transactional id is forwarded to a
    transaction coordinator (services.common.kafka.cluster_api), as a Kafka broker
    serves an idempotent producer's InitProducerId whoever the coordinator is.

`apis_for(role, handlers, elsewhere)` builds the listener's table from `SURFACE`, so
the versions advertised and the dispatch come from one place.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactly_wire.error_codes import ErrorCode

from .codec import field
from .listener import Api, Handler, RequestContext

CLUSTER = "cluster"  # served by every process
PARTITION_LEADER, TXN_COORDINATOR, GROUP_COORDINATOR = "partition_leader", "txn_coordinator", "group_coordinator"

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS = 15, 16, 19, 20, 21
INIT_PRODUCER_ID, OFFSET_FOR_LEADER_EPOCH, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN = 22, 23, 24, 25, 26
TXN_OFFSET_COMMIT, DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS, CREATE_PARTITIONS, DELETE_GROUPS = 28, 29, 30, 31, 37, 42
DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
ELECT_LEADERS, OFFSET_DELETE, DESCRIBE_LOG_DIRS = 43, 47, 35
DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS, DESCRIBE_CLUSTER = 48, 49, 60
DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 61, 65, 66


@dataclass(frozen=True)
class Served:
    """Who serves an API key (`CLUSTER`: every process) and the versions offered."""

    role: str
    min_version: int
    max_version: int


SURFACE: dict[int, Served] = {
    # Every process (services.common.kafka.cluster_api).
    METADATA: Served(CLUSTER, 1, 12), FIND_COORDINATOR: Served(CLUSTER, 0, 4),
    CREATE_TOPICS: Served(CLUSTER, 2, 7), DELETE_TOPICS: Served(CLUSTER, 1, 6),
    CREATE_PARTITIONS: Served(CLUSTER, 0, 3),
    DESCRIBE_CLIENT_QUOTAS: Served(CLUSTER, 0, 1), ALTER_CLIENT_QUOTAS: Served(CLUSTER, 0, 1),
    DESCRIBE_ACLS: Served(CLUSTER, 1, 3), CREATE_ACLS: Served(CLUSTER, 1, 3), DELETE_ACLS: Served(CLUSTER, 1, 3),
    DESCRIBE_CLUSTER: Served(CLUSTER, 0, 2), LIST_GROUPS: Served(CLUSTER, 0, 4),
    ELECT_LEADERS: Served(CLUSTER, 0, 2),
    # Config admin APIs (services.common.kafka.config_api).
    DESCRIBE_CONFIGS: Served(CLUSTER, 1, 4), ALTER_CONFIGS: Served(CLUSTER, 0, 2),
    INCREMENTAL_ALTER_CONFIGS: Served(CLUSTER, 0, 1),
    # Partition leaders (services.partition_leader.kafka_api).
    PRODUCE: Served(PARTITION_LEADER, 3, 9), FETCH: Served(PARTITION_LEADER, 4, 12),
    LIST_OFFSETS: Served(PARTITION_LEADER, 1, 7), OFFSET_FOR_LEADER_EPOCH: Served(PARTITION_LEADER, 2, 4),
    DELETE_RECORDS: Served(PARTITION_LEADER, 0, 2), DESCRIBE_PRODUCERS: Served(PARTITION_LEADER, 0, 0),
    DESCRIBE_LOG_DIRS: Served(PARTITION_LEADER, 1, 4),
    # Transaction coordinators (services.txn_coordinator.kafka_api).
    INIT_PRODUCER_ID: Served(TXN_COORDINATOR, 0, 6), ADD_PARTITIONS_TO_TXN: Served(TXN_COORDINATOR, 0, 3),
    ADD_OFFSETS_TO_TXN: Served(TXN_COORDINATOR, 0, 3), END_TXN: Served(TXN_COORDINATOR, 0, 4),
    LIST_TRANSACTIONS: Served(TXN_COORDINATOR, 0, 0), DESCRIBE_TRANSACTIONS: Served(TXN_COORDINATOR, 0, 0),
    # Group coordinators (services.group_coordinator.kafka_api).
    JOIN_GROUP: Served(GROUP_COORDINATOR, 0, 7), SYNC_GROUP: Served(GROUP_COORDINATOR, 0, 5),
    HEARTBEAT: Served(GROUP_COORDINATOR, 0, 4), LEAVE_GROUP: Served(GROUP_COORDINATOR, 0, 4),
    OFFSET_COMMIT: Served(GROUP_COORDINATOR, 2, 8), OFFSET_FETCH: Served(GROUP_COORDINATOR, 1, 7),
    TXN_OFFSET_COMMIT: Served(GROUP_COORDINATOR, 0, 3),
    DESCRIBE_GROUPS: Served(GROUP_COORDINATOR, 0, 5), DELETE_GROUPS: Served(GROUP_COORDINATOR, 0, 2),
    OFFSET_DELETE: Served(GROUP_COORDINATOR, 0, 0),
}


def keys_of(role: str) -> set[int]:
    """The API keys `role` serves itself (not those of every process)."""
    return {k for k, s in SURFACE.items() if s.role == role}


def apis_for(role: str, handlers: dict[int, Handler], elsewhere: dict[int, Handler] | None = None) -> dict[int, Api]:
    """The listener table (api key -> Api) of a process of `role`: every key of
    SURFACE at its versions. `handlers` must hold a handler for every key of `role`
    and of CLUSTER (ValueError otherwise); other keys get `elsewhere[key]` when given,
    else the answer of `not_here(key)`."""
    elsewhere = elsewhere or {}
    out = {}
    for key, served in SURFACE.items():
        if served.role in (CLUSTER, role):
            if key not in handlers:
                raise ValueError(f"{role} has no handler for API key {key}")
            handler = handlers[key]
        else:
            handler = elsewhere.get(key) or not_here(key)
        out[key] = Api(served.min_version, served.max_version, handler)
    return out


def _partitions(topics, name: str, parts: str, index: str, out_name: str, out_parts: str, out_index: str,
                code: int, **fields: Any) -> list[dict]:
    """Every partition of a request's topics with `code` (and `fields`), under the
    response's names."""
    return [{out_name: getattr(t, name), out_parts: [
        {out_index: p if isinstance(p, int) else getattr(p, index), "error_code": code, **fields}
        for p in getattr(t, parts)]} for t in topics or ()]


NOT_LEADER, NOT_COORDINATOR = ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_COORDINATOR


def _produce(req):
    if field(req, "acks", 1) == 0:
        return None
    return {"responses": _partitions(req.topic_data, "name", "partition_data", "index", "name",
                                     "partition_responses", "index", NOT_LEADER, base_offset=-1,
                                     log_append_time=-1, log_start_offset=-1)}


def _fetch(req):
    return {"error_code": 0, "session_id": 0, "responses": _partitions(
        req.topics, "topic", "partitions", "partition", "topic", "partitions", "partition_index", NOT_LEADER,
        high_watermark=-1, last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
        preferred_read_replica=-1, records=b"")}


def _offset_fetch(req):
    return {"error_code": NOT_COORDINATOR, "topics": [
        {"name": t.name, "partitions": [{"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1,
                                         "metadata": "", "error_code": NOT_COORDINATOR}
                                        for p in t.partition_indexes]} for t in field(req, "topics", None) or ()]}


def _join_group(req):
    return {"error_code": NOT_COORDINATOR, "generation_id": -1, "protocol_name": "",
            "leader": "", "member_id": field(req, "member_id", ""), "members": []}


def _describe_transactions(req):
    return {"transaction_states": [{"error_code": NOT_COORDINATOR, "transactional_id": t, "transaction_state": "",
                                    "transaction_timeout": 0, "producer_id": -1,
                                    "producer_epoch": -1, "topics": []} for t in req.transactional_ids]}


def _describe_groups(req):
    return {"groups": [{"error_code": NOT_COORDINATOR, "group_id": g, "group_state": "", "protocol_type": "",
                        "protocol_data": "", "authorized_operations": -2147483648, "members": []}
                       for g in req.groups]}


_ANSWERS = {
    PRODUCE: _produce,
    FETCH: _fetch,
    LIST_OFFSETS: lambda req: {"topics": _partitions(req.topics, "name", "partitions", "partition_index", "name",
                                                     "partitions", "partition_index", NOT_LEADER, timestamp=-1,
                                                     offset=-1, leader_epoch=-1)},
    OFFSET_FOR_LEADER_EPOCH: lambda req: {"topics": _partitions(req.topics, "topic", "partitions", "partition", "topic",
                                                                "partitions", "partition", NOT_LEADER,
                                                                leader_epoch=-1, end_offset=-1)},
    DELETE_RECORDS: lambda req: {"topics": _partitions(req.topics, "name", "partitions", "partition_index", "name",
                                                       "partitions", "partition_index", NOT_LEADER,
                                                       low_watermark=-1)},
    DESCRIBE_PRODUCERS: lambda req: {"topics": _partitions(req.topics, "name", "partition_indexes", "", "name",
                                                           "partitions", "partition_index", NOT_LEADER,
                                                           active_producers=[])},
    DESCRIBE_LOG_DIRS: lambda req: {"error_code": 0, "results": []},
    INIT_PRODUCER_ID: lambda req: {"error_code": NOT_COORDINATOR, "producer_id": -1, "producer_epoch": -1},
    ADD_PARTITIONS_TO_TXN: lambda req: {"results_by_topic_v3_and_below": [
        {"name": t["name"], "results_by_partition": [{"partition_index": p["partition_index"],
                                                      "partition_error_code": NOT_COORDINATOR}
                                                     for p in t["partitions"]]}
        for t in _partitions(field(req, "v3_and_below_topics", ()), "name", "partitions", "", "name", "partitions",
                             "partition_index", NOT_COORDINATOR)]},
    ADD_OFFSETS_TO_TXN: lambda req: {"error_code": NOT_COORDINATOR},
    END_TXN: lambda req: {"error_code": NOT_COORDINATOR, "producer_id": -1, "producer_epoch": -1},
    LIST_TRANSACTIONS: lambda req: {"error_code": 0, "unknown_state_filters": [], "transaction_states": []},
    DESCRIBE_TRANSACTIONS: _describe_transactions,
    JOIN_GROUP: _join_group,
    SYNC_GROUP: lambda req: {"error_code": NOT_COORDINATOR, "protocol_type": None, "protocol_name": None,
                             "assignment": b""},
    HEARTBEAT: lambda req: {"error_code": NOT_COORDINATOR},
    LEAVE_GROUP: lambda req: {"error_code": NOT_COORDINATOR, "members": []},
    OFFSET_COMMIT: lambda req: {"topics": _partitions(req.topics, "name", "partitions", "partition_index", "name",
                                                      "partitions", "partition_index", NOT_COORDINATOR)},
    OFFSET_FETCH: _offset_fetch,
    TXN_OFFSET_COMMIT: lambda req: {"topics": _partitions(req.topics, "name", "partitions", "partition_index", "name",
                                                          "partitions", "partition_index", NOT_COORDINATOR)},
    DESCRIBE_GROUPS: _describe_groups,
    DELETE_GROUPS: lambda req: {"results": [{"group_id": g, "error_code": NOT_COORDINATOR}
                                            for g in req.groups_names]},
    OFFSET_DELETE: lambda req: {"error_code": NOT_COORDINATOR, "topics": [
        {"name": t.name, "partitions": [{"partition_index": p.partition_index, "error_code": NOT_COORDINATOR}
                                        for p in t.partitions]} for t in req.topics]},
}


def not_here(key: int) -> Handler:
    """The handler answering API `key` at a process that is not of its role (see the
    module docstring): NOT_COORDINATOR for coordinator requests,
    NOT_LEADER_OR_FOLLOWER for every partition of a partition request, an empty
    list for ListTransactions, no log directory for DescribeLogDirs."""
    answer = _ANSWERS[key]

    async def handler(req: Any, version: int, ctx: RequestContext) -> dict | None:
        value = answer(req)
        return None if value is None else {"throttle_time": 0, **value}
    return handler
