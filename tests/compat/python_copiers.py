"""Exactly-once consume-transform-produce copiers written the way each Python Kafka
client documents its transactions (tests/compat/test_python_clients.py):

    python python_copiers.py CLIENT BROKERS INPUT OUTPUT GROUP TRANSACTIONAL_ID

CLIENT is kafka-python (KafkaProducer(transactional_id=...), send_offsets_to_transaction
with the consumer's group_metadata(), KIP-447) or aiokafka (producer.transaction(),
send_offsets_to_transaction with the group id). One transaction per polled batch (at
most 50 records); prints "committed N" after each commit and exits 0 once the
consumer's position reaches INPUT's end on every partition of its assignment (3)."""
import asyncio
import sys

PARTITIONS = 3


def kafka_python(brokers, source, sink, group, transactional_id):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.structs import OffsetAndMetadata
    consumer = KafkaConsumer(source, bootstrap_servers=brokers.split(","), group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", isolation_level="read_committed", max_poll_records=50,
                             request_timeout_ms=30000,
                             # a SIGKILLed copier leaves the group after 10 s (kafka-python 3's default: 45 s)
                             session_timeout_ms=10000, heartbeat_interval_ms=3000)
    producer = KafkaProducer(bootstrap_servers=brokers.split(","), transactional_id=transactional_id,
                             request_timeout_ms=30000)
    producer.init_transactions()
    copied = 0
    while True:
        batch = consumer.poll(timeout_ms=500, max_records=50)
        if batch:
            producer.begin_transaction()
            for records in batch.values():
                for r in records:
                    producer.send(sink, key=r.key, value=r.value)
            offsets = {tp: OffsetAndMetadata(records[-1].offset + 1, "", -1) for tp, records in batch.items()}
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            producer.commit_transaction()
            copied += sum(len(records) for records in batch.values())
            print(f"committed {copied}", flush=True)
        assignment = consumer.assignment()
        if len(assignment) == PARTITIONS:
            ends = consumer.end_offsets(list(assignment))
            if all(consumer.position(tp) >= ends[tp] for tp in assignment):
                break
    consumer.close()
    producer.close(timeout=30)


async def aiokafka(brokers, source, sink, group, transactional_id):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    consumer = AIOKafkaConsumer(source, bootstrap_servers=brokers, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest", isolation_level="read_committed", max_poll_records=50)
    producer = AIOKafkaProducer(bootstrap_servers=brokers, transactional_id=transactional_id)
    await consumer.start()
    await producer.start()
    copied = 0
    try:
        while True:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500, max_records=50), 60)
            if batch:
                async with producer.transaction():
                    for records in batch.values():
                        for r in records:
                            await producer.send(sink, key=r.key, value=r.value)
                    await producer.send_offsets_to_transaction(
                        {tp: records[-1].offset + 1 for tp, records in batch.items()}, group)
                copied += sum(len(records) for records in batch.values())
                print(f"committed {copied}", flush=True)
            assignment = consumer.assignment()
            if len(assignment) == PARTITIONS:
                ends = await asyncio.wait_for(consumer.end_offsets(list(assignment)), 60)
                if all([await consumer.position(tp) >= ends[tp] for tp in assignment]):
                    break
    finally:
        await consumer.stop()
        await producer.stop()


if __name__ == "__main__":
    client, *args = sys.argv[1:]
    if client == "kafka-python":
        kafka_python(*args)
    elif client == "aiokafka":
        asyncio.run(aiokafka(*args))
    else:
        sys.exit(f"unknown client {client}")
    print("copied everything", flush=True)
