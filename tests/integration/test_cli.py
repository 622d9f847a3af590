"""The `exactly` command line through its installed entry point (`.venv/bin/exactly`
in a subprocess) against real processes: every subcommand, --json, and the error
paths (a bad flag, an unknown topic, an unreachable cluster: one line on stderr, a
non-zero exit, no traceback). docs/operating/cli.md."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from exactly import AdminClient, TopicPartition
from clusters import chrooted_cluster
from waiting import wait_for

pytestmark = pytest.mark.integration

EXACTLY = pathlib.Path(sys.executable).parent / "exactly"


@pytest.fixture(scope="module")
def cli_cluster(zk, tmp_path_factory):
    """One cluster (3 partition leaders) for the CLI tests of this module."""
    c = chrooted_cluster(zk, tmp_path_factory.mktemp("cli-cluster"), "cli")
    yield c
    c.down()


def run(*args: str, bs: str | None = None, stdin: str | None = None, ok: bool = True,
        timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `exactly ARGS` (with --bootstrap-server bs when given); with ok, assert exit 0."""
    cmd = [str(EXACTLY), *args] + (["--bootstrap-server", bs] if bs else [])
    env = {k: v for k, v in os.environ.items() if k != "EXACTLY_DEBUG"}
    res = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)
    if ok:
        assert res.returncode == 0, f"{cmd}: rc {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    return res


def run_json(*args: str, bs: str | None = None, stdin: str | None = None):
    return json.loads(run(*args, "--json", bs=bs, stdin=stdin).stdout)


def assert_one_line_error(res: subprocess.CompletedProcess, *words: str, code: int | None = None) -> None:
    assert res.returncode != 0 and (code is None or res.returncode == code), res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("exactly: error: "), lines
    assert "Traceback" not in res.stderr + res.stdout
    for w in words:
        assert w in lines[0], lines[0]


def test_topics_commands(cli_cluster):
    bs = cli_cluster.bootstrap_servers
    out = run("topics", "create", "--topic", "cli-t", "--partitions", "3", "--replication-factor", "2",
              "--config", "segment.bytes=1048576", bs=bs).stdout
    assert "Created topic cli-t." in out
    assert run_json("topics", "create", "--topic", "cli-t", "--if-not-exists", bs=bs)["created"] is False
    assert_one_line_error(run("topics", "create", "--topic", "cli-t", bs=bs, ok=False), "TopicAlreadyExistsError")
    listed = {t["topic"]: t for t in run_json("topics", "list", bs=bs)}
    assert listed["cli-t"] == {"topic": "cli-t", "partitions": 3, "replication_factor": 2}
    assert "cli-t" in run("topics", "list", bs=bs).stdout
    assert "__consumer_offsets" in run("topics", "list", "--include-internal", bs=bs).stdout
    desc = run_json("topics", "describe", "--topic", "cli-t", bs=bs)[0]
    assert desc["configs"] == {"segment.bytes": "1048576"} and len(desc["partitions"]) == 3
    assert all(len(p["isr"]) == 2 for p in desc["partitions"])
    table = run("topics", "describe", "--topic", "cli-t", bs=bs).stdout
    assert "PartitionCount: 3" in table and "segment.bytes=1048576" in table and "LEADER" in table
    altered = run_json("topics", "alter-config", "--topic", "cli-t", "--config", "retention.ms=3600000",
                       "--delete-config", "segment.bytes", bs=bs)
    assert altered["configs"]["retention.ms"] == {"value": "3600000", "source": "TOPIC_CONFIG"}
    assert altered["configs"]["segment.bytes"]["source"] == "DEFAULT_CONFIG"
    assert "retention.ms" in run("topics", "alter-config", "--topic", "cli-t", "--config", "retention.ms=7200000",
                                 bs=bs).stdout
    assert_one_line_error(run("topics", "alter-config", "--topic", "cli-t", "--config", "retention.msec=1",
                              bs=bs, ok=False), "InvalidConfigError", "unknown topic config 'retention.msec'")
    assert_one_line_error(run("topics", "alter-config", "--topic", "cli-t", "--config", "novalue", bs=bs,
                              ok=False), "--config", code=2)
    assert run_json("topics", "add-partitions", "--topic", "cli-t", "--partitions", "4", bs=bs)["partitions"] == 4
    assert len(run_json("topics", "describe", "--topic", "cli-t", bs=bs)[0]["partitions"]) == 4
    assert "now has 5 partitions" in run("topics", "add-partitions", "--topic", "cli-t", "--partitions", "5",
                                         bs=bs).stdout
    assert run_json("topics", "delete", "--topic", "cli-t", bs=bs) == {"deleted": ["cli-t"]}
    run("topics", "create", "--topic", "cli-t2", bs=bs)
    run("produce", "cli-t2", bs=bs, stdin="".join(f"r{i}\n" for i in range(10)))
    assert run_json("topics", "delete-records", "--topic", "cli-t2", "--offset", "4", bs=bs) == [
        {"topic": "cli-t2", "partition": 0, "low_watermark": 4}]
    assert "LOW-WATERMARK" in run("topics", "delete-records", "--topic", "cli-t2", "--partition", "0",
                                  "--offset", "-1", bs=bs).stdout
    with AdminClient({"bootstrap.servers": bs}) as admin:
        assert admin.list_start_offsets([TopicPartition("cli-t2", 0)]) == {("cli-t2", 0): 10}
    assert_one_line_error(run("topics", "delete-records", "--topic", "cli-t2", "--offset", "99", bs=bs, ok=False),
                          "OffsetOutOfRangeError", code=1)
    assert_one_line_error(run("topics", "delete-records", "--topic", "nope", "--offset", "1", bs=bs, ok=False),
                          "UnknownTopicOrPartitionError", code=1)
    assert "Deleted topic cli-t2." in run("topics", "delete", "--topic", "cli-t2", bs=bs).stdout
    assert "cli-t" not in {t["topic"] for t in run_json("topics", "list", bs=bs)}
    for args in (("topics", "describe", "--topic", "cli-t"), ("topics", "delete", "--topic", "cli-t"),
                 ("topics", "alter-config", "--topic", "cli-t", "--config", "retention.ms=1")):
        assert_one_line_error(run(*args, bs=bs, ok=False), "UnknownTopicOrPartitionError", code=1)


