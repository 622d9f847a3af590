"""Producer flows against exactly.testing.MockCluster, with the faults it injects:
batching, sequences, retries, transactions, fencing. KIP-98 design document,
"Transactional Producer" (Public APIs, Error Handling) and data flow steps 1-5."""

import pytest
from waiting import wait_for

from exactly import (ConsumerGroupMetadata, OffsetAndMetadata, Producer, RecordMetadata, TopicPartition,
                     errors)
from exactly_wire import records
from exactly._accumulator import partition_for_key
from exactly._txn_manager import TransactionManagerState
from exactly_wire.error_codes import ErrorCode
from exactly.errors import TransactionAbortedError

from exactly.testing import MockCluster, MockTime

from .clocked import on_clock


NO_AUTO_CREATE = {"auto.create.topics.enable": False}


@pytest.fixture
def fc():
    """A cluster whose producers add their partitions with AddPartitionsToTxn (transaction
    version 1), and that creates no topic by itself; the tests of version 2 make their own."""
    with MockCluster({"t": 3, "u": 1}, NO_AUTO_CREATE, transaction_version=1) as cluster:
        yield cluster


def producer_maker(cluster):
    made = []

    def _make(clock=None, **conf):
        """A producer of `conf` on `cluster`; on `clock` (a MockTime) when given, else on real time."""
        conf = {"bootstrap.servers": cluster.bootstrap_servers, "retry.backoff.ms": 10, "retry.backoff.max.ms": 50,
                "request.timeout.ms": 5000, "max.block.ms": 5000, **conf}
        p = (Producer if clock is None else on_clock(Producer, clock))(conf, transport=cluster)
        made.append(p)
        return p

    return _make, made


@pytest.fixture
def make(fc):
    _make, made = producer_maker(fc)
    yield _make
    for p in made:
        p.close(timeout=5)


@pytest.fixture
def v2():
    """A cluster of transaction version 2 (KIP-890 part 2) and its producer maker."""
    with MockCluster({"t": 3, "u": 1}, NO_AUTO_CREATE) as cluster:
        _make, made = producer_maker(cluster)
        yield cluster, _make
        for p in made:
            p.close(timeout=5)


def batches(fc, topic, partition):
    """The headers of the partition's data batches (not the markers)."""
    return [h for h in fc.batches(topic, partition) if not h.is_control]


def calls(fc, rpc):
    return len(fc.requests_of(rpc))


def values(fc, topic, partition):
    """The values of every record the partition holds, transactions committed or not."""
    return [r.value for r in fc.records(topic, partition, "read_uncommitted")]


def ended(fc):
    """(transactional.id, committed, partitions) of each completed transaction."""
    return [(t.transactional_id, t.committed, t.partitions) for t in fc.completed_transactions]


# ---------------------------------------------------------------- idempotent

def test_keyed_records_land_like_kafka_and_get_real_offsets(fc, make):
    p = make()
    futs = [(i, p.send("t", f"value-{i}", key=f"key-{i % 10}")) for i in range(200)]
    p.flush(5)
    per_partition = {}
    for i, f in futs:
        md = f.result(0)
        assert isinstance(md, RecordMetadata) and md.topic == "t"
        assert md.partition == partition_for_key(f"key-{i % 10}".encode(), 3)
        per_partition.setdefault(md.partition, []).append(md.offset)
    for part, offsets in per_partition.items():
        assert offsets == list(range(len(offsets)))  # send order, contiguous real offsets
        assert len(values(fc, "t", part)) == len(offsets)


def test_idempotent_by_default_with_contiguous_sequences(fc, make):
    p = make(**{"batch.size": 200})
    for i in range(50):
        p.send("u", b"x" * 20, partition=0)
    p.flush(5)
    hs = batches(fc, "u", 0)
    assert len(hs) > 1 and calls(fc, "InitProducerId") == 1
    assert len({h.producer_id for h in hs}) == 1 and hs[0].producer_id >= 0
    seq = 0
    for h in hs:
        assert h.base_sequence == seq and not h.is_transactional
        seq += h.record_count
    assert seq == 50


def test_plain_producer_sends_no_pid(fc, make):
    p = make(**{"enable.idempotence": False, "acks": 1})
    p.send("u", b"v").result(5)
    h = batches(fc, "u", 0)[0]
    assert h.producer_id == -1 and h.base_sequence == -1
    assert calls(fc, "InitProducerId") == 0 and fc.requests_of("Produce")[0].acks == 1


