"""KIP-939 recovery fences the previous instance, on real processes: a new producer
instance that keeps a prepared transaction (init_transactions(keep_prepared_txn=True),
or InitProducerId v6 with keep_prepared_txn through the Kafka port) talks with a new
epoch, so the old instance's completion of that transaction, and every later call
of it, gets PRODUCER_FENCED; the new instance's records are committed once and
nothing of the old instance's later work is visible under read_committed
(docs/design.md, "Two-phase commit with a database")."""
from __future__ import annotations

import pytest

from exactly import AdminClient, PreparedTxnState

from .remote_producer import RemoteProducer
from kafka_requests import call as kafka_call
from waiting import wait_for
from .test_txn_prepare import _name, create_topic, read_values

pytestmark = pytest.mark.integration

FENCED = "ProducerFencedError"
INIT_PRODUCER_ID, END_TXN, FIND_COORDINATOR = 22, 26, 10


def _zombie_prepares(cluster, topic: str, tid: str) -> tuple[RemoteProducer, str]:
    """Step 1: the old instance Z begins, sends t1 and prepares; returns Z and its state."""
    z = RemoteProducer(cluster.bootstrap_servers, tid)
    z.ok("init")
    z.ok("begin")
    z.ok("send", topic, "t1", 0)
    return z, z.ok("prepare")


def _zombie_is_fenced_for_good(z: RemoteProducer, topic: str, state: str) -> None:
    """Steps 3 and 4 for Z: its completion of the prepared transaction, and each later
    call, raise ProducerFencedError."""
    answer = z.call("complete", state)
    assert answer.get("error") == FENCED, answer
    for later in (("begin",), ("send", topic, "zombie-2", 0), ("commit",), ("complete", state)):
        answer = z.call(*later)
        assert answer.get("error") == FENCED, (later, answer)


def test_recovery_fences_the_old_instance_across_processes(cluster):
    """The five steps of the reproduction, with the old instance Z and the new one R
    in two processes of their own."""
    topic, tid = create_topic(cluster), _name("kip939")
    z, state = _zombie_prepares(cluster, topic, tid)
    with z, RemoteProducer(cluster.bootstrap_servers, tid) as r:
        prepared = PreparedTxnState.deserialize(state)
        # Step 2: R keeps the prepared transaction under a new epoch and commits it.
        r.ok("init", True)
        assert r.ok("prepared_state") == state
        assert r.ok("complete", state) == "committed"
        # Step 3: Z's completion of the same transaction is fenced, and so is all it does next.
        _zombie_is_fenced_for_good(z, topic, state)
        # The markers are written after EndTxn is answered: PrepareCommit until they are.
        with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
            d = wait_for(lambda: (t := admin.describe_transactions([tid])[tid]).state == "CompleteCommit" and t,
                         30, f"{tid} to reach CompleteCommit")
        # R's epoch: one bump at its InitProducerId, one at its EndTxn.
        assert (d.producer_id, d.producer_epoch) == (prepared.producer_id, prepared.epoch + 2)
        # Steps 4 and 5: R's next transaction writes live-2 with sequence 0 and commits.
        r.ok("begin")
        r.ok("send", topic, "live-2", 0)
        r.ok("commit")
    assert read_values(cluster, topic, 2, "read_committed") == [b"live-2", b"t1"]
    assert read_values(cluster, topic, 2, "read_uncommitted") == [b"live-2", b"t1"]  # zombie-2 never written


def _kafka_txn_coordinator(cluster, tid: str) -> str:
    """The Kafka address FindCoordinator names for `tid` (key type 1, transaction)."""
    any_port = next(s.kafka_address for s in cluster.services.values() if s.kafka_port)
    resp = kafka_call(any_port, FIND_COORDINATOR, 3, {"key": tid, "key_type": 1})
    assert resp.error_code.value == 0, resp
    return f"{resp.host}:{resp.port}"


def test_recovery_through_the_kafka_port_fences_the_old_instance(cluster):
    """The same with R speaking Kafka's protocol: InitProducerId v6 with
    keep_prepared_txn (no Kafka client sends KIP-939's fields yet: a raw request
    encoded with the project's kio codec), then EndTxn v4 under the epoch it got;
    then a confluent-kafka (librdkafka) producer of the same transactional.id goes on."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic, tid = create_topic(cluster), _name("kip939-kafka")
    z, state = _zombie_prepares(cluster, topic, tid)
    prepared = PreparedTxnState.deserialize(state)
    with z:
        address = _kafka_txn_coordinator(cluster, tid)
        init = kafka_call(address, INIT_PRODUCER_ID, 6, {"transactional_id": tid, "transaction_timeout": 60000,
                                                         "keep_prepared_txn": True})
        assert init.error_code.value == 0, init
        assert (init.producer_id, init.producer_epoch) == (prepared.producer_id, prepared.epoch + 1)
        assert (init.ongoing_txn_producer_id, init.ongoing_txn_producer_epoch) == (prepared.producer_id,
                                                                                   prepared.epoch)
        refused = kafka_call(address, INIT_PRODUCER_ID, 6, {"transactional_id": tid, "transaction_timeout": 60000,
                                                            "enable2_pc": True})
        assert refused.error_code.value == 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED: no 2PC for Kafka clients
        # The old instance's EndTxn, sent at the Kafka port too, is fenced.
        stale = kafka_call(address, END_TXN, 4, {"transactional_id": tid, "producer_id": prepared.producer_id,
                                                 "producer_epoch": prepared.epoch, "committed": True})
        assert stale.error_code.value == 90, stale  # PRODUCER_FENCED
        end = kafka_call(address, END_TXN, 4, {"transactional_id": tid, "producer_id": init.producer_id,
                                               "producer_epoch": init.producer_epoch, "committed": True})
        assert end.error_code.value == 0, end
        _zombie_is_fenced_for_good(z, topic, state)
    p = confluent_kafka.Producer({"bootstrap.servers": ",".join(s.kafka_address for s in cluster.services.values()
                                                               if s.kafka_port),
                                  "transactional.id": tid, "linger.ms": 5})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, b"live-2", partition=0)
    p.commit_transaction(30)
    assert read_values(cluster, topic, 2, "read_committed") == [b"live-2", b"t1"]