def test_produce_consume_and_groups(cli_cluster):
    bs = cli_cluster.bootstrap_servers
    run("topics", "create", "--topic", "cli-pc", "--partitions", "1", bs=bs)
    res = run("produce", "cli-pc", "--key-separator", ":", "--header", "source=cli", "--header", "n=1",
              bs=bs, stdin="k1:hello\nk2:world\nno key here\n")
    assert "Produced 3 records" in res.stderr
    sent = run_json("produce", "cli-pc", bs=bs, stdin="four\nfive\n")
    assert sent["records"] == 2 and [o["offset"] for o in sent["offsets"]] == [3, 4]
    recs = [json.loads(line) for line in run("consume", "cli-pc", "--from-beginning", "--max-records", "5",
                                             "--format", "json", bs=bs).stdout.splitlines()]
    assert [(r["key"], r["value"]) for r in recs] == [("k1", "hello"), ("k2", "world"), (None, "no key here"),
                                                      (None, "four"), (None, "five")]
    assert recs[0]["headers"] == {"source": "cli", "n": "1"} and recs[4]["offset"] == 4
    text = run("consume", "cli-pc", "--from-beginning", "--max-records", "2", "--print-key", bs=bs)
    assert text.stdout.splitlines() == ["k1\thello", "k2\tworld"] and "Processed a total of 2" in text.stderr
    # Transactional produce, read_committed consume.
    run("produce", "cli-pc", "--transactional-id", "cli-txn", bs=bs, stdin="t1\nt2\n")
    committed = run("consume", "cli-pc", "--from-beginning", "--isolation-level", "read_committed",
                    "--timeout-ms", "1500", bs=bs).stdout.splitlines()
    assert committed == ["hello", "world", "no key here", "four", "five", "t1", "t2"]
    # A group consumes 4 records and commits; lag = 7 records + 1 marker - 4 = 4. A
    # coordinator that retries WriteTxnMarkers after an answer lost to a timeout writes
    # the marker again (as Kafka does): the log end is read, at least 8.
    run("consume", "cli-pc", "--group", "cli-g", "--from-beginning", "--max-records", "4", bs=bs)
    groups = run_json("groups", "list", bs=bs)
    assert {"group": "cli-g", "state": "Empty", "protocol_type": "consumer"} in groups
    assert "cli-g" in run("groups", "list", "--state", "Empty", bs=bs).stdout
    with AdminClient({"bootstrap.servers": bs}) as admin:
        end, lso = admin.list_offsets([TopicPartition("cli-pc", 0)])[TopicPartition("cli-pc", 0)]
    assert end == lso >= 8
    desc = run_json("groups", "describe", "--group", "cli-g", bs=bs)[0]
    assert desc["state"] == "Empty" and desc["offsets"] == [
        {"topic": "cli-pc", "partition": 0, "current_offset": 4, "log_end_offset": end, "last_stable_offset": end,
         "lag": end - 4, "member_id": None}]
    table = run("groups", "describe", "--group", "cli-g", "--isolation-level", "read_committed", bs=bs).stdout
    assert "CURRENT-OFFSET" in table and "LAG" in table and "cli-pc" in table
    # Reset to the beginning: dry run first, then --execute.
    plan = run("groups", "reset-offsets", "--group", "cli-g", "--topic", "cli-pc", "--to-earliest", bs=bs)
    assert "dry run" in plan.stderr
    assert run_json("groups", "describe", "--group", "cli-g", bs=bs)[0]["offsets"][0]["current_offset"] == 4
    done = run_json("groups", "reset-offsets", "--group", "cli-g", "--topic", "cli-pc:0", "--shift-by", "-3",
                    "--execute", bs=bs)
    assert done["offsets"] == [{"topic": "cli-pc", "partition": 0, "new_offset": 1}] and done["executed"]
    run("groups", "reset-offsets", "--group", "cli-g", "--topic", "cli-pc", "--to-offset", "2", "--execute", bs=bs)
    assert run_json("groups", "describe", "--group", "cli-g", bs=bs)[0]["offsets"][0]["lag"] == end - 2
    assert_one_line_error(run("groups", "reset-offsets", "--group", "cli-g", "--topic", "cli-pc", bs=bs, ok=False),
                          "exactly one of", code=2)
    assert "Deleted group cli-g." in run("groups", "delete", "--group", "cli-g", bs=bs).stdout
    assert_one_line_error(run("groups", "describe", "--group", "cli-g", bs=bs, ok=False), "GroupIdNotFoundError")
    assert_one_line_error(run("groups", "delete", "--group", "cli-g", "--json", bs=bs, ok=False),
                          "GroupIdNotFoundError")
    run("consume", "cli-pc", "--group", "cli-g2", "--from-beginning", "--max-records", "1", bs=bs)
    assert run_json("groups", "delete", "--group", "cli-g2", bs=bs) == {"deleted": ["cli-g2"]}
    # transactions list / describe / describe-producers
    listed = run_json("transactions", "list", bs=bs)
    assert {"transactional_id": "cli-txn", "state": "CompleteCommit"}.items() <= \
        next(t for t in listed if t["transactional_id"] == "cli-txn").items()
    assert "cli-txn" in run("transactions", "list", "--state", "CompleteCommit", bs=bs).stdout
    assert run_json("transactions", "list", "--state", "Ongoing", bs=bs) == []
    assert run_json("transactions", "list", "--duration-ms", "3600000", bs=bs) == []
    described = run_json("transactions", "describe", "--transactional-id", "cli-txn", bs=bs)[0]
    assert described["state"] == "CompleteCommit" and described["producer_id"] >= 0
    assert "CompleteCommit" in run("transactions", "describe", "--transactional-id", "cli-txn", bs=bs).stdout
    assert_one_line_error(run("transactions", "describe", "--transactional-id", "nobody", bs=bs, ok=False),
                          "TransactionalIdNotFoundError")
    producers = run_json("transactions", "describe-producers", "--topic", "cli-pc", "--partition", "0", bs=bs)
    txn_pid = [p for p in producers if p["producer_id"] == described["producer_id"]]
    assert txn_pid and txn_pid[0]["current_transaction_start_offset"] == -1 and txn_pid[0]["coordinator_epoch"] >= 0
    assert "CURRENT-TXN-START-OFFSET" in run("transactions", "describe-producers", "--topic", "cli-pc", bs=bs).stdout
    assert run_json("transactions", "find-hanging", "--topic", "cli-pc", bs=bs) == []
    assert "no hanging transactions" in run("transactions", "find-hanging", bs=bs).stdout


