"""`exactly groups`: list, describe (members, offsets and lag), delete, reset-offsets
(kafka-consumer-groups)."""
from __future__ import annotations

import click

from exactly import TopicPartition, errors

from .common import admin_client, connection_options, emit, print_table

ISOLATION = click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]),
                         default="read_uncommitted", show_default=True,
                         help="Lag is measured to the LSO for read_committed groups, else to the high watermark.")


@click.group()
def groups() -> None:
    """List, describe, delete consumer groups and reset their offsets."""


@groups.command("list")
@click.option("--state", "states", multiple=True, metavar="STATE",
              help="Only groups in this state (Empty, Stable, PreparingRebalance, ...; repeatable).")
@connection_options
def list_groups(states: tuple[str, ...]) -> None:
    """Every consumer group with its state."""
    with admin_client() as admin:
        found = admin.list_groups(states)
    data = [{"group": g.group_id, "state": g.state, "protocol_type": g.protocol_type} for g in found]
    emit(data, lambda: print_table(["GROUP", "STATE", "PROTOCOL-TYPE"],
                                   [(d["group"], d["state"], d["protocol_type"] or "-") for d in data],
                                   empty="(no groups)"))


def _describe(admin, group: str, isolation_level: str) -> dict:
    desc = admin.describe_groups([group])[group]
    offsets = admin.list_consumer_group_offsets(group, isolation_level=isolation_level)
    owner = {tp: m for m in desc.members for tp in m.assignment}
    if desc.state == "Dead" and not offsets:
        raise errors.GroupIdNotFoundError(f"consumer group {group!r} does not exist")
    return {
        "group": group, "state": desc.state, "generation": desc.generation_id, "coordinator": desc.coordinator,
        "isolation_level": isolation_level,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id or None,
                     "subscription": list(m.subscription),
                     "assignment": [f"{tp.topic}-{tp.partition}" for tp in m.assignment]} for m in desc.members],
        "offsets": [{"topic": tp.topic, "partition": tp.partition, "current_offset": o.committed_offset,
                     "log_end_offset": o.high_watermark, "last_stable_offset": o.last_stable_offset, "lag": o.lag,
                     "member_id": owner[tp].member_id if tp in owner else None}
                    for tp, o in offsets.items()]}


@groups.command("describe")
@click.option("--group", "names", multiple=True, required=True, metavar="GROUP", help="Group (repeatable).")
@ISOLATION
@connection_options
def describe(names: tuple[str, ...], isolation_level: str) -> None:
    """State, members and, per partition, committed offset, high watermark, LSO and lag."""
    with admin_client() as admin:
        data = [_describe(admin, g, isolation_level) for g in names]

    def table() -> None:
        for i, d in enumerate(data):
            if i:
                click.echo()
            click.echo(f"Group: {d['group']}  State: {d['state']}  Generation: {d['generation']}  "
                       f"Members: {len(d['members'])}  Coordinator: {d['coordinator']}")
            print_table(["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LSO", "LAG", "MEMBER-ID"],
                        [(o["topic"], o["partition"], o["current_offset"], o["log_end_offset"],
                          o["last_stable_offset"], o["lag"], o["member_id"]) for o in d["offsets"]],
                        empty="(no committed offsets)")
            if d["members"]:
                click.echo()
                print_table(["MEMBER-ID", "INSTANCE-ID", "ASSIGNMENT"],
                            [(m["member_id"], m["group_instance_id"], ",".join(m["assignment"]))
                             for m in d["members"]])
    emit(data, table)


@groups.command("delete")
@click.option("--group", "names", multiple=True, required=True, metavar="GROUP", help="Group (repeatable).")
@connection_options
def delete(names: tuple[str, ...]) -> None:
    """Delete groups without members, with their committed offsets."""
    with admin_client() as admin:
        admin.delete_groups(list(names))
    emit({"deleted": list(names)}, lambda: [click.echo(f"Deleted group {g}.") for g in names])


@groups.command("reset-offsets")
@click.option("--group", required=True)
@click.option("--topic", "topic_specs", multiple=True, required=True, metavar="TOPIC[:P,P...]",
              help="Topic, optionally with partitions (repeatable).")
@click.option("--to-earliest", "to", flag_value="earliest", help="To the log start offset.")
@click.option("--to-latest", "to", flag_value="latest", help="To the end (LSO with --isolation-level read_committed).")
@click.option("--to-offset", type=int, metavar="OFFSET", help="To this offset.")
@click.option("--shift-by", type=int, metavar="N", help="Move the committed offsets by N (negative: back).")
@click.option("--execute", is_flag=True, help="Commit the new offsets (default: only show them).")
@ISOLATION
@connection_options
def reset_offsets(group: str, topic_specs: tuple[str, ...], to: str | None, to_offset: int | None,
                  shift_by: int | None, execute: bool, isolation_level: str) -> None:
    """Plan (and with --execute commit) new offsets for an inactive group, as
    kafka-consumer-groups --reset-offsets."""
    if sum(x is not None for x in (to, to_offset, shift_by)) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-offset, --shift-by")
    with admin_client() as admin:
        desc = admin.describe_groups([group])[group]
        if desc.members:
            raise click.ClickException(f"group {group} has {len(desc.members)} active members; stop them first "
                                       f"(state {desc.state})")
        tps = []
        for spec in topic_specs:
            topic, _, plist = spec.partition(":")
            parts = sorted(admin.describe_topics([topic])[topic].partitions)
            chosen = [int(p) for p in plist.split(",")] if plist else parts
            tps += [TopicPartition(topic, p) for p in chosen]
        current = admin.list_consumer_group_offsets(group, tps, isolation_level=isolation_level)
        ends = admin.list_offsets(tps)
        starts = admin.list_start_offsets(tps)
        plan = {}
        for tp in tps:
            hw, lso = ends[tp]
            end = lso if isolation_level == "read_committed" else hw
            if to == "earliest":
                new = starts[tp]
            elif to == "latest":
                new = end
            elif to_offset is not None:
                new = to_offset
            else:
                base = current[tp].committed_offset if tp in current and current[tp].committed_offset >= 0 else end
                new = base + shift_by
            plan[tp] = min(max(new, starts[tp]), end)
        if execute:
            admin.alter_consumer_group_offsets(group, plan)
    data = {"group": group, "executed": execute,
            "offsets": [{"topic": tp.topic, "partition": tp.partition, "new_offset": off} for tp, off in plan.items()]}
    emit(data, lambda: (print_table(["TOPIC", "PARTITION", "NEW-OFFSET"],
                                    [(tp.topic, tp.partition, off) for tp, off in plan.items()]),
                        None if execute else click.echo("(dry run: add --execute to commit these offsets)", err=True)))
