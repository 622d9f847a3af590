"""A Spark driver for the streaming tests, run in a process of its own:

    python tests/spark/streaming_driver.py BOOTSTRAP SOURCE SINK CHECKPOINT MAX_PER_BATCH [SINK OPTION=VALUE ...]

Copies SOURCE to SINK through the `exactly` source (Trigger.AvailableNow), adding
headers spark.batch / spark.partition / spark.attempt to every row (the write
task that sent it). Exits 0 when the query finished, 1 when it failed.
"""
from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from exactly.spark import ExactlyDataSource

    bootstrap, source, sink, checkpoint, per_batch, *extra = argv

    def task_headers(_value):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return [("spark.batch", (ctx.getLocalProperty("streaming.sql.batchId") or "").encode()),
                ("spark.partition", str(ctx.partitionId()).encode()),
                ("spark.attempt", str(ctx.attemptNumber()).encode())]

    spark = (SparkSession.builder.master("local[2,4]").appName("exactly-streaming-test")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "3").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ExactlyDataSource)
    headers = F.udf(task_headers, "array<struct<key:string,value:binary>>")
    df = (spark.readStream.format("exactly").option("bootstrap.servers", bootstrap).option("subscribe", source)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", per_batch).load()
          .select("key", "value", headers("value").alias("headers")))
    writer = (df.writeStream.format("exactly").option("bootstrap.servers", bootstrap).option("topic", sink)
              .option("checkpointLocation", checkpoint))
    for item in extra:
        k, _, v = item.partition("=")
        writer = writer.option(k, v)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    failed = query.exception() is not None
    if failed:
        print(f"query failed: {query.exception()}", file=sys.stderr)
    else:
        print("batches: " + ",".join(str(p["batchId"]) for p in query.recentProgress), flush=True)
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