@pytest.mark.parametrize("form", ["positional", "--topic"])
def test_produce_and_consume_take_the_topic_either_way(cli_cluster, form):
    """`exactly produce|consume TOPIC` and, as kafka-console-producer/consumer take it,
    `--topic TOPIC`; neither, or two different topics, is a usage error."""
    bs = cli_cluster.bootstrap_servers
    topic = f"cli-form-{form.strip('-')}"
    run("topics", "create", "--topic", topic, "--partitions", "1", bs=bs)
    where = [topic] if form == "positional" else ["--topic", topic]
    assert "Produced 2 records" in run("produce", *where, bs=bs, stdin="one\ntwo\n").stderr
    got = run("consume", *where, "--from-beginning", "--max-records", "2", bs=bs)
    assert got.stdout.splitlines() == ["one", "two"]
    for command in ("produce", "consume"):
        assert_one_line_error(run(command, bs=bs, stdin="", ok=False), "missing the topic", code=2)
        assert_one_line_error(run(command, topic, "--topic", "other", bs=bs, stdin="", ok=False),
                              "two topics", code=2)


def test_dump_log(cli_cluster):
    bs = cli_cluster.bootstrap_servers
    run("topics", "create", "--topic", "cli-dump", bs=bs)
    run("produce", "cli-dump", "--key-separator", "=", bs=bs, stdin="a=1\nb=2\n")
    run("produce", "cli-dump", "--transactional-id", "dump-txn", bs=bs, stdin="t\n")
    with AdminClient({"bootstrap.servers": bs}) as admin:
        leader = admin.describe_topics(["cli-dump"])["cli-dump"].partitions[0].leader_id
    segment = cli_cluster.dir / leader / "logs" / "cli-dump-0" / f"{0:020d}.log"
    wait_for(lambda: segment.stat().st_size > 0, 10, "the segment has data")
    dump = json.loads(run("dump-log", str(segment), "--print-data", "--json").stdout)
    batches = dump["batches"]
    assert dump["trailing_bytes"] == 0 and all(b["crc_valid"] for b in batches)
    data = [r for b in batches if not b["is_control"] for r in b["records"]]
    assert [(r["key"], r["value"]) for r in data] == [("a", "1"), ("b", "2"), (None, "t")]
    txn = [b for b in batches if b["is_transactional"]]
    assert [b["is_control"] for b in txn] == [False, True]
    assert txn[1]["marker"] == "COMMIT" and txn[1]["coordinator_epoch"] >= 0
    assert txn[0]["producer_id"] == txn[1]["producer_id"] >= 0 and txn[0]["base_sequence"] == 0
    text = run("dump-log", str(segment), "--print-data").stdout
    assert "endTxnMarker: COMMIT" in text and "isTransactional: true" in text and "payload: 1" in text
    assert "payload" not in run("dump-log", str(segment)).stdout
    assert_one_line_error(run("dump-log", "/nonexistent/00000000000000000000.log", ok=False), "does not exist",
                          code=2)


