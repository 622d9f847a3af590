"""`exactly features describe|upgrade|downgrade` (Kafka's kafka-features, KIP-584): the
cluster's finalized metadata.version, what every live process supports, and raising it
once every process runs a version that reads its formats. Describing needs Describe on
the Cluster, changing Alter; docs/operating/upgrades.md."""
from __future__ import annotations

import click

from .common import admin_client, connection_options, emit, fail, print_table

METADATA_VERSION = "metadata.version"


def _range(rng: tuple[int, int] | None) -> str:
    if rng is None:
        return "-"
    return str(rng[0]) if rng[0] == rng[1] else f"{rng[0]}-{rng[1]}"


@click.group("features")
def features() -> None:
    """Feature levels (metadata.version): describe them, raise them after a rolling
    upgrade (every process must support the level), or lower them (refused once a
    level's formats may be written)."""


@features.command("describe")
@connection_options
def describe() -> None:
    """The finalized levels, their epoch, and the levels each live process supports."""
    with admin_client() as admin:
        md = admin.describe_features()
    names = sorted(set(md.finalized) | set(md.supported))
    data = {"finalized": md.finalized, "finalized_epoch": md.finalized_epoch,
            "supported": {n: list(r) for n, r in md.supported.items()},
            "processes": [{"node_id": p.node_id, "role": p.role, "advertised": p.advertised,
                           "supported": {n: list(r) for n, r in p.supported.items()}} for p in md.processes]}

    def table() -> None:
        for name in names:
            rng = md.supported.get(name)
            click.echo(f"Feature: {name}\tSupportedMinVersion: {rng[0] if rng else '-'}\t"
                       f"SupportedMaxVersion: {rng[1] if rng else '-'}\t"
                       f"FinalizedVersionLevel: {md.finalized.get(name, '-')}\tEpoch: {md.finalized_epoch}")
        click.echo("")
        print_table(["NODE", "ROLE", "METADATA.VERSION", "NOTE"],
                    [(p.node_id, p.role, _range(p.supported.get(METADATA_VERSION)),
                      "" if p.advertised else "a version before feature levels")
                     for p in md.processes], empty="(no live process)")
    emit(data, table)


def _level(feature: str | None, latest: int | None) -> int:
    """The level of `--feature metadata.version=N` (or `latest` without it)."""
    if feature is None:
        if latest is None:
            fail("give --feature metadata.version=LEVEL", 2)
        return latest
    name, sep, value = feature.partition("=")
    if not sep or name != METADATA_VERSION:
        fail(f"--feature: expected metadata.version=LEVEL, got {feature!r}", 2)
    try:
        return int(value)
    except ValueError:
        fail(f"--feature: the level must be a number, got {value!r}", 2)
    raise AssertionError("unreachable")


def _update(feature: str | None, upgrade_type: str, dry_run: bool) -> None:
    from exactly import FeatureUpdate
    with admin_client() as admin:
        md = admin.describe_features()
        current = md.finalized.get(METADATA_VERSION)
        # Without --feature, upgrade goes to the newest level a live process knows (and is
        # refused, naming them, while some process does not support it).
        latest = max((p.supported.get(METADATA_VERSION, (1, 1))[1] for p in md.processes), default=None)
        level = _level(feature, latest if upgrade_type == "upgrade" else None)
        admin.update_features({METADATA_VERSION: FeatureUpdate(level, upgrade_type)}, validate_only=dry_run)
    if level == current:
        text = f"{METADATA_VERSION} is already {level}."
    else:
        text = f"{METADATA_VERSION} {'can be' if dry_run else 'is now'} {level} (was {current})."
    emit({"feature": METADATA_VERSION, "previous": current, "level": level, "dry_run": dry_run},
         lambda: click.echo(text))


@features.command("upgrade")
@click.option("--feature", metavar="metadata.version=LEVEL",
              help="The level to finalize (default: the newest level a live process supports).")
@click.option("--dry-run", is_flag=True, help="Check whether the upgrade would be accepted; change nothing.")
@connection_options
def upgrade(feature: str | None, dry_run: bool) -> None:
    """Raise metadata.version. Refused, naming them, while a live process runs a
    version that does not support the level: upgrade every process first."""
    _update(feature, "upgrade", dry_run)


@features.command("downgrade")
@click.option("--feature", metavar="metadata.version=LEVEL", required=True, help="The level to finalize.")
@click.option("--dry-run", is_flag=True, help="Check whether the downgrade would be accepted; change nothing.")
@connection_options
def downgrade(feature: str, dry_run: bool) -> None:
    """Lower metadata.version: refused once the level was raised, since records,
    snapshots and checkpoints of the higher level may exist that older versions
    cannot read (downgrade the binaries before raising the level instead)."""
    _update(feature, "safe_downgrade", dry_run)
