"""FastStream apps (tests/compat/test_faststream.py), run by the interpreter of
.compat/faststream. BACKEND is "kafka" (faststream.kafka, aiokafka) or "confluent"
(faststream.confluent, confluent-kafka).

    python faststream_app.py copy BACKEND BROKERS INPUT OUTPUT GROUP
        the idiomatic subscriber/publisher pair: a handler subscribed to INPUT in GROUP
        (ack_policy=ACK: the offset is committed after the handler returns) whose return
        value FastStream publishes to OUTPUT — at-least-once. Prints "handled N" after
        every 50 messages.
    python faststream_app.py transactional BACKEND BROKERS TOPIC TRANSACTIONAL_ID
        a broker given transactional_id publishes one message to TOPIC; prints
        "published" or "refused: <error type>: <error>" and exits 0 either way.
"""
import asyncio
import logging
import sys


def broker_class(backend):
    if backend == "kafka":
        from faststream.kafka import KafkaBroker
    else:
        from faststream.confluent import KafkaBroker
    return KafkaBroker


def copy(backend, brokers, source, sink, group):
    from faststream import AckPolicy, FastStream
    broker = broker_class(backend)(brokers.split(","), log_level=logging.WARNING)
    app = FastStream(broker)
    handled = 0

    @broker.subscriber(source, group_id=group, auto_offset_reset="earliest", ack_policy=AckPolicy.ACK)
    @broker.publisher(sink)
    async def forward(body: bytes) -> bytes:
        nonlocal handled
        handled += 1
        if handled % 50 == 0:
            print(f"handled {handled}", flush=True)
        return body

    asyncio.run(app.run())


async def transactional(backend, brokers, topic, transactional_id):
    # librdkafka refuses transactional.id without enable.idempotence=true
    extra = {"enable_idempotence": True} if backend == "confluent" else {}
    broker = broker_class(backend)(brokers.split(","), transactional_id=transactional_id,
                                   log_level=logging.WARNING, **extra)
    try:
        await asyncio.wait_for(broker.start(), 60)
        await asyncio.wait_for(broker.publish(b"in-a-transaction?", topic), 60)
        print("published", flush=True)
    except Exception as e:  # the outcome is what the test reads
        print(f"refused: {type(e).__name__}: {e}", flush=True)
    finally:
        await asyncio.wait_for(broker.stop(), 60)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "copy":
        copy(*args)
    elif mode == "transactional":
        asyncio.run(transactional(*args))
    else:
        sys.exit(f"unknown mode {mode}")
