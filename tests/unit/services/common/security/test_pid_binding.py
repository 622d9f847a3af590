"""Producer-id bindings (services/common/security/pid_binding.py): who may write a producer id's
batches, and the per-principal InitProducerId rate."""
from __future__ import annotations

from exactly.testing import MockTime
from exactly_wire.error_codes import ErrorCode
from exactly_wire.v1 import exactly_pb2 as pb
from services.common.security import authz
from services.common.security.acl import Operation
from services.common.security.pid_binding import RatePerPrincipal, refusal, refusal_code
from services.txn_coordinator.txn_log import ProducerIdBinding

ALICE = ProducerIdBinding("User:alice", "tx-a")


def test_the_principal_it_was_issued_to_may_write():
    assert refusal(ALICE, 7, "User:alice", "tx-a", transactional=True) is None
    assert refusal(ALICE, 7, "User:alice", "", transactional=False) is None  # idempotent batches of her id


def test_another_principal_is_refused_even_with_the_right_transactional_id():
    code, why = refusal(ALICE, 7, "User:bob", "tx-a", transactional=True)
    assert code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and "another principal" in why
    code, why = refusal(ALICE, 7, "User:bob", "", transactional=False)
    assert code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED and "another principal" in why


def test_a_transactional_batch_must_carry_the_transactional_id_it_was_issued_for():
    code, why = refusal(ALICE, 7, "User:alice", "tx-b", transactional=True)
    assert code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and "tx-a" in why


def test_an_unknown_or_expired_producer_id_is_refused():
    """An idempotent producer id bound to no one (it idled past producer.id.expiration.ms,
    or was never issued) gets Kafka's answer for an expired producer id, on which the
    producer takes a new one; a transactional batch stays refused."""
    code, why = refusal(None, 7, "User:alice", "", transactional=False)
    assert code == ErrorCode.UNKNOWN_PRODUCER_ID and "not bound" in why
    code, why = refusal(None, 7, "User:alice", "tx-a", transactional=True)
    assert code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and "not bound" in why


def test_error_codes_are_kafkas():
    assert refusal_code(True) == refusal_code(True, bound=False) == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert refusal_code(False) == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert refusal_code(False, bound=False) == ErrorCode.UNKNOWN_PRODUCER_ID


def test_only_a_service_may_name_the_principal_of_an_init_producer_id():
    plain = authz.checks("TransactionCoordinator/InitProducerId", pb.InitProducerIdRequest(), "User:alice")
    forwarded = authz.checks("TransactionCoordinator/InitProducerId",
                             pb.InitProducerIdRequest(principal="User:alice"), "User:pl-0")
    assert [c.operation for c in plain] == [Operation.IDEMPOTENT_WRITE]
    assert [c.operation for c in forwarded] == [Operation.CLUSTER_ACTION, Operation.IDEMPOTENT_WRITE]


def test_only_a_service_may_verify_a_producer_id():
    checks = authz.checks("TransactionCoordinator/VerifyProducerId", pb.VerifyProducerIdRequest(), "User:alice")
    assert [c.operation for c in checks] == [Operation.CLUSTER_ACTION]


def test_rate_allows_a_burst_then_throttles_with_the_wait():
    clock = MockTime(100_000)  # 100 s
    rate = RatePerPrincipal(10, clock.now_s)
    assert [rate.acquire("User:mallory") for _ in range(10)] == [0] * 10
    wait = rate.acquire("User:mallory")
    assert 90 <= wait <= 100  # one call per 100 ms
    assert rate.acquire("User:alice") == 0  # another principal has its own bucket
    clock.advance(100)
    assert rate.acquire("User:mallory") == 0
    assert rate.acquire("User:mallory") > 0


def test_rate_bounds_calls_over_time():
    clock = MockTime(100_000)  # 100 s
    rate = RatePerPrincipal(5, clock.now_s)
    allowed = 0
    for _ in range(1000):  # 10 s of calls every 10 ms
        allowed += rate.acquire("User:mallory") == 0
        clock.advance(10)
    assert 50 <= allowed <= 5 * 10 + 5  # rate x time + one burst


def test_idle_principals_are_forgotten():
    clock = MockTime(100_000)  # 100 s
    rate = RatePerPrincipal(1, clock.now_s)
    for i in range(100):
        rate.acquire(f"User:u{i}")
    clock.advance(120_000)
    rate.acquire("User:alice")
    assert list(rate._buckets) == ["User:alice"]
