"""A faust-streaming app with processing_guarantee="exactly_once" (tests/compat/test_faust.py),
run by the interpreter of .compat/faust:

    python faust_copy.py APP_ID BROKERS INPUT OUTPUT DATADIR

One agent reads INPUT and sends each value to OUTPUT, another reads OUTPUT; faust commits
the sends and the consumed offsets in one Kafka transaction per partition (its
transactional producers). With stream_publish_on_commit, a send is published by the
commit of its event's offset, in that commit's transaction.
Prints "copied N" after every 50 values it has processed."""
import sys

import faust

app_id, brokers, source_name, sink_name, datadir = sys.argv[1:6]
app = faust.App(
    app_id,
    broker=";".join(f"kafka://{b}" for b in brokers.split(",")),
    processing_guarantee="exactly_once",
    store="memory://",
    datadir=datadir,
    web_enabled=False,
    topic_partitions=3,
    topic_replication_factor=1,
    consumer_auto_offset_reset="earliest",
    # Sends from an event wait, attached to its offset, until that offset is committed:
    # the commit publishes them into the transaction that also commits the offset, so
    # an event in progress at a commit keeps its output for the next one.
    stream_publish_on_commit=True,
    # a SIGKILLed worker leaves the group after 10 s (faust's default: 60 s)
    broker_session_timeout=10.0,
    broker_heartbeat_interval=3.0,
)
source = app.topic(source_name, value_type=bytes, value_serializer="raw", partitions=3)
sink = app.topic(sink_name, value_type=bytes, value_serializer="raw", partitions=3)
copied = 0


@app.agent(source)
async def copy(stream):
    global copied
    async for key, value in stream.items():
        await sink.send(key=key, value=value, key_serializer="raw", value_serializer="raw")
        copied += 1
        if copied % 50 == 0:  # faust sends sys.stdout to its logger: the real stdout
            sys.__stdout__.write(f"copied {copied}\n")
            sys.__stdout__.flush()


@app.agent(sink)
async def audit(stream):
    """Reads the output too: faust sends in a transaction only to topics its consumer
    subscribes (their partitions known to it, in its assignor's topic groups); to any
    other topic it sends with its plain producer, outside every transaction."""
    async for _ in stream:
        pass


if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "--loglevel", "warn"]
    app.main()
