"""The purchases pipeline on Spark, through the `exactly` data source, with failures.

    python -m demo.spark_purchases [--dir DIR] [--keep]

1. starts a dev cluster (ZooKeeper, 3 partition leaders, coordinators) in DIR;
2. loads the 9,998 Olist order items into topic `purchases` (3 partitions);
3. runs the Spark Structured Streaming query purchases -> invoices + shipments
   (Spark local mode, 2 threads, task retries on: master local[2,4]) reading and
   writing through the `exactly` source, 1,500 purchases per micro-batch, in a
   driver process of its own. The first attempt of one write task of micro-batch 1
   raises after writing 200 rows, so Spark retries the task. In micro-batch 3 the
   driver is SIGKILLed in the middle of its commit: one task's transaction is
   committed, the others are left prepared;
4. restarts the driver from the same checkpoint: the sink rolls the prepared
   transactions of micro-batch 3 forward, Spark replays micro-batch 3 and the sink
   aborts the replay (the batch was committed), then the query runs to the end;
5. reads both outputs with read_committed and read_uncommitted and prints a
   summary; exits 0 only if every item came out exactly once and the failed
   attempt's rows were aborted.

    python -m demo.spark_purchases driver --bootstrap-servers B --checkpoint DIR
        [--fail-task BATCH:PARTITION:ROWS] [--hold-commit BATCH:COUNT:PATH]

runs one Spark driver (used by the steps above).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

from exactly import AdminClient, NewTopic, Producer
from exactly_tools.devcluster import DevCluster

from .common import (INVOICES, PURCHASES, ROOT, SHIPMENTS, check_outputs, fresh_run_dir, invoice_for, item_key,
                     read_order_items, read_topic, shipment_for)

PARTITIONS = 3
PER_BATCH = 1500
FAIL_TASK = (1, 0, 200)      # micro-batch, write task (Spark partition), rows before the failure
HOLD_COMMIT = (3, 1)         # micro-batch, transactions committed before the driver is killed
QUERY_NAME = "purchases-to-invoices-and-shipments"

ROUTE_TYPE = ("array<struct<topic:string,key:binary,value:binary,"
              "headers:array<struct<key:string,value:binary>>>>")


def say(msg: str) -> None:
    print(msg, flush=True)


def spark_env() -> dict[str, str]:
    """Environment of a Spark driver: the venv's Python for the workers, loopback
    only, and the repository on the path (the workers import this module)."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


# ---------------------------------------------------------------- the Spark driver