def test_perf(cli_cluster):
    bs = cli_cluster.bootstrap_servers
    run("topics", "create", "--topic", "cli-perf", "--partitions", "2", bs=bs)
    res = run_json("perf", "produce", "--topic", "cli-perf", "--num-records", "500", "--record-size", "64", bs=bs)
    assert res["records"] == 500 and res["records_per_s"] > 0 and res["p99_ms"] >= res["p50_ms"] > 0
    text = run("perf", "produce", "--topic", "cli-perf", "--num-records", "100", "--transactional-id", "perf-txn",
               "--transaction-size", "30", bs=bs).stdout
    assert "100 records sent" in text and "99th" in text
    got = run_json("perf", "consume", "--topic", "cli-perf", "--messages", "600", bs=bs)
    assert got["records"] == 600 and got["complete"] and got["mb"] > 0
    assert "records/sec" in run("perf", "consume", "--topic", "cli-perf", "--messages", "10", "--group", "perf-g",
                                bs=bs).stdout


def test_error_paths(cli_cluster, tmp_path):
    bs = cli_cluster.bootstrap_servers
    assert_one_line_error(run("topics", "list", "--bogus", bs=bs, ok=False), "--bogus", code=2)
    assert_one_line_error(run("no-such-command", ok=False), "no-such-command", code=2)
    assert_one_line_error(run("topics", "create", "--partitions", "0", "--topic", "x", bs=bs, ok=False),
                          "--partitions", code=2)
    assert_one_line_error(run("produce", "missing-topic", bs=bs, stdin="x\n", ok=False),
                          "UnknownTopicOrPartitionError", code=1)
    assert_one_line_error(run("consume", "missing-topic", "--max-records", "1", bs=bs, ok=False),
                          "UnknownTopicOrPartitionError", code=1)
    assert_one_line_error(run("transactions", "describe-producers", "--topic", "missing-topic", bs=bs, ok=False),
                          "UnknownTopicOrPartitionError", code=1)
    conf = tmp_path / "client.properties"
    conf.write_text("# short waits for the test\nrequest.timeout.ms=1500\nretry.backoff.max.ms=200\n")
    for args in (("topics", "list"), ("groups", "list"), ("transactions", "list"), ("produce", "t"),
                 ("consume", "t"), ("perf", "produce", "--topic", "t", "--num-records", "1")):
        res = run(*args, "--command-config", str(conf), bs="127.0.0.1:1", stdin="x\n", ok=False, timeout=60)
        assert_one_line_error(res, "cannot reach the cluster", code=1)
    bad = tmp_path / "bad.properties"
    bad.write_text("no.such.key=1\n")
    assert_one_line_error(run("topics", "list", "--command-config", str(bad), bs=bs, ok=False), "no.such.key")
    assert_one_line_error(run("topics", "list", "--command-config", str(tmp_path / "missing"), bs=bs, ok=False),
                          "cannot read --command-config")
    # --command-config may carry bootstrap.servers itself.
    good = tmp_path / "good.properties"
    good.write_text(f"bootstrap.servers={bs}\nclient.id=cli-test\n")
    assert isinstance(run_json("topics", "list", "--command-config", str(good)), list)
    assert run("--help").stdout.startswith("Usage: exactly")