def test_acks_1_without_explicit_idempotence_turns_it_off(make):
    assert not make(acks=1)._txn.idempotent
    with pytest.raises(ValueError):
        make(acks=1, **{"enable.idempotence": True})
    with pytest.raises(ValueError):
        make(acks=1, **{"transactional.id": "x"})
    with pytest.raises(ValueError):
        make(**{"transactional.id": "x", "enable.idempotence": "false"})


def test_values_keys_headers(fc, make):
    p = make()
    p.send("u", "héllo", key="k", headers=[("a", b"1"), ("b", "2"), ("c", None)]).result(5)
    p.send("u", None, key=b"tomb").result(5)
    p.send("u", bytearray(b"ba"), headers={"d": b"4"}).result(5)
    recs = fc.records("u", 0)
    assert recs[0].value == "héllo".encode() and recs[0].key == b"k"
    assert list(recs[0].headers) == [("a", b"1"), ("b", b"2"), ("c", None)]
    assert recs[1].value is None and recs[1].key == b"tomb"
    assert recs[2].value == b"ba" and list(recs[2].headers) == [("d", b"4")]
    with pytest.raises(TypeError):
        p.send("u", 12)


@pytest.mark.parametrize("name,codec", [("gzip", records.COMPRESSION_GZIP), ("snappy", records.COMPRESSION_SNAPPY),
                                        ("lz4", records.COMPRESSION_LZ4), ("ZSTD", records.COMPRESSION_ZSTD)])
def test_compression_types(fc, make, name, codec):
    p = make(**{"compression.type": name})
    futs = [p.send("u", b"abc" * 200) for _ in range(10)]
    p.flush(5)
    assert [f.result(0).offset for f in futs] == list(range(10))
    assert batches(fc, "u", 0)[0].compression == codec
    assert all(v == b"abc" * 200 for v in values(fc, "u", 0))


def test_an_unknown_compression_type_is_refused_naming_the_choices(fc, make):
    with pytest.raises(ValueError, match="compression.type='brotli'.*none, gzip, snappy, lz4, zstd"):
        make(**{"compression.type": "brotli"})


def test_keyless_records_stick_to_a_partition(fc, make):
    p = make(**{"linger.ms": 1000})
    futs = [p.send("t", b"v") for _ in range(20)]
    p.flush(5)
    assert len({f.result(0).partition for f in futs}) == 1


def test_pipelines_batches_of_several_partitions_in_one_request(fc, make):
    p = make(**{"linger.ms": 50})
    for part in range(3):
        p.send("t", b"v", partition=part)
    p.flush(5)
    produced = fc.requests_of("Produce")
    assert len(produced) == 1
    assert sorted(pd.partition for t in produced[0].topics for pd in t.partitions) == [0, 1, 2]


def test_unknown_topic_and_partition(make):
    # The unknown topic is waited for max.block.ms (it may be created meanwhile), on the
    # virtual clock: the retry backoffs take no real time. The last try starts less than
    # one backoff (retry.backoff.max.ms 50 + jitter) before the deadline. The metadata
    # answers are real (grace_s: a wait for one does not jump ahead); on a loaded machine
    # the deadline may pass during the last try, and the error is still the topic's.
    clock = MockTime(grace_s=5, runs=True)
    p = make(clock, **{"max.block.ms": 1000})
    start = clock.now_s()
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        p.send("nope", b"v")
    assert 1.0 - 0.07 <= clock.now_s() - start < 4.0
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        p.send("u", b"v", partition=5)


