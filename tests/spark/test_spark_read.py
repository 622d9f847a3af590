"""Reading through the `exactly` Spark data source with real pyspark (local mode):
a batch read equals what the SDK consumer reads (read_committed by default),
offsets in Spark's Kafka source forms, read_uncommitted shows aborted
transactions, one Spark partition per topic partition; the streaming reader stops
at the LSO under read_committed and replays a micro-batch identically."""
from __future__ import annotations

import json

import pytest
from spark_helpers import create_topic, sdk_read

from exactly import Producer

pytestmark = pytest.mark.integration


def _fill(bootstrap: str, topic: str) -> dict[str, list[bytes]]:
    """Plain records (with headers, a null key and a null value), a committed and an
    aborted transaction. Returns the values by kind."""
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(30):
        plain.send(topic, f"p{i}".encode(), key=f"k{i}".encode(), headers=[("h", f"{i}".encode()), ("n", None)])
    plain.send(topic, None, key=b"tombstone", partition=0)
    plain.send(topic, b"no-key", partition=1)
    plain.flush()
    plain.close()
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx", "linger.ms": 5})
    tx.init_transactions()
    tx.begin_transaction()
    for i in range(20):
        tx.send(topic, f"c{i}".encode(), key=f"c{i}".encode())
    tx.commit_transaction()
    tx.begin_transaction()
    for i in range(15):
        tx.send(topic, f"a{i}".encode(), key=f"a{i}".encode())
    tx.flush()
    tx.abort_transaction()
    tx.close()
    return {"aborted": [f"a{i}".encode() for i in range(15)]}


def _spark_rows(df) -> list[tuple]:
    rows = df.selectExpr("topic", "partition", "offset", "key", "value", "unix_millis(timestamp) AS ts",
                         "headers").collect()
    return sorted((r.topic, r.partition, r.offset, r.key, r.value, r.ts,
                   tuple((h.key, h.value) for h in r.headers)) for r in rows)


def _sdk_rows(records) -> list[tuple]:
    return sorted((r.topic, r.partition, r.offset, r.key, r.value, r.timestamp, tuple(r.headers))
                  for r in records)


@pytest.fixture(scope="module")
def filled(spark_cluster):
    bootstrap = spark_cluster.bootstrap_servers
    topic = create_topic(bootstrap)
    return bootstrap, topic, _fill(bootstrap, topic)


def _reader(spark, bootstrap, **options):
    r = spark.read.format("exactly").option("bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_batch_read_equals_the_sdk_consumer(spark, filled):
    bootstrap, topic, _ = filled
    df = _reader(spark, bootstrap, subscribe=topic)
    assert df.rdd.getNumPartitions() == 3  # one Spark partition per topic partition
    assert [f.name for f in df.schema.fields] == ["topic", "partition", "offset", "key", "value", "timestamp",
                                                  "headers"]
    got = _spark_rows(df)
    expected = _sdk_rows(sdk_read(bootstrap, topic, "read_committed"))
    assert got == expected
    assert len(got) == 30 + 2 + 20
    values = {r[4] for r in got}
    assert None in values and b"c0" in values and b"a0" not in values


def test_read_uncommitted_shows_aborted_transactions(spark, filled):
    bootstrap, topic, kinds = filled
    df = _reader(spark, bootstrap, topic=topic, **{"isolation.level": "read_uncommitted"})
    got = _spark_rows(df)
    assert got == _sdk_rows(sdk_read(bootstrap, topic, "read_uncommitted"))
    assert sorted(v for *_, v, _ts, _h in got if v in kinds["aborted"]) == sorted(kinds["aborted"])
    committed = _reader(spark, bootstrap, topic=topic).count()
    assert len(got) - committed == len(kinds["aborted"])


def test_offsets_in_the_json_per_partition_form(spark, filled):
    bootstrap, topic, _ = filled
    start = json.dumps({topic: {"0": 2, "1": -2}})          # partition 2: the default, earliest
    end = json.dumps({topic: {"0": 5, "1": -1}})            # partition 2: the default, latest
    got = _spark_rows(_reader(spark, bootstrap, subscribe=topic, startingOffsets=start, endingOffsets=end))
    everything = _sdk_rows(sdk_read(bootstrap, topic, "read_committed"))
    assert got == [r for r in everything if r[1] != 0 or 2 <= r[2] < 5]
    latest_only = _reader(spark, bootstrap, subscribe=topic, startingOffsets="latest").count()
    assert latest_only == 0
    with pytest.raises(Exception, match="endingOffsets cannot be earliest"):
        _reader(spark, bootstrap, subscribe=topic, endingOffsets="earliest").collect()


def test_stream_reader_stops_at_the_lso_and_replays_identically(spark_cluster):
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from exactly.spark.datasource import ExactlyStreamReader

    bootstrap = spark_cluster.bootstrap_servers
    topic = create_topic(bootstrap, partitions=1)
    plain = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        plain.send(topic, f"p{i}".encode(), partition=0)
    plain.flush()
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-open"})
    tx.init_transactions()
    tx.begin_transaction()
    for i in range(5):
        tx.send(topic, f"o{i}".encode(), partition=0)
    tx.flush()  # an open transaction from offset 10 on
    for i in range(10, 13):
        plain.send(topic, f"p{i}".encode(), partition=0)
    plain.flush()
    try:
        committed = ExactlyStreamReader({"bootstrap.servers": bootstrap, "subscribe": topic,
                                         "startingOffsets": "earliest"})
        start = committed.initialOffset()
        assert start == {topic: {"0": 0}}
        end = committed.latestOffset(start, ReadAllAvailable())
        assert end == {topic: {"0": 10}}  # the LSO: the open transaction starts at 10
        uncommitted = ExactlyStreamReader({"bootstrap.servers": bootstrap, "subscribe": topic,
                                           "isolation.level": "read_uncommitted"})
        assert uncommitted.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 18}}
        limited = ExactlyStreamReader({"bootstrap.servers": bootstrap, "subscribe": topic,
                                       "maxOffsetsPerTrigger": "4"})
        assert limited.latestOffset(start, limited.getDefaultReadLimit()) == {topic: {"0": 4}}
        [part] = committed.partitions(start, end)
        first = list(committed.read(part))
        assert [r[4] for r in first] == [f"p{i}".encode() for i in range(10)]
    finally:
        tx.abort_transaction()
        tx.close()
        plain.close()
    # After the abort the LSO moves on; the planned micro-batch reads the same rows.
    assert list(committed.read(part)) == first
    end2 = committed.latestOffset(end, ReadAllAvailable())
    [part2] = committed.partitions(end, end2)
    assert [r[4] for r in committed.read(part2)] == [f"p{i}".encode() for i in range(10, 13)]
    assert committed.partitions(end2, end2) == []
