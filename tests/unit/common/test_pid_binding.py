"""Producer-id bindings (services/common/pid_binding.py): who may write a producer id's batches."""
from __future__ import annotations

from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from services.common import authz
from services.common.acl import Operation
from services.common.pid_binding import Binding, refusal, refusal_code

ALICE = Binding("User:alice", "tx-a")


def test_the_principal_it_was_issued_to_may_write():
    assert refusal(ALICE, 7, "User:alice", "tx-a", transactional=True) is None
    assert refusal(ALICE, 7, "User:alice", "", transactional=False) is None  # idempotent batches of her id


def test_another_principal_is_refused_even_with_the_right_transactional_id():
    assert "another principal" in refusal(ALICE, 7, "User:bob", "tx-a", transactional=True)
    assert "another principal" in refusal(ALICE, 7, "User:bob", "", transactional=False)


def test_a_transactional_batch_must_carry_the_transactional_id_it_was_issued_for():
    assert "tx-a" in refusal(ALICE, 7, "User:alice", "tx-b", transactional=True)


def test_an_unknown_producer_id_is_refused():
    assert "not issued" in refusal(None, 7, "User:alice", "", transactional=False)


def test_error_codes_are_kafkas():
    assert refusal_code(True) == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert refusal_code(False) == ErrorCode.CLUSTER_AUTHORIZATION_FAILED


def test_binding_round_trips_as_json():
    assert Binding.from_json(ALICE.to_json()) == ALICE


def test_only_a_service_may_name_the_principal_of_an_init_producer_id():
    plain = authz.checks("TransactionCoordinator/InitProducerId", pb.InitProducerIdRequest(), "User:alice")
    forwarded = authz.checks("TransactionCoordinator/InitProducerId",
                             pb.InitProducerIdRequest(principal="User:alice"), "User:pl-0")
    assert [c.operation for c in plain] == [Operation.IDEMPOTENT_WRITE]
    assert [c.operation for c in forwarded] == [Operation.CLUSTER_ACTION, Operation.IDEMPOTENT_WRITE]
