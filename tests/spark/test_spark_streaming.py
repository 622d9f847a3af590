"""Exactly-once streaming writes through the `exactly` Spark data source with real
pyspark (local mode), in driver processes of their own: the first attempt of a
write task fails after sending some rows (Spark retries it), the driver is
SIGKILLed in the middle of a micro-batch's commit and restarted from the same
checkpoint. Every input row comes out exactly once for read_committed; a
read_uncommitted batch read shows the failed attempt's rows, aborted."""
from __future__ import annotations

import collections
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from spark_helpers import ROOT, create_topic, sdk_read, spark_env

from exactly import AdminClient, Producer

# Two drivers of up to 300 s each, then two batch reads: the default 300 s (setup included)
# ran out on a loaded 2-core machine while the last read was still collecting.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

DRIVER = pathlib.Path(__file__).with_name("streaming_driver.py")
ROWS = 600
PER_BATCH = 120
FAIL_TASK = (1, 0, 20)   # micro-batch, write task, rows before the failure
HOLD = (2, 1)            # micro-batch, transactions committed before the driver dies


def _driver(bootstrap, source, sink, checkpoint, log, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(DRIVER), bootstrap, source, sink, str(checkpoint),
                             str(PER_BATCH), *extra], cwd=ROOT, env=spark_env(), stdout=log, stderr=log,
                            start_new_session=True)


def _fill_source(bootstrap: str, topic: str) -> None:
    """ROWS plain records, with an aborted transaction in the middle that must never
    reach the sink (the source reads read_committed)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-aborted"})
    tx.init_transactions()
    for i in range(ROWS):
        p.send(topic, f"v{i}".encode(), key=f"k{i}".encode())
        if i == ROWS // 2:
            p.flush()
            tx.begin_transaction()
            for j in range(30):
                tx.send(topic, f"x{j}".encode(), key=f"x{j}".encode())
            tx.flush()
            tx.abort_transaction()
    p.flush()
    p.close()
    tx.close()


def _header(headers, name):
    return next((v.decode() for k, v in headers if k == name), None)


def test_exactly_once_through_a_task_failure_and_a_driver_restart(spark, spark_cluster, tmp_path):
    bootstrap = spark_cluster.bootstrap_servers
    source, sink = create_topic(bootstrap), create_topic(bootstrap)
    _fill_source(bootstrap, source)
    checkpoint, hold_file = tmp_path / "checkpoint", tmp_path / "holding"
    log = open(tmp_path / "drivers.log", "ab")

    first = _driver(bootstrap, source, sink, checkpoint, log,
                    "exactly.test.fail.task=" + ":".join(map(str, FAIL_TASK)),
                    f"exactly.test.hold.commit={HOLD[0]}:{HOLD[1]}:{hold_file}")
    deadline = time.monotonic() + 300
    while not hold_file.exists():
        assert first.poll() is None, f"driver 1 exited with {first.returncode}; see {log.name}"
        assert time.monotonic() < deadline, "driver 1 did not reach the commit of the held micro-batch"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        left = [t for t in admin.list_transactions(states=["Ongoing", "PrepareTxn"])
                if t.transactional_id.startswith("spark-")]
    # The held micro-batch: its tasks prepared their transactions (KIP-939), the driver
    # committed one of the three before it was killed; the coordinator keeps the other
    # two prepared, never aborting them on its own.
    assert sorted(t.state for t in left) == ["PrepareTxn", "PrepareTxn"], left

    second = _driver(bootstrap, source, sink, checkpoint, log)
    assert second.wait(300) == 0, f"driver 2 failed; see {log.name}"
    log.close()

    committed = sdk_read(bootstrap, sink, "read_committed")
    keys = collections.Counter(r.key for r in committed)
    assert len(committed) == ROWS and len(keys) == ROWS
    assert set(keys) == {f"k{i}".encode() for i in range(ROWS)}
    assert all(r.value == b"v" + r.key[1:] for r in committed)
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        assert not [t for t in admin.list_transactions(states=["Ongoing", "PrepareTxn"])
                    if t.transactional_id.startswith("spark-")]

    # The failed attempt's rows: in the log, aborted.
    batch, partition, rows = FAIL_TASK

    def failed_attempt(headers) -> bool:
        return (_header(headers, "spark.batch"), _header(headers, "spark.partition"),
                _header(headers, "spark.attempt")) == (str(batch), str(partition), "0")

    reader = spark.read.format("exactly").option("bootstrap.servers", bootstrap).option("subscribe", sink)
    uncommitted = reader.option("isolation.level", "read_uncommitted").load().collect()
    seen_committed = reader.option("isolation.level", "read_committed").load().collect()
    assert len(seen_committed) == ROWS
    assert sum(1 for r in uncommitted if failed_attempt([(h.key, h.value) for h in r.headers])) == rows
    assert sum(1 for r in seen_committed if failed_attempt([(h.key, h.value) for h in r.headers])) == 0
    # The replay of the held micro-batch after the restart was aborted, not committed twice.
    replayed = [r for r in uncommitted if _header([(h.key, h.value) for h in r.headers], "spark.batch") == str(HOLD[0])]
    assert len(replayed) == 2 * sum(1 for r in seen_committed
                                    if _header([(h.key, h.value) for h in r.headers], "spark.batch") == str(HOLD[0]))
