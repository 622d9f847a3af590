"""`exactly produce` and `exactly consume`: the console producer and consumer."""
from __future__ import annotations

import base64
import json
import signal
import sys
import threading
import time

import click

from exactly import Consumer, Producer, TopicPartition

from .common import admin_client, connection_options, options, parse_key_values, progress


def _topic_option(command):
    """`--topic TOPIC`, the way kafka-console-producer/consumer take the topic, as an
    alternative to the positional TOPIC (see `_one_topic`)."""
    return click.option("--topic", "topic_option", metavar="TOPIC",
                        help="The topic (instead of the positional TOPIC, as kafka-console-* take it).")(command)


def _one_topic(positional: str | None, option: str | None) -> str:
    """The topic given positionally or with --topic; click.UsageError (exit 2) when
    neither or two different ones are given."""
    if positional and option and positional != option:
        raise click.UsageError(f"two topics given: {positional!r} and --topic {option!r}")
    topic = positional or option
    if not topic:
        raise click.UsageError("missing the topic: give TOPIC or --topic TOPIC")
    return topic


def _check_topic(topic: str) -> list[int]:
    """The topic's partitions; errors.UnknownTopicOrPartitionError when it does not exist."""
    with admin_client() as admin:
        return sorted(admin.describe_topics([topic])[topic].partitions)


@click.command()
@click.argument("topic", required=False)
@_topic_option
@click.option("--key-separator", metavar="SEP", help="Split each line at the first SEP into key and value "
                                                      "(lines without SEP have no key).")
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE", help="Header on every record (repeatable).")
@click.option("--transactional-id", metavar="ID", help="Send every line in one transaction, committed at the end "
                                                        "of input (aborted on an error).")
@click.option("--partition", type=click.IntRange(min=0), help="Send to this partition (default: by key).")
@click.option("--acks", type=click.Choice(["all", "-1", "0", "1"]), default="all", show_default=True)
@click.option("--producer-property", "props", multiple=True, metavar="KEY=VALUE",
              help="Producer config (repeatable), e.g. linger.ms=20.")
@connection_options
def produce(topic: str | None, topic_option: str | None, key_separator: str | None, headers: tuple[str, ...],
            transactional_id: str | None, partition: int | None, acks: str, props: tuple[str, ...]) -> None:
    """Send the lines of stdin to TOPIC (or --topic TOPIC), one record per line (UTF-8).
    From a terminal it prompts with '>' for each line, as kafka-console-producer; Ctrl-D
    ends the input, and so does Ctrl-C (a transaction is then aborted, not committed)."""
    topic = _one_topic(topic, topic_option)
    parts = _check_topic(topic)
    if partition is not None and partition not in parts:
        raise click.BadParameter(f"{topic} has partitions 0..{len(parts) - 1}", param_hint="--partition")
    hdrs = [(k, v.encode()) for k, v in parse_key_values(headers, "--header").items()]
    extra = {"acks": acks, **parse_key_values(props, "--producer-property")}
    if transactional_id:
        extra["transactional.id"] = transactional_id
    producer = Producer(options().conf("producer", extra))
    futures = []
    try:
        if transactional_id:
            producer.init_transactions()
            producer.begin_transaction()
        try:
            for line in _input_lines(sys.stdin):
                line = line.rstrip("\n")
                key = None
                if key_separator is not None and key_separator in line:
                    key, line = line.split(key_separator, 1)
                futures.append(producer.send(topic, value=line, key=key, partition=partition,
                                             headers=hdrs or None))
        except KeyboardInterrupt:
            if transactional_id:
                raise click.ClickException(f"interrupted: the transaction of {transactional_id} was aborted, "
                                           f"none of its {len(futures)} records committed") from None
            progress("")  # Ctrl-C ends the input: what was sent is delivered
        if transactional_id:
            producer.commit_transaction()
        producer.flush()
        metas = [f.result() for f in futures]
    except BaseException:
        if transactional_id:
            try:
                producer.abort_transaction()
            except Exception:  # noqa: BLE001 - the first error is the one reported
                pass
        raise
    finally:
        producer.close()
    if options().as_json:
        click.echo(json.dumps({"topic": topic, "records": len(metas), "transactional_id": transactional_id,
                               "offsets": [{"partition": m.partition, "offset": m.offset} for m in metas]}))
    else:
        progress(f"Produced {len(metas)} records to {topic}"
                 + (f" in a transaction of {transactional_id}" if transactional_id else "") + ".")