def route(value: bytes) -> list[tuple]:
    """One purchase -> its invoice and its shipment (topic, key, value, headers).
    The headers record the micro-batch, Spark partition and task attempt that
    wrote the row, so the summary can find the failed attempt's rows."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    headers = [("spark.batch", (ctx.getLocalProperty("streaming.sql.batchId") or "").encode()),
               ("spark.partition", str(ctx.partitionId()).encode()),
               ("spark.attempt", str(ctx.attemptNumber()).encode())]
    purchase = json.loads(value)
    key = item_key(purchase).encode()
    return [(INVOICES, key, json.dumps(invoice_for(purchase)).encode(), headers),
            (SHIPMENTS, key, json.dumps(shipment_for(purchase)).encode(), headers)]


def drive(args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from exactly.spark import ExactlyDataSource

    spark = (SparkSession.builder.master("local[2,4]").appName(QUERY_NAME)
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(PARTITIONS))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ExactlyDataSource)
    purchases = (spark.readStream.format("exactly")
                 .option("bootstrap.servers", args.bootstrap_servers)
                 .option("subscribe", PURCHASES)
                 .option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", PER_BATCH)
                 .load())
    outputs = purchases.select(F.explode(F.udf(route, ROUTE_TYPE)("value")).alias("r")).select("r.*")
    writer = (outputs.writeStream.format("exactly").queryName(QUERY_NAME)
              .option("bootstrap.servers", args.bootstrap_servers)
              .option("checkpointLocation", args.checkpoint))
    if args.fail_task:
        writer = writer.option("exactly.test.fail.task", args.fail_task)
    if args.hold_commit:
        writer = writer.option("exactly.test.hold.commit", args.hold_commit)
    query = writer.trigger(availableNow=True).start()
    seen = set()
    while query.isActive:
        for p in query.recentProgress:
            if p["batchId"] not in seen:
                seen.add(p["batchId"])
                say(f"  driver: micro-batch {p['batchId']} done, {p['numInputRows']:,} purchases")
        query.awaitTermination(0.5)
    if query.exception() is not None:
        say(f"  driver: query failed: {query.exception()}")
        return 1
    for p in query.recentProgress:
        if p["batchId"] not in seen:
            say(f"  driver: micro-batch {p['batchId']} done, {p['numInputRows']:,} purchases")
    spark.stop()
    return 0


# ---------------------------------------------------------------- the job

def load_purchases(bootstrap: str, rows: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 10})
    try:
        futures = [producer.send(PURCHASES, json.dumps(row).encode(), key=row["order_id"].encode()) for row in rows]
        producer.flush()
        for f in futures:
            f.result()
    finally:
        producer.close()


class Driver:
    """One Spark driver process (its own process group: killing it takes the JVM and
    the Python workers with it)."""

    def __init__(self, run_dir: pathlib.Path, bootstrap: str, name: str, *extra: str):
        self.log_path = run_dir / "logs" / f"{name}.log"
        cmd = [sys.executable, "-m", "demo.spark_purchases", "driver", "--bootstrap-servers", bootstrap,
               "--checkpoint", str(run_dir / "checkpoint"), *extra]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, cwd=ROOT, env=spark_env(),
                                     start_new_session=True, text=True)
        self._pump = threading.Thread(target=self._echo, daemon=True)
        self._pump.start()

    def _echo(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            print(line, end="", flush=True)

    def wait(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout_s)
        self._pump.join(5)
        return code

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def run(run_dir: pathlib.Path, keep: bool) -> int:
    rows = read_order_items()
    expected = {item_key(r): r for r in rows}
    fresh_run_dir(run_dir)
    say(f"Starting a dev cluster in {run_dir} (ZooKeeper, 3 partition leaders, coordinators) ...")
    cluster = DevCluster(run_dir)
    try:
        cluster.up(partition_leaders=3, txn_coordinators=1, group_coordinators=1)
        bootstrap = cluster.bootstrap_servers
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topics([NewTopic(t, PARTITIONS) for t in (PURCHASES, INVOICES, SHIPMENTS)])
        say(f"Cluster serving: bootstrap.servers={bootstrap}; topics {PURCHASES}, {INVOICES}, {SHIPMENTS} "
            f"({PARTITIONS} partitions each)")
        say(f"Loading {len(rows):,} order items into '{PURCHASES}' ...")
        load_purchases(bootstrap, rows)

        hold_file = run_dir / "driver-holding"
        fail = ":".join(map(str, FAIL_TASK))
        hold = f"{HOLD_COMMIT[0]}:{HOLD_COMMIT[1]}:{hold_file}"
        say(f"Spark driver 1 (local[2,4], {PER_BATCH:,} purchases per micro-batch): the first attempt of write "
            f"task {FAIL_TASK[1]} of micro-batch {FAIL_TASK[0]} fails after {FAIL_TASK[2]} rows; the driver is "
            f"killed in the middle of committing micro-batch {HOLD_COMMIT[0]}")
        first = Driver(run_dir, bootstrap, "driver-1", "--fail-task", fail, "--hold-commit", hold)
        deadline = time.monotonic() + 600
        while not hold_file.exists():
            if first.proc.poll() is not None:
                raise RuntimeError(f"driver 1 exited with {first.proc.returncode}; see {first.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError("driver 1 did not reach the commit of micro-batch "
                                   f"{HOLD_COMMIT[0]}; see {first.log_path}")
            time.sleep(0.2)
        first.kill()
        left = _left_prepared(bootstrap)
        say(f"SIGKILLed driver 1 during the commit of micro-batch {HOLD_COMMIT[0]}: {HOLD_COMMIT[1]} transaction "
            f"committed, {left} left prepared")

        say("Spark driver 2: restarting the query from the same checkpoint ...")
        second = Driver(run_dir, bootstrap, "driver-2")
        if second.wait(900) != 0:
            raise RuntimeError(f"driver 2 exited with {second.proc.returncode}; see {second.log_path}")
        left_after = _left_prepared(bootstrap)
        say(f"Query finished; transactions of the query still open: {left_after}")
        say("Reading the outputs ...")
        return summarize(bootstrap, expected, left_after)
    finally:
        if not keep:
            cluster.down()


def _left_prepared(bootstrap: str) -> int:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        return sum(1 for t in admin.list_transactions(states=["Ongoing"]) if t.transactional_id.startswith("spark-"))


def _header(rec, name: str) -> str:
    return next((v.decode() for k, v in rec.headers if k == name and v is not None), "")


def summarize(bootstrap: str, expected: dict[str, dict], left_open: int) -> int:
    committed = {t: read_topic(bootstrap, t, "read_committed") for t in (INVOICES, SHIPMENTS)}
    uncommitted = {t: read_topic(bootstrap, t, "read_uncommitted") for t in (INVOICES, SHIPMENTS)}
    lines, ok = check_outputs(committed, expected, width=34)
    totals = lines[3:]
    del lines[3:]
    ok &= left_open == 0
    batch, partition, rows = FAIL_TASK

    def failed_attempt(r) -> bool:
        return (_header(r, "spark.batch"), _header(r, "spark.partition"), _header(r, "spark.attempt")) == \
            (str(batch), str(partition), "0")

    failed_unc = sum(1 for t in (INVOICES, SHIPMENTS) for r in uncommitted[t] if failed_attempt(r))
    failed_com = sum(1 for t in (INVOICES, SHIPMENTS) for r in committed[t] if failed_attempt(r))
    lines.append(f"failed attempt (micro-batch {batch}, task {partition}, attempt 0): {failed_unc:,} rows seen by "
                 f"read_uncommitted, {failed_com:,} by read_committed -> "
                 f"{'aborted' if failed_unc == rows and failed_com == 0 else 'NOT ABORTED'}")
    ok &= failed_unc == rows and failed_com == 0
    replayed = HOLD_COMMIT[0]
    replay_rows = sum(1 for t in (INVOICES, SHIPMENTS) for r in uncommitted[t]
                      if _header(r, "spark.batch") == str(replayed)) - \
        sum(1 for t in (INVOICES, SHIPMENTS) for r in committed[t] if _header(r, "spark.batch") == str(replayed))
    lines.append(f"replay of micro-batch {replayed} after the driver restart: {replay_rows:,} rows aborted "
                 f"(the batch was committed once)")
    ok &= replay_rows > 0
    aborted = sum(len(uncommitted[t]) - len(committed[t]) for t in (INVOICES, SHIPMENTS))
    lines.append(f"aborted rows seen by read_uncommitted:  {aborted:,}")
    lines.extend(totals)
    say("\n=== Summary ===")
    for line in lines:
        say(line)
    say("RESULT: exactly once" if ok else "RESULT: FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["driver"]:
        p = argparse.ArgumentParser(prog="python -m demo.spark_purchases driver")
        p.add_argument("--bootstrap-servers", required=True)
        p.add_argument("--checkpoint", required=True)
        p.add_argument("--fail-task")
        p.add_argument("--hold-commit")
        return drive(p.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(prog="python -m demo.spark_purchases", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(".run/spark-demo"))
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    args = parser.parse_args(argv)
    for k, v in spark_env().items():
        os.environ.setdefault(k, v)
    return run(args.dir.resolve(), args.keep)


if __name__ == "__main__":
    sys.exit(main())
