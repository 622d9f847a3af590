"""Refused Kafka-protocol calls answer with error codes, not a closed connection
(authz.denied_response): built from the descriptors for every RPC."""
from __future__ import annotations

import pytest

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.security.authz import Denied, denied_response

TOPIC_DENIED = Denied(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "User:bob may not Write Topic 't'")
RPCS = [(s.name, m.name) for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods]


@pytest.mark.parametrize("service, method", RPCS)
def test_every_rpc_has_a_refusal_answer(service, method):
    desc = pb.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    response = denied_response(service, method, getattr(pb, desc.input_type.name)(), TOPIC_DENIED)
    assert response.DESCRIPTOR is desc.output_type
    if "error_code" in desc.output_type.fields_by_name:
        assert response.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_produce_answers_each_partition_of_the_request():
    request = pb.ProduceRequest(topics=[pb.TopicProduceData(name="t", partitions=[
        pb.PartitionProduceData(partition=0, records=b"x"), pb.PartitionProduceData(partition=3, records=b"y")])])
    r = denied_response("PartitionLeader", "Produce", request, TOPIC_DENIED)
    assert [(t.name, [(p.partition, p.error_code) for p in t.partitions]) for t in r.topics] == \
        [("t", [(0, 29), (3, 29)])]
    assert r.topics[0].partitions[0].error_message.startswith("TOPIC_AUTHORIZATION_FAILED")


def test_lists_of_names_and_partition_numbers_become_entries():
    txn = Denied(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "no")
    r = denied_response("TransactionCoordinator", "AddPartitionsToTxn", pb.AddPartitionsToTxnRequest(
        transactional_id="tx", topics=[pb.TopicPartitions(topic="t", partitions=[1, 2])]), txn)
    assert [(x.topic, [(p.partition, p.error_code) for p in x.partitions]) for x in r.results] == \
        [("t", [(1, 53), (2, 53)])]
    r = denied_response("TransactionCoordinator", "DescribeTransactions",
                        pb.DescribeTransactionsRequest(transactional_ids=["a", "b"]), txn)
    assert [(s.transactional_id, s.error_code) for s in r.transaction_states] == [("a", 53), ("b", 53)]
    r = denied_response("PartitionLeader", "Fetch", pb.FetchRequest(topics=[pb.FetchTopic(
        topic="t", partitions=[pb.FetchPartition(partition=4)])]), TOPIC_DENIED)
    assert r.error_code == 29 and [(x.topic, [p.partition for p in x.partitions]) for x in r.responses] == \
        [("t", [4])]
    r = denied_response("GroupCoordinator", "OffsetFetch", pb.OffsetFetchRequest(
        group_id="g", topics=[pb.TopicPartitions(topic="t", partitions=[0])]),
        Denied(ErrorCode.GROUP_AUTHORIZATION_FAILED, "no"))
    assert r.error_code == 30 and r.topics[0].name == "t" and r.topics[0].partitions[0].error_code == 30