def test_hanging_transaction_found_and_aborted(make_cluster):
    """A transactional batch written with the raw Produce stub under a producer id no
    transaction coordinator ever registered (a broker without KIP-890 verification)
    holds the LSO back; find-hanging lists it, abort writes the ABORT marker, the
    LSO moves and a stuck read_committed consumer goes on."""
    import grpc

    from exactly import Consumer, TopicPartition
    from exactly_wire import records
    from exactly_wire.clock import wall_clock_ms
    from exactly_wire.v1 import exactly_pb2 as pb
    from exactly_wire.v1 import exactly_pb2_grpc as pbg

    cluster = make_cluster(partition_leaders=1, props={"transaction.partition.verification.enable": "false"})
    bs = cluster.bootstrap_servers
    run("topics", "create", "--topic", "hang", bs=bs)
    run("produce", "hang", bs=bs, stdin="before-1\nbefore-2\n")
    hour_ago = wall_clock_ms() - 3_600_000
    pid = 7_000_000_001
    batch = records.encode_batch([(None, b"hanging", (), hour_ago)], producer_id=pid, producer_epoch=3,
                                 base_sequence=0, transactional=True)
    with grpc.insecure_channel(bs) as ch:
        resp = pbg.PartitionLeaderStub(ch).Produce(pb.ProduceRequest(acks=-1, timeout_ms=10000, topics=[
            pb.TopicProduceData(name="hang", partitions=[pb.PartitionProduceData(partition=0, records=batch)])]))
    assert resp.topics[0].partitions[0].error_code == 0 and resp.topics[0].partitions[0].base_offset == 2
    run("produce", "hang", bs=bs, stdin="after-1\nafter-2\n")

    tp = TopicPartition("hang", 0)
    consumer = Consumer({"bootstrap.servers": bs, "isolation.level": "read_committed"})
    consumer.assign([tp])
    consumer.seek_to_beginning([tp])
    seen: list[bytes] = []
    wait_for(lambda: seen.extend(r.value for r in consumer.poll(0.2)) or len(seen) >= 2, 20, "the records before")
    assert seen == [b"before-1", b"before-2"]
    assert consumer.poll(0.5) == [], "read_committed stops at the hanging transaction"
    with AdminClient({"bootstrap.servers": bs}) as admin:
        assert admin.list_offsets([tp])[tp] == (5, 2)

    hanging = run_json("transactions", "find-hanging", bs=bs)
    assert hanging == [{"topic": "hang", "partition": 0, "producer_id": pid, "producer_epoch": 3,
                        "coordinator_epoch": -1, "start_offset": 2, "last_timestamp": hour_ago,
                        "duration_ms": hanging[0]["duration_ms"], "transactional_id": None,
                        "reason": f"no transaction coordinator knows producer id {pid}", "prepared_state": None}]
    assert hanging[0]["duration_ms"] >= 3_600_000
    assert run_json("transactions", "find-hanging", "--topic", "hang", "--partition", "0",
                    "--max-transaction-timeout", "90", bs=bs) == []
    assert run_json("transactions", "find-hanging", "--broker-id", "pl-0", bs=bs)[0]["producer_id"] == pid
    assert "no transaction coordinator knows" in run("transactions", "find-hanging", "--topic", "hang", bs=bs).stdout
    producers = run_json("transactions", "describe-producers", "--topic", "hang", bs=bs)
    assert [p["current_transaction_start_offset"] for p in producers if p["producer_id"] == pid] == [2]

    assert_one_line_error(run("transactions", "abort", "--topic", "hang", "--partition", "0", "--start-offset", "3",
                              bs=bs, ok=False), "no open transaction starts at offset 3")
    assert_one_line_error(run("transactions", "abort", "--topic", "hang", "--partition", "0", bs=bs, ok=False),
                          "--start-offset", code=2)
    out = run("transactions", "abort", "--topic", "hang", "--partition", "0", "--start-offset", "2", bs=bs).stdout
    assert f"Aborted the transaction of producer {pid}" in out
    with AdminClient({"bootstrap.servers": bs}) as admin:
        assert admin.list_offsets([tp])[tp] == (6, 6), "the LSO moved past the ABORT marker"
    wait_for(lambda: seen.extend(r.value for r in consumer.poll(0.2)) or len(seen) >= 4, 20, "the consumer goes on")
    consumer.close()
    assert seen == [b"before-1", b"before-2", b"after-1", b"after-2"], "the aborted record is skipped"
    assert run_json("transactions", "find-hanging", bs=bs) == []
    # Aborting again with explicit epochs is harmless (the marker of a closed transaction).
    again = run_json("transactions", "abort", "--topic", "hang", "--partition", "0", "--producer-id", str(pid),
                     "--producer-epoch", "3", "--coordinator-epoch", "-1", bs=bs)
    assert again["aborted"] is True


