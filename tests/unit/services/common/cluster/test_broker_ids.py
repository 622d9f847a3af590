"""Kafka broker ids of node ids (services.common.cluster.state.broker_id): stable, below 2**24,
and a node whose broker id another live node already has refuses to register."""
from services.common.cluster.state import BROKER_ID_BITS, broker_id, broker_id_collision

# Two node ids whose CRC-32 agree in the low 24 bits.
A, B = "node-188781", "node-326020"


def test_broker_ids_are_stable_and_below_2_to_the_24():
    ids = {broker_id(f"pl-{i}") for i in range(1000)}
    assert len(ids) == 1000 and all(0 <= b < 1 << BROKER_ID_BITS for b in ids)
    assert broker_id("pl-0") == broker_id("pl-0")


def test_a_live_node_with_the_same_broker_id_is_a_collision():
    assert broker_id(A) == broker_id(B)
    assert broker_id_collision(B, ["pl-0", A, "txn-0"]) == A
    assert broker_id_collision(A, ["pl-0", A]) is None  # its own earlier registration
    assert broker_id_collision("pl-1", ["pl-0", A, B]) is None