def test_send_to_an_unknown_topic_asks_for_its_creation_and_warns_while_it_waits(fc, make, caplog):
    # A send() waiting max.block.ms for a topic the cluster does not know is not silent: a
    # WARNING once the wait lasted 1 s, then one every 10 s, naming the topic and what to do;
    # each request naming the topic asks for its creation (auto.create.topics.enable).
    clock = MockTime(grace_s=5, runs=True)
    p = make(clock, **{"max.block.ms": 25000, "retry.backoff.max.ms": 1000})
    caplog.set_level("WARNING", logger="exactly.producer")
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        p.send("nope", b"v")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "'nope'" in r.getMessage()]
    assert len(warned) == 3, warned  # at about 1 s, 11 s and 21 s of the 25 s
    assert "auto.create.topics.enable" in warned[0] and "UnknownTopicOrPartitionError" in warned[0]
    named = [r for r in fc.requests_of("Metadata") if list(r.topics) == ["nope"]]
    assert named and all(r.allow_auto_topic_creation for r in named)
    caplog.clear()
    p.send("t", b"known", partition=0).result(5)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_run_in_transaction_does_not_retry_an_unknown_topic(make):
    # send() already waited max.block.ms for the topic: the transaction is aborted and the
    # error raised after one attempt, not after `attempts` waits of max.block.ms.
    clock = MockTime(grace_s=5, runs=True)
    p = make(clock, **{"transactional.id": "tx-unknown", "max.block.ms": 1000})
    p.init_transactions(5)
    attempts = []

    def copy(producer):
        attempts.append(clock.now_s())
        producer.send("nope", b"v")

    start = clock.now_s()
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        p.run_in_transaction(copy, attempts=5)
    assert len(attempts) == 1 and clock.now_s() - start < 4.0


def test_message_too_large_is_rejected_at_send(make):
    p = make(**{"max.request.size": 1000})
    with pytest.raises(errors.MessageTooLargeError):
        p.send("u", b"x" * 2000)


def test_not_leader_is_retried_after_a_metadata_refresh(fc, make):
    p = make()
    fc.fail_next("Produce", ErrorCode.NOT_LEADER_OR_FOLLOWER, topic="u", partition=0)
    before = calls(fc, "Metadata")
    md = p.send("u", b"v").result(5)
    assert md.offset == 0 and calls(fc, "Produce") == 2 and calls(fc, "Metadata") > before


def test_lost_answer_is_retried_and_deduplicated(fc, make):
    """The leader wrote the batch but the answer was an error: the retry gets
    DUPLICATE_SEQUENCE_NUMBER, which is success, with the original offset."""
    p = make()
    p.send("u", b"first").result(5)
    fc.fail_next("Produce", ErrorCode.REQUEST_TIMED_OUT, applied=True, topic="u")
    md = p.send("u", b"second").result(5)
    assert md.offset == 1
    assert values(fc, "u", 0) == [b"first", b"second"]


def test_non_retriable_error_fails_the_future(fc, make):
    p = make()
    fc.fail_next("Produce", ErrorCode.CORRUPT_MESSAGE, topic="u")  # retriable in Kafka too
    assert p.send("u", b"a").result(5).offset == 0
    fc.fail_next("Produce", ErrorCode.INVALID_REQUEST, topic="u")
    with pytest.raises(errors.InvalidRequestError):
        p.send("u", b"b").result(5)
    # The PID is renewed so later sends are not rejected as out of order.
    assert p.send("u", b"c").result(5).offset == 1
    assert calls(fc, "InitProducerId") == 2


def test_unknown_producer_id_renews_the_pid_and_resends(fc, make):
    p = make()
    p.send("u", b"a").result(5)
    fc.fail_next("Produce", ErrorCode.UNKNOWN_PRODUCER_ID, topic="u")
    assert p.send("u", b"b").result(5).offset == 1
    assert calls(fc, "InitProducerId") == 2
    assert len({h.producer_id for h in batches(fc, "u", 0)}) == 2


def test_real_out_of_order_sequence_fails_the_batch_and_a_new_pid_continues(fc, make):
    """Kafka >= 2.5 (KIP-360): OUT_OF_ORDER_SEQUENCE_NUMBER is not fatal. The batch
    fails; the idempotent producer takes a new PID, whose sequences start at 0."""
    p = make()
    p.send("u", b"a").result(5)
    fc.fail_next("Produce", ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, topic="u")
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        p.send("u", b"b").result(5)
    assert p.send("u", b"c").result(5).offset == 1
    pids = [h.producer_id for h in batches(fc, "u", 0)]
    assert len(set(pids)) == 2 and batches(fc, "u", 0)[-1].base_sequence == 0



