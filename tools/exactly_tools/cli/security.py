"""`exactly acls add|remove|list` (kafka-acls) and `exactly users add|remove|list`
(kafka-configs --alter --entity-type users, SCRAM credentials). Changing needs Alter on
the Cluster, listing Describe; docs/design.md, "Security"."""
from __future__ import annotations

import click

from exactly import AclBinding

from .common import admin_client, connection_options, emit, print_table

RESOURCE_TYPES = ["Topic", "Group", "TransactionalId", "Cluster"]
OPERATIONS = ["All", "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "DescribeConfigs",
              "AlterConfigs", "IdempotentWrite"]


def _acl_options(fn):
    fn = click.option("--deny", is_flag=True, help="A Deny ACL (default Allow; deny wins).")(fn)
    fn = click.option("--prefixed", is_flag=True, help="Match every resource name starting with --name.")(fn)
    fn = click.option("--operation", "operations", multiple=True, required=True,
                      type=click.Choice(OPERATIONS, case_sensitive=False), help="Operation (repeatable).")(fn)
    fn = click.option("--name", required=True, help="Resource name; * for every resource of the type; "
                                                    "kafka-cluster for the Cluster.")(fn)
    fn = click.option("--resource-type", required=True, type=click.Choice(RESOURCE_TYPES, case_sensitive=False))(fn)
    fn = click.option("--principal", required=True, help="User:<name>, or User:* for everyone.")(fn)
    return fn


def _bindings(principal, resource_type, name, operations, prefixed, deny) -> list[AclBinding]:
    rtype = next(t for t in RESOURCE_TYPES if t.lower() == resource_type.lower())
    return [AclBinding(principal, rtype, name, next(o for o in OPERATIONS if o.lower() == op.lower()),
                       "Deny" if deny else "Allow", "Prefixed" if prefixed else "Literal") for op in operations]


@click.group()
def acls() -> None:
    """Add, remove and list ACLs (the authorizer=acl rules)."""


@acls.command("add")
@_acl_options
@connection_options
def add_acl(principal, resource_type, name, operations, prefixed, deny) -> None:
    """Store ACLs; every service applies them within a second."""
    bindings = _bindings(principal, resource_type, name, operations, prefixed, deny)
    with admin_client() as admin:
        admin.create_acls(bindings)
    emit([b._asdict() for b in bindings], lambda: [click.echo(f"Added {_line(b)}") for b in bindings])


@acls.command("remove")
@_acl_options
@connection_options
def remove_acl(principal, resource_type, name, operations, prefixed, deny) -> None:
    """Remove ACLs (exactly as they were added)."""
    bindings = _bindings(principal, resource_type, name, operations, prefixed, deny)
    with admin_client() as admin:
        admin.delete_acls(bindings)
    emit([b._asdict() for b in bindings], lambda: [click.echo(f"Removed {_line(b)}") for b in bindings])


@acls.command("list")
@click.option("--principal", help="Only this principal's ACLs.")
@connection_options
def list_acls(principal) -> None:
    """Every stored ACL."""
    with admin_client() as admin:
        found = [b for b in admin.describe_acls() if principal is None or b.principal == principal]
    emit([b._asdict() for b in found], lambda: print_table(
        ["PRINCIPAL", "PERMISSION", "OPERATION", "RESOURCE-TYPE", "NAME", "PATTERN"],
        [(b.principal, b.permission, b.operation, b.resource_type, b.name, b.pattern) for b in found],
        empty="(no ACLs)"))


def _line(b: AclBinding) -> str:
    return f"{b.permission} {b.principal} {b.operation} on {b.resource_type} {b.name!r} ({b.pattern})"


@click.group()
def users() -> None:
    """Add, remove and list SASL users (salted SCRAM-SHA-256 and SCRAM-SHA-512 credentials)."""


@users.command("add")
@click.argument("name")
@click.option("--password", prompt=True, hide_input=True, confirmation_prompt=False,
              help="The password (prompted when not given); sent over TLS only.")
@click.option("--iterations", type=click.IntRange(min=4096, max=16384), default=4096, show_default=True,
              help="SCRAM iteration count (Kafka's bounds: 4096..16384)")
@connection_options
def add_user(name, password, iterations) -> None:
    """Create a user or change its password."""
    with admin_client() as admin:
        admin.alter_user_scram_credentials({name: password}, iterations=iterations)
    emit({"user": name, "mechanism": "SCRAM-SHA-512", "mechanisms": ["SCRAM-SHA-256", "SCRAM-SHA-512"],
          "iterations": iterations},
         lambda: click.echo(f"User {name} set (SCRAM-SHA-256 and SCRAM-SHA-512, {iterations} iterations)."))


@users.command("remove")
@click.argument("name")
@connection_options
def remove_user(name) -> None:
    """Delete a user."""
    with admin_client() as admin:
        admin.alter_user_scram_credentials(deletions=[name])
    emit({"removed": name}, lambda: click.echo(f"User {name} removed."))


@users.command("list")
@connection_options
def list_users() -> None:
    """The SASL user names."""
    with admin_client() as admin:
        names = admin.describe_user_scram_credentials()
    emit(names, lambda: print_table(["USER"], [(n,) for n in names], empty="(no users)"))
