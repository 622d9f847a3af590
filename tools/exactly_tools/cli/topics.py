"""`exactly topics`: list, describe, create, delete, alter-config, add-partitions,
delete-records
(kafka-topics and kafka-configs for topics)."""
from __future__ import annotations

import click

from exactly import NewTopic, TopicPartition, errors

from .common import admin_client, connection_options, emit, parse_key_values, print_table


@click.group()
def topics() -> None:
    """Create, list, describe, grow, configure and delete topics."""


@topics.command("list")
@click.option("--include-internal", is_flag=True, help="Also list __transaction_state and __consumer_offsets.")
@connection_options
def list_topics(include_internal: bool) -> None:
    """Topic names with their partition counts."""
    with admin_client() as admin:
        found = admin.list_topics(include_internal=include_internal)
        descs = admin.describe_topics(list(found)) if found else {}
    data = [{"topic": t, "partitions": len(ps),
             "replication_factor": len(next(iter(descs[t].partitions.values())).replicas) if ps else 0}
            for t, ps in found.items()]
    emit(data, lambda: print_table(["TOPIC", "PARTITIONS", "REPLICATION-FACTOR"],
                                   [(d["topic"], d["partitions"], d["replication_factor"]) for d in data],
                                   empty="(no topics)"))


@topics.command("describe")
@click.option("--topic", "names", multiple=True, metavar="TOPIC", help="Topic to describe (repeatable; default all).")
@click.option("--include-internal", is_flag=True, help="With no --topic: internal topics too.")
@connection_options
def describe(names: tuple[str, ...], include_internal: bool) -> None:
    """Partitions (leader, replicas, ISR) and the configs set on each topic."""
    with admin_client() as admin:
        wanted = list(names) or list(admin.list_topics(include_internal=include_internal))
        descs = admin.describe_topics(wanted)
        configs = admin.describe_configs(wanted) if wanted else {}
    data = []
    for name in wanted:
        d = descs[name]
        data.append({
            "topic": name, "internal": d.internal,
            "configs": {k: e.value for k, e in configs[name].items() if e.source == "TOPIC_CONFIG"},
            "partitions": [{"partition": p.partition, "leader": p.leader_id, "replicas": list(p.replicas),
                            "isr": list(p.isr)} for p in d.partitions.values()]})

    def table() -> None:
        for i, d in enumerate(data):
            if i:
                click.echo()
            cfg = ",".join(f"{k}={v}" for k, v in sorted(d["configs"].items())) or "-"
            click.echo(f"Topic: {d['topic']}  PartitionCount: {len(d['partitions'])}  "
                       f"ReplicationFactor: {len(d['partitions'][0]['replicas']) if d['partitions'] else 0}  "
                       f"Configs: {cfg}")
            print_table(["PARTITION", "LEADER", "REPLICAS", "ISR"],
                        [(p["partition"], p["leader"] or "none", ",".join(p["replicas"]), ",".join(p["isr"]))
                         for p in d["partitions"]])
    emit(data, table)


@topics.command("create")
@click.option("--topic", required=True, help="Name of the new topic.")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--replication-factor", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="Topic config (repeatable).")
@click.option("--if-not-exists", is_flag=True, help="Succeed when the topic already exists.")
@connection_options
def create(topic: str, partitions: int, replication_factor: int, configs: tuple[str, ...],
           if_not_exists: bool) -> None:
    """Create a topic and wait until every partition serves."""
    config = parse_key_values(configs, "--config")
    with admin_client() as admin:
        try:
            admin.create_topics([NewTopic(topic, partitions, replication_factor, config)])
            created = True
        except errors.TopicAlreadyExistsError:
            if not if_not_exists:
                raise
            created = False
    emit({"topic": topic, "created": created, "partitions": partitions, "replication_factor": replication_factor,
          "configs": config},
         lambda: click.echo(f"Created topic {topic}." if created else f"Topic {topic} already exists."))


@topics.command("delete")
@click.option("--topic", "names", multiple=True, required=True, metavar="TOPIC", help="Topic to delete (repeatable).")
@connection_options
def delete(names: tuple[str, ...]) -> None:
    """Delete topics: every replica removes its data and producer state."""
    with admin_client() as admin:
        admin.delete_topics(list(names))
    emit({"deleted": list(names)}, lambda: [click.echo(f"Deleted topic {n}.") for n in names])


@topics.command("alter-config")
@click.option("--topic", required=True)
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="Set a topic config (repeatable).")
@click.option("--delete-config", "deletes", multiple=True, metavar="KEY",
              help="Remove a topic config, back to its default (repeatable).")
@connection_options
def alter_config(topic: str, configs: tuple[str, ...], deletes: tuple[str, ...]) -> None:
    """Set or remove topic configs (keys are checked against the topic configs the
    partition leaders understand), then show the topic's configs."""
    changes: dict[str, str | None] = dict(parse_key_values(configs, "--config"))
    changes.update({k: None for k in deletes})
    if not changes:
        raise click.UsageError("give at least one --config KEY=VALUE or --delete-config KEY")
    with admin_client() as admin:
        admin.incremental_alter_configs({topic: changes})
        entries = admin.describe_configs([topic])[topic]
    data = {"topic": topic, "configs": {k: {"value": e.value, "source": e.source} for k, e in entries.items()}}
    emit(data, lambda: (click.echo(f"Updated configs of topic {topic}."),
                        print_table(["CONFIG", "VALUE", "SOURCE"],
                                    [(k, e.value, e.source) for k, e in entries.items()])))


@topics.command("add-partitions")
@click.option("--topic", required=True)
@click.option("--partitions", type=click.IntRange(min=1), required=True, help="The new total partition count.")
@connection_options
def add_partitions(topic: str, partitions: int) -> None:
    """Grow a topic to --partitions partitions (kafka-topics --alter --partitions)."""
    with admin_client() as admin:
        admin.create_partitions({topic: partitions})
    emit({"topic": topic, "partitions": partitions},
         lambda: click.echo(f"Topic {topic} now has {partitions} partitions."))


@topics.command("delete-records")
@click.option("--topic", required=True)
@click.option("--partition", "partitions", type=click.IntRange(min=0), multiple=True,
              help="Partition (repeatable; default every partition of the topic).")
@click.option("--offset", type=click.IntRange(min=-1), required=True,
              help="Delete the records below this offset; -1: below the high watermark.")
@connection_options
def delete_records(topic: str, partitions: tuple[int, ...], offset: int) -> None:
    """Move the log start offset of partitions up to --offset (kafka-delete-records):
    consumers below it reset by auto.offset.reset, every replica deletes the segments below."""
    with admin_client() as admin:
        wanted = list(partitions) or admin.list_topics(include_internal=True).get(topic)
        if not wanted:
            raise errors.UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        low = admin.delete_records({TopicPartition(topic, p): offset for p in wanted})
    data = [{"topic": tp.topic, "partition": tp.partition, "low_watermark": w} for tp, w in sorted(low.items())]
    emit(data, lambda: print_table(["TOPIC", "PARTITION", "LOW-WATERMARK"],
                                   [(d["topic"], d["partition"], d["low_watermark"]) for d in data]))