def test_a_batch_answered_after_later_ones_were_acknowledged_is_written_not_sent_again(fc, make):
    """The leader appended a batch but answered it (NOT_LEADER_OR_FOLLOWER, as a leader
    whose lease ran out answers) after the 6 batches that followed it were acknowledged:
    more than the 5 it remembers for duplicates. A leader appends a PID's batches only
    in sequence, so the later acknowledgements prove this one was written: it completes
    (offset unknown, -1) and is not sent again, which the leader would refuse
    OUT_OF_ORDER_SEQUENCE_NUMBER for ever. Every record is in the log once."""
    p = make(**{"linger.ms": 0})
    p.send("u", b"a").result(5)
    held = fc.hold_next("Produce", handled=True)
    fc.fail_next("Produce", ErrorCode.NOT_LEADER_OR_FOLLOWER, applied=True, topic="u")
    first = p.send("u", b"b")
    assert held.arrived.wait(5)
    later = [p.send("u", f"c{i}".encode()).result(5) for i in range(6)]
    assert [md.offset for md in later] == [2, 3, 4, 5, 6, 7]
    sent = calls(fc, "Produce")
    held.release()
    assert first.result(5).offset == -1
    p.flush(5)
    assert calls(fc, "Produce") == sent  # not sent again
    assert values(fc, "u", 0) == [b"a", b"b"] + [f"c{i}".encode() for i in range(6)]
    assert p.send("u", b"d").result(5).offset == 8


def test_a_batch_that_overtook_the_producers_first_one_is_sent_again_in_order(fc, make):
    """gRPC may hand a leader two pipelined Produce requests in either order: the
    producer's second batch can arrive before its first and be refused
    UNKNOWN_PRODUCER_ID (no state yet, sequence not 0), writing nothing. That batch was
    sent while an earlier one was unresolved, so it is sent again in sequence order,
    and the transaction commits both records."""
    p = make(**{"transactional.id": "tx-overtaken", "batch.size": 1})
    p.init_transactions(5)
    p.begin_transaction()
    p.send("u", b"first").result(5)  # the partition is in the transaction
    held = fc.hold_next("Produce")
    f1 = p.send("u", b"a")
    assert held.arrived.wait(5), "the first request held"
    fc.fail_next("Produce", ErrorCode.UNKNOWN_PRODUCER_ID, topic="u")
    f2 = p.send("u", b"b")  # overtakes it and is refused
    wait_for(lambda: calls(fc, "Produce") >= 3, 5, "the second request refused", interval_s=0.005)
    held.release()
    assert (f1.result(5).offset, f2.result(5).offset) == (1, 2)
    p.commit_transaction(5)
    assert values(fc, "u", 0) == [b"first", b"a", b"b"]

def test_flush_timeout(fc, make):
    clock = MockTime(runs=True)
    p = make(clock)
    held = fc.hold_next("Produce")
    try:
        f = p.send("u", b"v")
        start = clock.now_s()
        with pytest.raises(errors.KafkaTimeoutError):
            p.flush(0.2)
        assert clock.now_s() - start >= 0.2  # it waited out the timeout (virtual time)
    finally:
        held.release()
    assert f.result(5).offset == 0


def test_close_flushes_and_rejects_later_sends(fc, make):
    p = make(**{"linger.ms": 10_000})
    f = p.send("u", b"v")
    p.close(5)
    assert f.result(0).offset == 0
    with pytest.raises(errors.IllegalStateError):
        p.send("u", b"v")
    p.close()  # idempotent


# ---------------------------------------------------------------- transactions

def test_transactional_round_trip(fc, make):
    p = make(**{"transactional.id": "tx-a", "linger.ms": 20})
    p.init_transactions(5)
    assert calls(fc, "InitProducerId") == 1
    p.begin_transaction()
    futs = [p.send("t", f"v{i}".encode(), partition=i % 3) for i in range(30)]
    futs.append(p.send("u", b"w"))
    p.commit_transaction(5)
    assert all(f.done() for f in futs)
    assert futs[0].result(0) == RecordMetadata("t", 0, 0, futs[0].result(0).timestamp)
    assert ended(fc) == [("tx-a", True, frozenset({("t", 0), ("t", 1), ("t", 2), ("u", 0)}))]
    # one AddPartitionsToTxn for all partitions sent before the first drain
    assert calls(fc, "AddPartitionsToTxn") == 1
    for part in range(3):
        hs = batches(fc, "t", part)
        assert all(h.is_transactional and h.producer_epoch == 0 for h in hs)
        assert sum(h.record_count for h in hs) == 10
    assert all(req.transactional_id == "tx-a" for req in fc.requests_of("Produce"))
    # next transaction: partitions are added again
    p.begin_transaction()
    assert p.send("t", b"again", partition=0).result(5).offset == 11  # after the commit marker
    p.commit_transaction(5)
    assert calls(fc, "AddPartitionsToTxn") == 2 and len(ended(fc)) == 2


