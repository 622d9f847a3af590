"""A Quix Streams application with processing_guarantee="exactly-once", run by
tests/compat/test_quix.py under the Quix Streams virtualenv (.compat/quix): reads
JSON {"i": n} from QUIX_INPUT, writes {"i": n, "square": n * n} to QUIX_OUTPUT, and
prints "processed <count>" to stdout every QUIX_REPORT_EVERY records so the test
knows it is mid-stream. QUIX_DELAY_MS slows each record (ms), so a SIGKILL lands
between commits. QUIX_STATEFUL=1 adds "count": the records of the key so far, kept in
Quix's state (RocksDB, with its changelog topic), which exactly-once also covers."""
import os
import sys
import time

from quixstreams import Application

count = 0
every = int(os.environ.get("QUIX_REPORT_EVERY", "100"))
delay_s = int(os.environ.get("QUIX_DELAY_MS", "0")) / 1000


def transform(value: dict) -> dict:
    global count
    count += 1
    if count % every == 0:
        print(f"processed {count} at {time.time():.3f}", flush=True)
    if delay_s:
        time.sleep(delay_s)
    return {"i": value["i"], "square": value["i"] * value["i"]}


def counted(value: dict, state) -> dict:
    n = state.get("n", 0) + 1
    state.set("n", n)
    return {**value, "count": n}


def main() -> None:
    app = Application(broker_address=os.environ["QUIX_BROKERS"], consumer_group=os.environ["QUIX_GROUP"],
                      processing_guarantee="exactly-once", auto_offset_reset="earliest",
                      commit_interval=float(os.environ.get("QUIX_COMMIT_INTERVAL_S", "0.5")),
                      state_dir=os.environ["QUIX_STATE_DIR"],
                      request_timeout=30, loglevel=os.environ.get("QUIX_LOGLEVEL", "INFO"),
                      # A SIGKILLed member leaves the group when its session ends: keep it short.
                      consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
                      # The transaction open at a SIGKILL is aborted when it times out.
                      producer_extra_config={"transaction.timeout.ms": 5000})
    source = app.topic(os.environ["QUIX_INPUT"], value_deserializer="json")
    sink = app.topic(os.environ["QUIX_OUTPUT"], value_serializer="json")
    sdf = app.dataframe(source).apply(transform)
    if os.environ.get("QUIX_STATEFUL") == "1":
        sdf = sdf.apply(counted, stateful=True)
    sdf.to_topic(sink)
    print("running", flush=True)
    app.run()


if __name__ == "__main__":
    sys.exit(main())
