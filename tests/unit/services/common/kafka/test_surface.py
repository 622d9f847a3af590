"""The Kafka API surface (services.common.kafka.surface): one table of which role
serves which key, the same ApiVersions at every role, and the redirecting answers of
keys served elsewhere, encodable at every advertised version."""
from __future__ import annotations

import asyncio

import pytest
from kio.serial import entity_reader

from services.common.kafka import codec, surface
from services.common.kafka.cluster_api import ClusterApis
from services.common.kafka.listener import KafkaListener, RequestContext
from services.group_coordinator.kafka_api import GroupCoordinatorApis
from services.partition_leader.kafka_api import PartitionLeaderApis
from services.txn_coordinator.kafka_api import TxnCoordinatorApis

ROLES = {surface.PARTITION_LEADER: PartitionLeaderApis, surface.TXN_COORDINATOR: TxnCoordinatorApis,
         surface.GROUP_COORDINATOR: GroupCoordinatorApis}


def listener_of(role: str) -> KafkaListener:
    cluster = ClusterApis(None, None)
    return KafkaListener(surface.apis_for(role, {**cluster.handlers(), **ROLES[role](None).handlers()},
                                         cluster.elsewhere()))


def test_each_role_module_serves_exactly_its_keys_of_the_table():
    assert set(ClusterApis(None, None).handlers()) == surface.keys_of(surface.CLUSTER)
    for role, cls in ROLES.items():
        assert set(cls(None).handlers()) == surface.keys_of(role), role


def test_every_role_advertises_the_same_api_versions():
    answers = {role: listener_of(role).supported() for role in ROLES}
    first = answers[surface.PARTITION_LEADER]
    assert all(a == first for a in answers.values())
    keys = {a["api_key"] for a in first}
    assert keys == set(surface.SURFACE) | {codec.API_VERSIONS_KEY}
    # KafkaJS's transactional producer and consumer group need these at whichever broker answers first.
    assert {0, 1, 10, 11, 24, 22, 26, 28} <= keys


def test_a_role_without_a_handler_for_its_key_is_refused():
    with pytest.raises(ValueError, match="partition_leader has no handler for API key 0"):
        surface.apis_for(surface.PARTITION_LEADER, ClusterApis(None, None).handlers())


def test_idempotent_init_producer_id_elsewhere_is_the_cluster_forwarder():
    cluster = ClusterApis(None, None)
    pl = surface.apis_for(surface.PARTITION_LEADER, {**cluster.handlers(), **PartitionLeaderApis(None).handlers()},
                          cluster.elsewhere())
    assert pl[surface.INIT_PRODUCER_ID].handler == cluster.init_producer_id


_REQUESTS = {
    "topic_data": [{"name": "t", "partition_data": [{"index": 0}, {"index": 2}]}],
    "topics": [{"name": "t", "topic": "t", "partitions": [{"partition": 0, "partition_index": 0}],
                "partition_indexes": [0, 1]}],
    "v3_and_below_topics": [{"name": "t", "partitions": [0, 1]}],
    "transactional_ids": ["tx"], "groups": ["g"], "groups_names": ["g"], "group_id": "g", "member_id": "m",
    "acks": -1,
}


def _error_codes(value, out: list[int]) -> list[int]:
    """Every error code of a decoded kio response, nested ones included."""
    import dataclasses
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if f.name in ("error_code", "partition_error_code"):
            out.append(int(v.value))
        elif isinstance(v, tuple):
            for x in v:
                if dataclasses.is_dataclass(x):
                    _error_codes(x, out)
        elif dataclasses.is_dataclass(v):
            _error_codes(v, out)
    return out


@pytest.mark.parametrize("key", sorted(surface.SURFACE))
def test_answers_of_keys_served_elsewhere_encode_at_every_version(key):
    """Each key a role does not serve is answered at every advertised version:
    NOT_LEADER_OR_FOLLOWER (6) for each partition of a partition request,
    NOT_COORDINATOR (16) for coordinator requests, an empty list for
    ListTransactions and DescribeLogDirs (whose kio requests are built from one dict of sample
    fields, `_REQUESTS`)."""
    served = surface.SURFACE[key]
    if served.role == surface.CLUSTER:
        return
    handler = surface.not_here(key)
    expected = {surface.PARTITION_LEADER: {6}, surface.TXN_COORDINATOR: {16}, surface.GROUP_COORDINATOR: {16}}
    for version in range(served.min_version, served.max_version + 1):
        req = codec.build(codec.request_class(key, version), _REQUESTS)
        value = asyncio.run(handler(req, version, RequestContext("c", version, "peer")))
        frame = codec.encode_response(key, version, 9, value)
        cls = codec.response_class(key, version)
        header_size = 4 + 4 + (1 if cls.__flexible__ else 0)
        decoded, _ = entity_reader(cls)(frame, header_size)
        codes = set(_error_codes(decoded, []))
        if key == surface.LIST_TRANSACTIONS:
            assert codes == {0}, (key, version, decoded)
        elif key == surface.DESCRIBE_LOG_DIRS:  # a process storing no partition has no log directory
            assert codes <= {0} and decoded.results == (), (key, version, decoded)
        elif key == surface.FETCH:  # the request itself is fine: NONE at the top, 6 for each partition
            assert codes - {0} == {6} and getattr(decoded, "error_code", 0) == 0, (key, version, decoded)
        else:
            assert codes == expected[served.role], (key, version, decoded)