def test_with_transaction_version_2_the_leader_adds_the_partitions(v2):
    """KIP-890 part 2: a cluster advertising transaction version 2 gets no
    AddPartitionsToTxn; every Produce asks the leader to add its partitions, and each
    transaction ends under the next epoch."""
    fc, make = v2
    p = make(**{"transactional.id": "tx-implicit", "linger.ms": 5})
    p.init_transactions(5)
    for n in range(2):
        p.begin_transaction()
        futs = [p.send("t", b"v", partition=i % 3) for i in range(9)]
        p.commit_transaction(5)
        assert all(f.result(0).offset >= 0 for f in futs)
        assert ended(fc)[-1] == ("tx-implicit", True, frozenset({("t", 0), ("t", 1), ("t", 2)}))
        for part in range(3):
            assert {h.producer_epoch for h in batches(fc, "t", part)[-1:]} == {n}
    assert calls(fc, "AddPartitionsToTxn") == 0
    assert fc.requests_of("Produce") and all(r.add_partitions_to_txn for r in fc.requests_of("Produce"))


def test_the_first_batch_of_a_partition_in_a_transaction_goes_without_lingering(v2):
    """Implicit adds: the leader's AddPartitionsToTxn for a partition overlaps the
    filling of the next batches, so the first batch of each partition is sent at
    once; later ones linger as configured."""
    fc, make = v2
    # Virtual time that this thread's waits never jump (commit_transaction waits for real
    # answers); only its sleeps, and real time, move it.
    clock = MockTime(grace_s=30.0, runs=True)
    p = make(clock, **{"transactional.id": "tx-eager", "linger.ms": 60_000})
    p.init_transactions(5)
    p.begin_transaction()
    assert p.send("u", b"first").result(5).offset == 0
    appended = clock.now_s()
    later = p.send("u", b"second")
    # The sender thread goes to sleep until the batch's linger.ms is over (virtual time,
    # which only this thread moves): the second batch lingers.
    assert clock.wait_for_waiter(lambda deadline: deadline is not None and 59.9 <= deadline - appended <= 61)
    assert not later.done()
    p.commit_transaction(5)
    assert later.result(0).offset == 1
    p.begin_transaction()
    assert p.send("u", b"next transaction").result(5).offset > 1
    p.commit_transaction(5)


def test_implicit_adds_stay_off_for_a_cluster_without_transaction_version_2(fc, make):
    p = make(**{"transactional.id": "tx-explicit"})
    p.init_transactions(5)
    p.begin_transaction()
    p.send("u", b"v").result(5)
    p.commit_transaction(5)
    assert calls(fc, "AddPartitionsToTxn") == 1
    assert not any(r.add_partitions_to_txn for r in fc.requests_of("Produce"))


def test_an_abort_nothing_was_added_for_bumps_the_epoch(v2):
    """Implicit adds: the only batch failed, so the coordinator holds no transaction
    and EndTxn(abort) answers INVALID_TXN_STATE; a batch still on its way could make
    its leader add the partition to the producer's next transaction, so the producer
    takes a new epoch (InitProducerId with its PID and epoch) before going on."""
    fc, make = v2
    fc.fail_next("Produce", ErrorCode.INVALID_RECORD, topic="u")
    p = make(**{"transactional.id": "tx-bump"})
    p.init_transactions(5)
    epoch = p._txn.producer_epoch
    p.begin_transaction()
    with pytest.raises(Exception):
        p.send("u", b"lost").result(5)
    p.abort_transaction(5)
    assert calls(fc, "InitProducerId") == 2 and p._txn.producer_epoch == epoch + 1
    assert fc.batches("u", 0) == []
    p.begin_transaction()
    assert p.send("u", b"kept").result(5).offset == 0
    p.commit_transaction(5)
    assert ended(fc)[-1] == ("tx-bump", True, frozenset({("u", 0)}))


def test_empty_transaction_commits_without_end_txn(fc, make):
    p = make(**{"transactional.id": "tx-empty"})
    p.init_transactions(5)
    p.begin_transaction()
    p.commit_transaction(5)
    assert calls(fc, "EndTxn") == 0 and p._txn.state is TransactionManagerState.READY


