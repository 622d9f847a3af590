"""`exactly quotas` (kafka-configs --entity-type users|clients --alter --add-config
producer_byte_rate=1024 / --delete-config / --describe): client quotas stored in
ZooKeeper and applied by every service within a second. Changing needs Alter on the
Cluster, describing Describe; docs/design.md, "Quotas"."""
from __future__ import annotations

import click

from .common import admin_client, connection_options, emit, fail, parse_key_values, print_table

QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate",
              "max_partitions")
DEFAULT_NAME = "<default>"


def _entity(users: tuple[str, ...], clients: tuple[str, ...], user_default: bool, client_default: bool
            ) -> dict[str, str | None]:
    """The entity named by the kafka-configs style options (None: the default entity)."""
    entity: dict[str, str | None] = {}
    if users or user_default:
        entity["user"] = None if user_default else users[0]
    if clients or client_default:
        entity["client-id"] = None if client_default else clients[0]
    return entity


def _entity_text(entity: dict[str, str | None]) -> str:
    return ", ".join(f"{t} {DEFAULT_NAME if n is None else n}" for t, n in entity.items())


def _values(pairs: str) -> dict[str, float]:
    out = {}
    for key, value in parse_key_values([p for p in pairs.split(",") if p.strip()], "--add-config").items():
        if key not in QUOTA_KEYS:
            fail(f"--add-config: unknown quota key {key!r}; the keys are {', '.join(QUOTA_KEYS)}", 2)
        try:
            out[key] = float(value)
        except ValueError:
            fail(f"--add-config: {key} needs a number, got {value!r}", 2)
    return out


@click.command("quotas")
@click.option("--entity-type", "entity_types", multiple=True, type=click.Choice(["users", "clients"]),
              help="Entity type of the --entity-name / --entity-default that follows (kafka-configs style).")
@click.option("--user", "users", multiple=True, help="User name (the principal without 'User:').")
@click.option("--client", "clients", multiple=True, help="Client id.")
@click.option("--entity-name", "entity_names", multiple=True, help="Name for the preceding --entity-type.")
@click.option("--entity-default", "entity_defaults", is_flag=True,
              help="The default entity of --entity-type (every user / client id without its own quota).")
@click.option("--user-defaults", is_flag=True, help="The default user entity.")
@click.option("--client-defaults", is_flag=True, help="The default client-id entity.")
@click.option("--alter", is_flag=True, help="Change the entity's quotas (--add-config / --delete-config).")
@click.option("--add-config", default="", help="key=value,... (keys: " + ", ".join(QUOTA_KEYS) + ").")
@click.option("--delete-config", default="", help="key,... to remove.")
@click.option("--describe", is_flag=True, help="List stored quotas (of the entity, when one is named).")
@connection_options
def quotas(entity_types, users, clients, entity_names, entity_defaults, user_defaults, client_defaults, alter,
           add_config, delete_config, describe) -> None:
    """Set and describe client quotas (Kafka's kafka-configs --entity-type users/clients):
    producer_byte_rate, consumer_byte_rate (bytes/s), request_percentage (% of a
    handler thread), controller_mutation_rate (partitions/s), max_partitions (partitions
    a user's topics may have). Example:

      exactly quotas --entity-type users --entity-name alice --alter --add-config producer_byte_rate=1048576
    """
    users, clients = list(users), list(clients)
    for i, kind in enumerate(entity_types):
        if i < len(entity_names):
            (users if kind == "users" else clients).append(entity_names[i])
        elif entity_defaults:
            if kind == "users":
                user_defaults = True
            else:
                client_defaults = True
        else:
            fail(f"--entity-type {kind} needs --entity-name or --entity-default", 2)
    if len(users) > 1 or len(clients) > 1:
        fail("one user and one client id at most", 2)
    entity = _entity(tuple(users), tuple(clients), user_defaults, client_defaults)
    if alter == describe:
        fail("give exactly one of --alter and --describe", 2)
    with admin_client() as admin:
        if describe:
            found = admin.describe_client_quotas(entity or None, strict=bool(entity))
            emit([{"entity": e, "quotas": v} for e, v in found], lambda: print_table(
                ["ENTITY", "QUOTAS"], [(_entity_text(e), ", ".join(f"{k}={v:g}" for k, v in sorted(v.items())))
                                       for e, v in found], empty="(no quotas)"))
            return
        if not entity:
            fail("--alter needs an entity (--entity-type users|clients with --entity-name or --entity-default)", 2)
        set_values = _values(add_config)
        remove = [k.strip() for k in delete_config.split(",") if k.strip()]
        if not set_values and not remove:
            fail("--alter needs --add-config or --delete-config", 2)
        admin.alter_client_quotas(entity, set_values, remove)
    emit({"entity": entity, "set": set_values, "removed": remove},
         lambda: click.echo(f"Quotas of {_entity_text(entity)}: set {set_values or '-'}, removed {remove or '-'}."))
