"""Options of the `exactly` Spark data source (pure): offsets in Spark's Kafka
source forms, topics, isolation level, rate limiting, transactional.id derivation,
sink options and test hooks."""
import pytest

from exactly.spark._options import (EARLIEST, LATEST, FailTaskHook, HoldCommitHook, OffsetSpec, OptionError,
                                    isolation_level, max_offsets_per_trigger, normalize, parse_offsets,
                                    query_id_prefix, rate_limit, topics, transactional_id, write_options)


def test_normalize_lowercases_and_accepts_the_kafka_prefix():
    opts = normalize({"Kafka.Bootstrap.Servers": "a:1", "isolation.level": "read_uncommitted",
                      "kafka.isolation.level": "read_committed", "x": None})
    assert opts == {"bootstrap.servers": "a:1", "isolation.level": "read_uncommitted"}


def test_topics_from_subscribe_or_topic():
    assert topics({"subscribe": "b, a,b"}) == ["a", "b"]
    assert topics({"topic": "t"}) == ["t"]
    for bad in ({}, {"subscribe": "a", "topic": "b"}, {"topic": "bad name"}):
        with pytest.raises(OptionError):
            topics(bad)


def test_isolation_level_defaults_to_read_committed():
    assert isolation_level({}) == "read_committed"
    assert isolation_level({"isolation.level": "READ_UNCOMMITTED"}) == "read_uncommitted"
    with pytest.raises(OptionError):
        isolation_level({"isolation.level": "dirty"})


def test_offsets_keywords_and_default():
    assert parse_offsets(None, EARLIEST, "startingOffsets") == OffsetSpec(EARLIEST)
    assert parse_offsets("latest", EARLIEST, "startingOffsets") == OffsetSpec(LATEST)
    assert parse_offsets(" Earliest ", LATEST, "startingOffsets") == OffsetSpec(EARLIEST)


def test_offsets_json_per_partition_form():
    spec = parse_offsets('{"t": {"0": 23, "1": -2}, "u": {"2": -1}}', LATEST, "startingOffsets")
    assert spec.offset_for("t", 0) == 23
    assert spec.offset_for("t", 1) == EARLIEST
    assert spec.offset_for("u", 2) == LATEST
    assert spec.offset_for("t", 5) == LATEST  # not listed: the default
    assert spec.topics == {"t", "u"}


@pytest.mark.parametrize("text", ["{", "[1]", '{"t": 3}', '{"t": {"x": 1}}', '{"t": {"0": -3}}',
                                  '{"t": {"0": "5"}}', '{"t": {"0": true}}'])
def test_offsets_rejects_malformed_json(text):
    with pytest.raises(OptionError):
        parse_offsets(text, LATEST, "startingOffsets")


def test_ending_offsets_cannot_be_earliest():
    with pytest.raises(OptionError):
        parse_offsets("earliest", LATEST, "endingOffsets", allow_earliest=False)
    with pytest.raises(OptionError):
        parse_offsets('{"t": {"0": -2}}', LATEST, "endingOffsets", allow_earliest=False)
    assert parse_offsets('{"t": {"0": 7}}', LATEST, "endingOffsets", allow_earliest=False).offset_for("t", 0) == 7


def test_max_offsets_per_trigger():
    assert max_offsets_per_trigger({}) is None
    assert max_offsets_per_trigger({"maxoffsetspertrigger": "1500"}) == 1500
    for bad in ("0", "-1", "x"):
        with pytest.raises(OptionError):
            max_offsets_per_trigger({"maxoffsetspertrigger": bad})


def test_rate_limit_splits_the_limit_in_proportion_to_backlogs():
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    latest = {("t", 0): 300, ("t", 1): 200, ("t", 2): 50}
    assert rate_limit(start, latest, None) == latest
    assert rate_limit(start, latest, 1000) == latest
    assert rate_limit(start, latest, 200) == {("t", 0): 150, ("t", 1): 150, ("t", 2): 50}
    # A partition with a small backlog still advances.
    assert rate_limit({("t", 0): 0, ("t", 1): 0}, {("t", 0): 1000, ("t", 1): 1}, 10) == {("t", 0): 9, ("t", 1): 1}
    # Never below the start (e.g. the LSO read before a restart was lower).
    assert rate_limit({("t", 0): 10}, {("t", 0): 5}, 3) == {("t", 0): 10}


def test_transactional_id_derivation():
    assert transactional_id("spark-", "q1", 2, 0) == "spark-q1-2-0"
    assert transactional_id("app.", "q1", 0, 3).startswith(query_id_prefix("app.", "q1"))
    # Different partitions and attempts never share a transactional.id.
    ids = {transactional_id("p-", "q", part, attempt) for part in range(12) for attempt in range(12)}
    assert len(ids) == 144
    for bad in (("p-", "", 0, 0), ("p-", "q", -1, 0), ("p-", "q", 0, -1)):
        with pytest.raises(OptionError):
            transactional_id(*bad)


def test_write_options():
    w = write_options({"kafka.bootstrap.servers": "h:1", "topic": "out", "linger.ms": "7",
                       "transactional.id.prefix": "app-", "exactly.test.fail.task": "1:0:200",
                       "exactly.test.hold.commit": "3:1:/tmp/x:y"})
    assert (w.bootstrap_servers, w.topic, w.transactional_id_prefix, w.commits_topic) == \
        ("h:1", "out", "app-", "_exactly_spark_commits")
    assert w.fail_task == FailTaskHook(1, 0, 200)
    assert w.hold_commit == HoldCommitHook(3, 1, "/tmp/x:y")
    conf = w.producer_conf("app-q-0-0")
    assert conf["transactional.id"] == "app-q-0-0" and conf["linger.ms"] == "7"
    assert conf["transaction.timeout.ms"] == "60000"
    for bad in ({}, {"bootstrap.servers": "h:1", "commits.topic": "__x"},
                {"bootstrap.servers": "h:1", "exactly.test.fail.task": "1:2"},
                {"bootstrap.servers": "h:1", "transaction.timeout.ms": "0"}):
        with pytest.raises(OptionError):
            write_options(bad)