def test_send_offsets_to_transaction(fc, make):
    p = make(**{"transactional.id": "tx-o"})
    p.init_transactions(5)
    p.begin_transaction()
    p.send("u", b"out")
    offsets = {TopicPartition("t", 0): OffsetAndMetadata(5, "m"), TopicPartition("t", 2): OffsetAndMetadata(9)}
    group = ConsumerGroupMetadata("g1", 0, "")  # a group without members is in generation 0
    p.send_offsets_to_transaction(offsets, group)
    p.send_offsets_to_transaction({TopicPartition("t", 1): OffsetAndMetadata(3)}, group)
    assert calls(fc, "AddOffsetsToTxn") == 1  # once per group per transaction
    req = fc.requests_of("TxnOffsetCommit")[-1]
    assert (req.group_id, req.generation_id, req.member_id, req.producer_epoch) == ("g1", 0, "", 0)
    assert fc.committed_offsets("g1") == {}
    p.commit_transaction(5)
    assert fc.committed_offsets("g1") == {("t", 0): 5, ("t", 2): 9, ("t", 1): 3}


def test_stale_generation_is_abortable(fc, make):
    p = make(**{"transactional.id": "tx-g"})
    p.init_transactions(5)
    p.begin_transaction()
    f = p.send("u", b"out")
    with pytest.raises(errors.IllegalGenerationError):
        p.send_offsets_to_transaction({TopicPartition("t", 0): OffsetAndMetadata(1)},
                                      ConsumerGroupMetadata("g2", 6, "m"))
    assert p._txn.state is TransactionManagerState.ABORTABLE_ERROR
    with pytest.raises(errors.IllegalGenerationError):
        p.commit_transaction(5)
    p.abort_transaction(5)
    assert ended(fc)[-1][1] is False
    f.exception(5)  # sent or aborted: it has an outcome
    p.begin_transaction()
    p.send_offsets_to_transaction({TopicPartition("t", 0): OffsetAndMetadata(1)},
                                  ConsumerGroupMetadata("g2", 0, ""))  # the group's generation
    p.commit_transaction(5)
    assert fc.committed_offsets("g2") == {("t", 0): 1}


def test_abort_drops_unsent_records(fc, make):
    p = make(**{"transactional.id": "tx-ab", "linger.ms": 60_000})
    p.init_transactions(5)
    p.begin_transaction()
    futs = [p.send("t", b"v", partition=0) for _ in range(5)]
    wait_for(lambda: p._txn.is_partition_added(TopicPartition("t", 0)), 5, "the sender to add t-0 to the transaction",
             interval_s=0.005)
    p.abort_transaction(5)
    for f in futs:
        assert isinstance(f.exception(0), TransactionAbortedError)
    assert batches(fc, "t", 0) == [] and ended(fc) == [("tx-ab", False, frozenset({("t", 0)}))]
    p.begin_transaction()
    f = p.send("t", b"v", partition=0)
    p.commit_transaction(5)  # flushes despite linger.ms
    assert f.result(0).offset == 1  # after the abort's marker


def test_abort_after_partial_send_keeps_sequences_valid(fc, make):
    p = make(**{"transactional.id": "tx-seq"})
    p.init_transactions(5)
    p.begin_transaction()
    p.send("u", b"a").result(5)
    p.abort_transaction(5)
    p.begin_transaction()
    assert p.send("u", b"b").result(5).offset == 2  # after the aborted record and its marker
    p.commit_transaction(5)


