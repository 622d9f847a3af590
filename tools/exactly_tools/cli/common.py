"""What every `exactly` subcommand shares: connection flags (`--bootstrap-server`,
`--command-config`), `--json`, the client configurations built from them, output
(aligned tables or JSON) and the one-line error reporting."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import click
import jproperties

from exactly.config import AdminSchema, ClientSchema, ConsumerSchema, ProducerSchema, keys

from .. import devfiles

DEFAULT_BOOTSTRAP = "127.0.0.1:9093"
# A command line should answer quickly when the cluster is not there.
DEFAULT_REQUEST_TIMEOUT_MS = "10000"
_SCHEMAS = {"admin": AdminSchema, "producer": ProducerSchema, "consumer": ConsumerSchema}
# The key of bootstrap.servers, as the clients' schema defines it.
BOOTSTRAP_SERVERS = ClientSchema.model_fields["bootstrap_servers"].alias


class CliError(click.ClickException):
    """A failure reported as one line on stderr with exit code 1."""


def default_bootstrap() -> str:
    """--bootstrap-server when not given (nor $EXACTLY_BOOTSTRAP_SERVER): the dev cluster's
    in $EXACTLY_DEV_DIR or .run/dev (its cluster.json), else 127.0.0.1:9093 (the Helm
    chart's gRPC port)."""
    return devfiles.cluster_bootstrap() or DEFAULT_BOOTSTRAP


@dataclass
class Options:
    """The connection and output flags of one invocation."""

    bootstrap_server: str = field(default_factory=default_bootstrap)
    command_config: dict[str, str] = field(default_factory=dict)
    as_json: bool = False

    def conf(self, role: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Client configuration for `role` (admin, producer, consumer): the keys of
        --command-config that role knows, bootstrap.servers from --bootstrap-server,
        a 10 s request.timeout.ms unless configured, then `extra`."""
        known = set(keys(_SCHEMAS[role]))
        conf: dict[str, Any] = {"request.timeout.ms": DEFAULT_REQUEST_TIMEOUT_MS}
        conf.update({k: v for k, v in self.command_config.items() if k in known})
        conf[BOOTSTRAP_SERVERS] = self.bootstrap_server
        conf.update(extra or {})
        return conf


def read_command_config(path: str) -> dict[str, str]:
    """Client keys from a Java properties file (jproperties, as the services read
    --config). Keys no client knows are refused with the list of client keys."""
    props = jproperties.Properties()
    try:
        with open(path, "rb") as f:
            props.load(f, "utf-8")
    except OSError as exc:
        raise CliError(f"cannot read --command-config {path}: {exc.strerror or exc}") from None
    out = {str(k): str(v.data) for k, v in props.items()}
    every = set().union(*(keys(s) for s in _SCHEMAS.values()))
    unknown = sorted(k for k in out if k not in every)
    if unknown:
        raise CliError(f"--command-config {path}: unknown client key {unknown[0]!r} "
                       f"(client keys: bootstrap.servers, request.timeout.ms, ... see docs/reference/configuration.md)")
    return out


def _set_bootstrap(ctx: click.Context, _param, value):
    """--bootstrap-server, else $EXACTLY_BOOTSTRAP_SERVER unless --command-config (read
    first: it is eager) names bootstrap.servers."""
    if value is not None:
        opts = ctx.ensure_object(Options)
        if _given(ctx, "bootstrap_server") or BOOTSTRAP_SERVERS not in opts.command_config:
            opts.bootstrap_server = value
    return value


def _set_command_config(ctx: click.Context, _param, value):
    if value is not None:
        opts = ctx.ensure_object(Options)
        opts.command_config = read_command_config(value)
        if BOOTSTRAP_SERVERS in opts.command_config and not _given(ctx, "bootstrap_server"):
            opts.bootstrap_server = opts.command_config[BOOTSTRAP_SERVERS]
    return value


def _set_json(ctx: click.Context, _param, value):
    if value:
        ctx.ensure_object(Options).as_json = True
    return value


def _given(ctx: click.Context, name: str) -> bool:
    src = ctx.get_parameter_source(name)
    return src is not None and src.name == "COMMANDLINE"


def connection_options(fn: Callable) -> Callable:
    """--bootstrap-server, --command-config and --json on a subcommand (Kafka's tools
    take them on every command). The bootstrap default is $EXACTLY_BOOTSTRAP_SERVER,
    else bootstrap.servers of --command-config, else the dev cluster in $EXACTLY_DEV_DIR or
    .run/dev, else 127.0.0.1:9093."""
    fn = click.option("--json", "as_json", is_flag=True, expose_value=False, callback=_set_json,
                      help="Machine-readable JSON on stdout.")(fn)
    fn = click.option("--command-config", type=str, metavar="FILE", expose_value=False, is_eager=True,
                      callback=_set_command_config,
                      help="Java properties file of client keys (request.timeout.ms, client.id, ...).")(fn)
    fn = click.option("--bootstrap-server", type=str, metavar="HOST:PORT[,...]", expose_value=False,
                      envvar="EXACTLY_BOOTSTRAP_SERVER", callback=_set_bootstrap,
                      help="Any service address of the cluster (default $EXACTLY_BOOTSTRAP_SERVER, else "
                           "bootstrap.servers of --command-config, else the dev cluster in $EXACTLY_DEV_DIR or "
                           ".run/dev, else 127.0.0.1:9093).")(fn)
    return fn


def json_option(fn: Callable) -> Callable:
    """--json alone (commands that need no cluster)."""
    return click.option("--json", "as_json", is_flag=True, expose_value=False, callback=_set_json,
                        help="Machine-readable JSON on stdout.")(fn)


def options() -> Options:
    return click.get_current_context().ensure_object(Options)


def admin_client():
    """An AdminClient for the current invocation (a context manager)."""
    from exactly import AdminClient
    return AdminClient(options().conf("admin"))


def emit(data: Any, table: Callable[[], None]) -> None:
    """Print `data` as JSON with --json, else call `table()`."""
    if options().as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=False, default=_jsonable))
    else:
        table()


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str | None = None) -> None:
    """Left-aligned columns, two spaces apart, as kafka-consumer-groups prints them."""
    rows = [["-" if c is None else str(c) for c in r] for r in rows]
    if not rows and empty is not None:
        click.echo(empty)
        return
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def parse_key_values(pairs: Iterable[str], flag: str) -> dict[str, str]:
    """["k=v", ...] -> {k: v}; a pair without '=' is a usage error naming `flag`."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {pair!r}", param_hint=flag)
        out[key] = value
    return out


def progress(message: str) -> None:
    """A progress line on stderr (never mixed into --json output)."""
    click.echo(message, err=True)


def debug() -> bool:
    """EXACTLY_DEBUG=1 shows tracebacks instead of one-line errors."""
    return os.environ.get("EXACTLY_DEBUG", "") not in ("", "0")


def fail(message: str, code: int = 1) -> None:
    click.echo(f"exactly: error: {message}", err=True)
    sys.exit(code)