def test_prepared_transactions_are_listed_found_and_decided_by_the_operator(cli_cluster):
    """Two transactions prepared (KIP-939) and left by their applications: list and
    describe show them as PrepareTxn with their state strings, on gRPC and at the Kafka
    port; find-hanging lists them once older than their transaction.timeout.ms; the
    operator commits one with the state its database would hold (a wrong state is
    refused, nothing decided) and aborts the other; the coordinator decided neither."""
    import kafka_requests
    from exactly import Consumer, Producer

    bs = cli_cluster.bootstrap_servers
    run("topics", "create", "--topic", "prep", "--partitions", "2", bs=bs)
    states = {}
    for tid, value in (("prep-commit", "kept"), ("prep-abort", "dropped")):
        p = Producer({"bootstrap.servers": bs, "transactional.id": tid, "transaction.timeout.ms": 1000})
        p.init_transactions(30)
        p.begin_transaction()
        for partition in (0, 1):
            p.send("prep", value.encode(), partition=partition)
        states[tid] = p.prepare_transaction(30).serialize()
        p.close()  # the application is gone; its transaction stays prepared

    listed = {t["transactional_id"]: t for t in run_json("transactions", "list", "--state", "PrepareTxn", bs=bs)}
    assert {tid: (t["state"], t["prepared_state"]) for tid, t in listed.items()} == \
        {tid: ("PrepareTxn", state) for tid, state in states.items()}
    assert all(t["prepared_age_ms"] >= 0 for t in listed.values())
    assert not [t for t in run_json("transactions", "list", "--state", "Ongoing", bs=bs) if t["transactional_id"]
                in states]
    [described] = run_json("transactions", "describe", "--transactional-id", "prep-commit", bs=bs)
    assert (described["state"], described["prepared_state"], described["partitions"]) == \
        ("PrepareTxn", states["prep-commit"], ["prep-0", "prep-1"])
    assert described["prepared_time_ms"] > 0
    # The Kafka port names the state the same way.
    coordinator = next(s.kafka_address for s in cli_cluster.services.values() if s.role == "txn_coordinator")
    kafka_listed = kafka_requests.call(coordinator, 66, 0, {"state_filters": ["PrepareTxn"], "producer_id_filters": []})
    assert {t.transactional_id: t.transaction_state for t in kafka_listed.transaction_states} == \
        {tid: "PrepareTxn" for tid in states}
    kafka_described = kafka_requests.call(coordinator, 65, 0, {"transactional_ids": ["prep-abort"]})
    assert kafka_described.transaction_states[0].transaction_state == "PrepareTxn"

    # Older than their transaction.timeout.ms (1 s): find-hanging lists them, the coordinator decides nothing.
    def prepared_rows():
        found = [h for h in run_json("transactions", "find-hanging", bs=bs) if h["prepared_state"]]
        return found if len(found) == 4 else None  # each transaction's two partitions

    rows = wait_for(prepared_rows, 30, "find-hanging to list the prepared transactions")
    assert sorted((h["transactional_id"], h["topic"], h["partition"], h["prepared_state"]) for h in rows) == \
        sorted((tid, "prep", p, state) for tid, state in states.items() for p in (0, 1))
    assert all("commit-prepared" in h["reason"] and h["start_offset"] >= 0 for h in rows)

    assert_one_line_error(run("transactions", "commit-prepared", "--transactional-id", "prep-commit", "--state",
                              states["prep-abort"], bs=bs, ok=False), "nothing decided")
    assert_one_line_error(run("transactions", "commit-prepared", "--transactional-id", "prep-commit", "--state",
                              "not-a-state", bs=bs, ok=False), "--state", code=2)
    assert run_json("transactions", "describe", "--transactional-id", "prep-commit", bs=bs)[0]["state"] == \
        "PrepareTxn"  # refused: still prepared
    out = run("transactions", "commit-prepared", "--transactional-id", "prep-commit", "--state", states["prep-commit"],
              bs=bs).stdout
    assert f"Committed the prepared transaction {states['prep-commit']}" in out
    assert run_json("transactions", "abort-prepared", "--transactional-id", "prep-abort", bs=bs)["outcome"] == "aborted"
    assert_one_line_error(run("transactions", "abort-prepared", "--transactional-id", "prep-abort", bs=bs, ok=False),
                          "has no prepared transaction")
    assert [t for t in run_json("transactions", "list", "--state", "PrepareTxn", bs=bs)
            if t["transactional_id"] in states] == []
    consumer = Consumer({"bootstrap.servers": bs, "isolation.level": "read_committed"})
    tps = [TopicPartition("prep", 0), TopicPartition("prep", 1)]
    consumer.assign(tps)
    consumer.seek_to_beginning(tps)
    seen: list[bytes] = []
    wait_for(lambda: seen.extend(r.value for r in consumer.poll(0.2)) or len(seen) >= 2, 20, "the committed records")
    assert consumer.poll(1.0) == [] and seen == [b"kept", b"kept"]
    consumer.close()