def test_concurrent_transactions_on_add_partitions_is_retried(fc, make):
    fc.fail_next("AddPartitionsToTxn", ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    p = make(**{"transactional.id": "tx-c"})
    p.init_transactions(5)
    p.begin_transaction()
    assert p.send("u", b"v").result(5).offset == 0
    p.commit_transaction(5)
    assert calls(fc, "AddPartitionsToTxn") == 3


def test_operation_not_attempted_follows_the_other_partitions_error(fc, make):
    fc.fail_next("AddPartitionsToTxn", ErrorCode.OPERATION_NOT_ATTEMPTED)
    p = make(**{"transactional.id": "tx-na"})
    p.init_transactions(5)
    p.begin_transaction()
    assert p.send("u", b"v").result(5).offset == 0
    p.commit_transaction(5)


def test_coordinator_errors_on_end_txn_are_retried(fc, make):
    fc.fail_next("EndTxn", ErrorCode.NOT_COORDINATOR, ErrorCode.CONCURRENT_TRANSACTIONS)
    p = make(MockTime(grace_s=30, runs=True), **{"transactional.id": "tx-e"})  # the retries' backoff on virtual time
    p.init_transactions(5)
    p.begin_transaction()
    p.send("u", b"v")
    finds = calls(fc, "FindCoordinator")
    p.commit_transaction(5)
    assert calls(fc, "EndTxn") == 3 and calls(fc, "FindCoordinator") > finds
    assert ended(fc)[-1][1] is True


def test_init_transactions_retries_then_times_out(fc, make):
    fc.fail_next("InitProducerId", ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    p = make(MockTime(grace_s=30, runs=True), **{"transactional.id": "tx-i"})  # the retries' backoff on virtual time
    p.init_transactions(5)
    assert p._txn.state is TransactionManagerState.READY
    clock = MockTime(runs=True)
    q = make(clock, **{"transactional.id": "tx-i2"})
    fc.fail_next("InitProducerId", *[ErrorCode.COORDINATOR_LOAD_IN_PROGRESS] * 1000)
    start = clock.now_s()
    with pytest.raises(errors.KafkaTimeoutError):
        q.init_transactions(0.3)
    # Retried until the timeout, on the virtual clock (the last try starts less than one
    # backoff, 50 ms + jitter, before it), not until max.block.ms (5 s).
    assert 0.3 - 0.07 <= clock.now_s() - start < 2.5
    fc.clear_faults()
    q.init_transactions(5)  # may be called again after a timeout


def test_invalid_transaction_timeout_is_fatal(fc, make):
    # Above the coordinator's transaction.max.timeout.ms (900000).
    p = make(**{"transactional.id": "tx-t", "transaction.timeout.ms": 900_001})
    with pytest.raises(errors.InvalidTransactionTimeoutError):
        p.init_transactions(5)
    with pytest.raises(errors.InvalidTransactionTimeoutError):
        p.begin_transaction()


def test_usage_errors(fc, make):
    p = make(**{"transactional.id": "tx-u"})
    with pytest.raises(errors.IllegalStateError):
        p.send("u", b"v")  # before init_transactions
    with pytest.raises(errors.IllegalStateError):
        p.begin_transaction()
    p.init_transactions(5)
    with pytest.raises(errors.IllegalStateError):
        p.send("u", b"v")  # outside a transaction
    with pytest.raises(errors.IllegalStateError):
        p.commit_transaction()
    with pytest.raises(errors.IllegalStateError):
        p.abort_transaction()
    with pytest.raises(errors.IllegalStateError):
        p.send_offsets_to_transaction({TopicPartition("t", 0): OffsetAndMetadata(1)}, "g")
    with pytest.raises(errors.IllegalStateError):
        p.init_transactions()
    with pytest.raises(errors.IllegalStateError):
        make().init_transactions()  # no transactional.id


# ---------------------------------------------------------------- fencing

def test_zombie_is_fenced_on_send_offsets_and_commit(fc, make):
    old = make(**{"transactional.id": "tx-z"})
    old.init_transactions(5)
    old.begin_transaction()
    old.send("t", b"before", partition=0).result(5)
    new = make(**{"transactional.id": "tx-z"})
    new.init_transactions(5)  # fences `old`, aborts its open transaction
    f = old.send("t", b"zombie", partition=0)
    with pytest.raises(errors.ProducerFencedError):
        f.result(5)
    with pytest.raises(errors.ProducerFencedError):
        old.send_offsets_to_transaction({TopicPartition("t", 0): OffsetAndMetadata(1)},
                                        ConsumerGroupMetadata("g", -1, ""))
    with pytest.raises(errors.ProducerFencedError):
        old.commit_transaction(5)
    with pytest.raises(errors.ProducerFencedError):
        old.abort_transaction(5)
    with pytest.raises(errors.ProducerFencedError):
        old.send("t", b"later", partition=0).result(5)
    assert old._txn.state is TransactionManagerState.FATAL_ERROR
    new.begin_transaction()
    new.send("t", b"new", partition=0).result(5)
    new.commit_transaction(5)


def test_fenced_on_send_offsets_first(fc, make):
    old = make(**{"transactional.id": "tx-z2"})
    old.init_transactions(5)
    make(**{"transactional.id": "tx-z2"}).init_transactions(5)
    old.begin_transaction()
    with pytest.raises(errors.ProducerFencedError):
        old.send_offsets_to_transaction({TopicPartition("t", 0): OffsetAndMetadata(1)}, "g")


def test_fenced_on_commit_first(fc, make):
    old = make(**{"transactional.id": "tx-z3"})
    old.init_transactions(5)
    old.begin_transaction()
    old.send("u", b"a").result(5)
    make(**{"transactional.id": "tx-z3"}).init_transactions(5)
    with pytest.raises(errors.ProducerFencedError):
        old.commit_transaction(5)


def test_invalid_producer_epoch_from_the_leader_is_fencing(fc, make):
    p = make(**{"transactional.id": "tx-l"})
    p.init_transactions(5)
    p.begin_transaction()
    p.send("u", b"a").result(5)
    fc.fail_next("Produce", ErrorCode.INVALID_PRODUCER_EPOCH, topic="u")
    f = p.send("u", b"b")
    with pytest.raises(errors.ProducerFencedError):
        f.result(5)
    with pytest.raises(errors.ProducerFencedError):
        p.commit_transaction(5)


def test_abort_after_an_unanswered_add_partitions_still_ends_the_transaction(fc, make):
    """AddPartitionsToTxn timed out: the coordinator may hold an Ongoing transaction the
    client never saw confirmed. The abort sends EndTxn anyway (Kafka finishes the
    pending add first); if the coordinator has no transaction, its INVALID_TXN_STATE
    means there was nothing to abort."""
    p = make(**{"transactional.id": "tx-amb", "linger.ms": 60_000})
    p.init_transactions(5)
    # The coordinator adds the partition, but every answer is lost.
    fc.fail_next("AddPartitionsToTxn", *[ErrorCode.REQUEST_TIMED_OUT] * 10_000, applied=True)
    p.begin_transaction()
    p.send("t", b"v", partition=0)
    wait_for(lambda: calls(fc, "AddPartitionsToTxn") >= 1, 5, "an AddPartitionsToTxn attempt", interval_s=0.005)
    p.abort_transaction(5)
    assert calls(fc, "EndTxn") == 1 and ended(fc)[-1] == ("tx-amb", False, frozenset({("t", 0)}))
    fc.clear_faults()
    # The same again, with a coordinator that never started the transaction.
    p.begin_transaction()
    fc.fail_next("AddPartitionsToTxn", *[ErrorCode.REQUEST_TIMED_OUT] * 10_000)
    adds = calls(fc, "AddPartitionsToTxn")
    p.send("t", b"w", partition=0)
    wait_for(lambda: calls(fc, "AddPartitionsToTxn") > adds, 5, "another AddPartitionsToTxn attempt",
             interval_s=0.005)
    p.abort_transaction(5)  # EndTxn answers INVALID_TXN_STATE: nothing to abort, no error
    assert calls(fc, "EndTxn") == 2 and len(ended(fc)) == 1
    fc.clear_faults()
    p.begin_transaction()
    f = p.send("t", b"x", partition=0)
    p.commit_transaction(5)
    assert f.result(0).offset == 1  # after the first abort's marker


def test_a_commit_whose_flush_timed_out_may_be_called_again_and_completes(fc, make):
    """commit_transaction() raising KafkaTimeoutError (retriable, not abortable) because its
    records were not acknowledged in time leaves the commit in progress: called again, it
    waits for them and ends the transaction (Kafka's commitTransaction() after a
    TimeoutException), instead of re-raising the timeout at once for ever."""
    clock = MockTime(runs=True)
    p = make(clock, **{"transactional.id": "tx-ft"})
    p.init_transactions(5)
    p.begin_transaction()
    held = fc.hold_next("Produce")
    try:
        f = p.send("t", b"v", partition=0)
        with pytest.raises(errors.KafkaTimeoutError) as timed_out:
            p.commit_transaction(0.2)
        assert timed_out.value.retriable and not timed_out.value.txn_requires_abort
        assert p._txn.state is TransactionManagerState.COMMITTING_TRANSACTION
        with pytest.raises(errors.KafkaTimeoutError):
            p.commit_transaction(0.2)  # still held: it waited again, it did not fail at once
        with pytest.raises(errors.IllegalStateError, match="commit_transaction.. timed out and must be called again"):
            p.abort_transaction()
        assert not ended(fc)
    finally:
        held.release()
    p.commit_transaction(5)
    assert f.result(0).offset == 0 and ended(fc) == [("tx-ft", True, frozenset({("t", 0)}))]
    with pytest.raises(errors.IllegalStateError):
        p.abort_transaction()  # nothing open any more
