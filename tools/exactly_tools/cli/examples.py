"""An example for the `--help` of every `exactly` command, shown under "Examples:"
(`add_examples` sets them as the commands' epilogs; tests/unit/tools/exactly_tools/test_cli_pure.py
checks that every command has one and that it names the command)."""
from __future__ import annotations

import click

EXAMPLES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("topics", "list"): ("exactly topics list", "exactly topics list --include-internal --json"),
    ("topics", "describe"): ("exactly topics describe --topic orders",),
    ("topics", "create"): ("exactly topics create --topic orders --partitions 6 --replication-factor 3 "
                           "--config min.insync.replicas=2",
                           "exactly topics create --topic orders --if-not-exists"),
    ("topics", "delete"): ("exactly topics delete --topic orders",),
    ("topics", "alter-config"): ("exactly topics alter-config --topic orders --config retention.ms=86400000 "
                                 "--delete-config segment.bytes",),
    ("topics", "add-partitions"): ("exactly topics add-partitions --topic orders --partitions 12",),
    ("topics", "delete-records"): ("exactly topics delete-records --topic orders --partition 0 --offset 50",),
    ("produce",): ("printf 'k1:hello\\nk2:world\\n' | exactly produce orders --key-separator :",
                   "exactly produce orders --transactional-id loader < lines.txt   # one transaction",
                   "exactly produce orders      # interactive: a '>' prompt per line, Ctrl-D to end"),
    ("consume",): ("exactly consume orders --from-beginning --max-records 10 --timeout-ms 5000",
                   "exactly consume orders --group audit --isolation-level read_committed --format json"),
    ("groups", "list"): ("exactly groups list --state Stable",),
    ("groups", "describe"): ("exactly groups describe --group audit --isolation-level read_committed",),
    ("groups", "delete"): ("exactly groups delete --group audit",),
    ("groups", "reset-offsets"): ("exactly groups reset-offsets --group audit --topic orders --to-earliest --execute",),
    ("transactions", "list"): ("exactly transactions list --state Ongoing",),
    ("transactions", "describe"): ("exactly transactions describe --transactional-id loader",),
    ("transactions", "describe-producers"): ("exactly transactions describe-producers --topic orders --partition 0",),
    ("transactions", "find-hanging"): ("exactly transactions find-hanging --topic orders",),
    ("transactions", "abort"): ("exactly transactions abort --topic orders --partition 0 --start-offset 4711",),
    ("transactions", "commit-prepared"): ("exactly transactions commit-prepared --transactional-id orders-1 "
                                          "--state 4007:12:orders-1",),
    ("transactions", "abort-prepared"): ("exactly transactions abort-prepared --transactional-id orders-1",),
    ("dump-log",): ("exactly dump-log .run/dev/pl-0/logs/orders-0/00000000000000000000.log --print-data",),
    ("perf", "produce"): ("exactly perf produce --topic orders --num-records 10000 --record-size 200",),
    ("perf", "consume"): ("exactly perf consume --topic orders --messages 10000",),
    ("acls", "add"): ("exactly acls add --principal User:billing --resource-type Topic --name purchases "
                      "--operation Read --command-config .run/secure/client.properties",),
    ("acls", "remove"): ("exactly acls remove --principal User:billing --resource-type Topic --name purchases "
                         "--operation Read --command-config .run/secure/client.properties",),
    ("acls", "list"): ("exactly acls list --command-config .run/secure/client.properties",),
    ("users", "add"): ("exactly users add billing --password 'billing-secret' "
                       "--command-config .run/secure/client.properties",),
    ("users", "remove"): ("exactly users remove billing --command-config .run/secure/client.properties",),
    ("users", "list"): ("exactly users list --command-config .run/secure/client.properties",),
    ("quotas",): ("exactly quotas --entity-type users --entity-name alice --alter "
                  "--add-config producer_byte_rate=1048576",
                  "exactly quotas --describe --json"),
    ("features", "describe"): ("exactly features describe", "exactly features describe --json"),
    ("features", "upgrade"): ("exactly features upgrade --dry-run",
                              "exactly features upgrade --feature metadata.version=2"),
    ("features", "downgrade"): ("exactly features downgrade --feature metadata.version=2 --dry-run",),
}


def commands(group: click.Group, prefix: tuple[str, ...] = ()):
    """(path, command) of every leaf command under `group`."""
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from commands(cmd, prefix + (name,))
        else:
            yield prefix + (name,), cmd


def add_examples(group: click.Group) -> None:
    """Set the epilog of every command of `group` to its EXAMPLES (click keeps the lines
    of a paragraph that starts with \\b as they are)."""
    for path, cmd in commands(group):
        lines = EXAMPLES.get(path)
        if lines:
            cmd.epilog = "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


__all__ = ["EXAMPLES", "add_examples", "commands"]