def _input_lines(stream):
    """The lines of `stream`; from a terminal each is prompted for with '>' on stderr
    (kafka-console-producer's prompt)."""
    interactive = stream.isatty()
    while True:
        if interactive:
            click.echo(">", nl=False, err=True)
        line = stream.readline()
        if not line:
            if interactive:
                click.echo("", err=True)
            return
        yield line


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode()


@click.command()
@click.argument("topic", required=False)
@_topic_option
@click.option("--from-beginning", is_flag=True, help="Start at the log start instead of the end "
                                                     "(with --group: when the group has no committed offset).")
@click.option("--group", metavar="GROUP", help="Consume as a member of this group and commit offsets.")
@click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]),
              default="read_uncommitted", show_default=True)
@click.option("--max-records", type=click.IntRange(min=1), help="Exit after this many records.")
@click.option("--timeout-ms", type=click.IntRange(min=1), help="Exit when no record arrived for this many ms.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: the value per line (see --print-key); json: one JSON object per record.")
@click.option("--print-key", is_flag=True, help="text format: print KEY<TAB>VALUE.")
@click.option("--partition", type=click.IntRange(min=0), help="Only this partition (without --group).")
@click.option("--consumer-property", "props", multiple=True, metavar="KEY=VALUE", help="Consumer config (repeatable).")
@connection_options
def consume(topic: str | None, topic_option: str | None, from_beginning: bool, group: str | None,
            isolation_level: str, max_records: int | None, timeout_ms: int | None, fmt: str, print_key: bool,
            partition: int | None, props: tuple[str, ...]) -> None:
    """Print the records of TOPIC (or --topic TOPIC) until --max-records, --timeout-ms
    or Ctrl-C, then "Processed a total of N records." on stderr (as kafka-console-consumer):
    --max-records N with fewer records ends once none arrived for --timeout-ms; Ctrl-C is a
    normal stop (exit 0)."""
    topic = _one_topic(topic, topic_option)
    parts = _check_topic(topic)
    if options().as_json:
        fmt = "json"
    extra = {"isolation.level": isolation_level, **parse_key_values(props, "--consumer-property")}
    if group:
        extra.update({"group.id": group, "auto.offset.reset": "earliest" if from_beginning else "latest",
                      "enable.auto.commit": "false"})
    consumer = Consumer(options().conf("consumer", extra))
    seen = 0
    # Ctrl-C is a normal stop: the loop ends after the poll in progress (at most 0.2 s), so
    # the count covers every record printed.
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        if group:
            consumer.subscribe([topic])
        else:
            chosen = [partition] if partition is not None else parts
            if partition is not None and partition not in parts:
                raise click.BadParameter(f"{topic} has partitions 0..{len(parts) - 1}", param_hint="--partition")
            tps = [TopicPartition(topic, p) for p in chosen]
            consumer.assign(tps)
            (consumer.seek_to_beginning if from_beginning else consumer.seek_to_end)(tps)
        idle_since = time.monotonic()
        while (max_records is None or seen < max_records) and not stop.is_set():
            batch = consumer.poll(0.2, max_records=None if max_records is None else max_records - seen)
            if not batch:
                if timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= timeout_ms:
                    break
                continue
            idle_since = time.monotonic()
            for r in batch:
                if fmt == "json":
                    click.echo(json.dumps({"topic": r.topic, "partition": r.partition, "offset": r.offset,
                                           "timestamp": r.timestamp, "key": _text(r.key), "value": _text(r.value),
                                           "headers": {k: _text(v) for k, v in r.headers}}))
                elif print_key:
                    click.echo(f"{_text(r.key) or ''}\t{_text(r.value) or ''}")
                else:
                    click.echo(_text(r.value) or "")
            seen += len(batch)
            if group:
                consumer.commit()
    finally:
        signal.signal(signal.SIGINT, previous)
        consumer.close()
    progress(f"Processed a total of {seen} records.")  # stderr, with --json too
