"""One Kafka API surface at every Kafka port (services.common.kafka.surface): every
role's port advertises the same ApiVersions, answers another role's requests with
the error that sends a Kafka client to the right node. (KafkaJS 2.2.4, which takes
the first broker's ApiVersions for every broker, runs its exactly-once copier in
tests/compat/test_kafkajs.py.)"""
from __future__ import annotations

import uuid

import pytest

import kafka_requests
from clusters import chrooted_cluster

pytestmark = pytest.mark.integration

ROLES = ("partition_leader", "txn_coordinator", "group_coordinator")


@pytest.fixture(scope="module")
def kc(zk, tmp_path_factory):
    """One cluster (3 partition leaders, one coordinator of each kind)."""
    c = chrooted_cluster(zk, tmp_path_factory.mktemp("surface-cluster"), "surface")
    yield c
    c.down()


def kafka_port_of(kc, role: str) -> str:
    return next(s.kafka_address for s in kc.services.values() if s.role == role and s.kafka_port)


def call(address: str, key: int, version: int, fields: dict):
    """Send one request (built with kio from `fields`) and return the decoded response."""
    return kafka_requests.call(address, key, version, fields, client_id="surface-test")


def api_versions(address: str) -> list[tuple[int, int, int]]:
    resp = call(address, 18, 3, {"client_software_name": "surface-test", "client_software_version": "1"})
    assert resp.error_code.value == 0
    return sorted((k.api_key, k.min_version, k.max_version) for k in resp.api_keys)


def test_every_port_advertises_the_same_api_versions(kc):
    answers = {s.name: api_versions(s.kafka_address) for s in kc.services.values() if s.kafka_port}
    assert {kc.services[n].role for n in answers} == set(ROLES)
    first = next(iter(answers.values()))
    for name, answer in answers.items():
        assert answer == first, name
    keys = {k for k, _, _ in first}
    # Produce, Fetch, FindCoordinator, JoinGroup, AddPartitionsToTxn
    assert {0, 1, 10, 11, 24} <= keys
    print(f"{len(answers)} ports, {len(first)} api keys each, identical")


@pytest.mark.parametrize("role", ROLES)
def test_requests_for_another_role_get_the_error_that_redirects(kc, role):
    """At each role's port: a coordinator request of another role gets
    NOT_COORDINATOR (16); a Produce or Fetch at a port that leads nothing gets
    NOT_LEADER_OR_FOLLOWER (6) for each partition; FindCoordinator names the right
    node wherever it is asked."""
    address = kafka_port_of(kc, role)
    group, txn = f"g-{uuid.uuid4().hex[:6]}", f"tx-{uuid.uuid4().hex[:6]}"
    seen = {}
    if role != "group_coordinator":
        join = call(address, 11, 5, {"group_id": group, "session_timeout": 10000, "rebalance_timeout": 10000,
                                     "member_id": "", "protocol_type": "consumer",
                                     "protocols": [{"name": "range", "metadata": b"\0\0\0\0\0\0\0\0\0\0"}]})
        heartbeat = call(address, 12, 3, {"group_id": group, "generation_id": 1, "member_id": "m"})
        seen["JoinGroup"], seen["Heartbeat"] = join.error_code.value, heartbeat.error_code.value
        fetch_offsets = call(address, 9, 5, {"group_id": group, "topics": [{"name": "t", "partition_indexes": [0]}]})
        seen["OffsetFetch"] = fetch_offsets.error_code.value
    if role != "txn_coordinator":
        add = call(address, 24, 1, {"v3_and_below_transactional_id": txn, "v3_and_below_producer_id": 1,
                                    "v3_and_below_producer_epoch": 0,
                                    "v3_and_below_topics": [{"name": "t", "partitions": [0]}]})
        seen["AddPartitionsToTxn"] = add.results_by_topic_v3_and_below[0].results_by_partition[0] \
            .partition_error_code.value
        end = call(address, 26, 2, {"transactional_id": txn, "producer_id": 1, "producer_epoch": 0,
                                    "committed": True})
        seen["EndTxn"] = end.error_code.value
        init = call(address, 22, 2, {"transactional_id": txn, "transaction_timeout": 60000})
        seen["InitProducerId(transactional)"] = init.error_code.value
    for name, code in seen.items():
        assert code == 16, (name, code)
    if role != "partition_leader":
        produce = call(address, 0, 7, {"acks": -1, "timeout": 1000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": None}]}]})
        fetch = call(address, 1, 11, {"replica_id": -1, "max_wait": 0, "topics": [
            {"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}]}]})
        seen["Produce"] = produce.responses[0].partition_responses[0].error_code.value
        seen["Fetch"] = fetch.responses[0].partitions[0].error_code.value
        assert (seen["Produce"], seen["Fetch"]) == (6, 6)
    # FindCoordinator at this port names the coordinator's Kafka port.
    group_port = int(kafka_port_of(kc, "group_coordinator").rsplit(":", 1)[1])
    txn_port = int(kafka_port_of(kc, "txn_coordinator").rsplit(":", 1)[1])
    found = call(address, 10, 3, {"key": group, "key_type": 0})
    assert found.error_code.value == 0 and found.port == group_port
    found = call(address, 10, 3, {"key": txn, "key_type": 1})
    assert found.error_code.value == 0 and found.port == txn_port
    # An idempotent producer's InitProducerId is served at every port.
    idempotent = call(address, 22, 2, {"transactional_id": None, "transaction_timeout": 60000})
    assert idempotent.error_code.value == 0 and idempotent.producer_id >= 0
    print(role, seen)
