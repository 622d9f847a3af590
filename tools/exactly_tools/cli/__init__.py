"""`exactly`: the operator's command line (docs/design.md, "Administration"; docs/operating/cli.md,
"Operating Exactly: the `exactly` command").

    exactly topics list|describe|create|delete|alter-config|add-partitions
    exactly produce TOPIC | --topic TOPIC   lines from stdin
    exactly consume TOPIC | --topic TOPIC
    exactly groups list|describe|delete|reset-offsets
    exactly transactions list|describe|describe-producers|find-hanging|abort
    exactly dump-log SEGMENT_FILE
    exactly perf produce|consume
    exactly features describe|upgrade|downgrade

Every command takes `--bootstrap-server`, `--command-config FILE` and `--json`.
Errors (a bad flag, an unknown topic, an unreachable cluster) are one line on stderr
and a non-zero exit: 2 for usage errors, 1 otherwise, 130 on Ctrl-C.
"""
from __future__ import annotations

import sys
import traceback

import click

from exactly import errors
from exactly_wire import DISTRIBUTION

from .common import debug, fail
from .clients import consume, produce
from .dumplog import dump_log
from .examples import add_examples
from .features import features
from .groups import groups
from .perf import perf
from .quotas import quotas
from .security import acls, users
from .topics import topics
from .transactions import transactions


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name=DISTRIBUTION, prog_name="exactly")
def cli() -> None:
    """Operate an Exactly cluster: topics, console producer and consumer, consumer
    groups, transactions (KIP-664 hanging transactions), segment dumps,
    performance tests, ACLs, SASL users, client quotas and feature levels."""


for command in (topics, produce, consume, groups, transactions, dump_log, perf, acls, users, quotas, features):
    cli.add_command(command)
add_examples(cli)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (errors.NetworkException, errors.RequestTimedOutError)):
        return f"cannot reach the cluster ({type(exc).__name__}: {exc}); check --bootstrap-server"
    if isinstance(exc, errors.ExactlyError):
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `exactly` script."""
    try:
        cli.main(args=argv, prog_name="exactly", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # click >= 8.2: a group without a subcommand
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(0)
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        fail(f"{exc.format_message()}{hint}", 2)
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except click.exceptions.Abort:
        fail("aborted", 130)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`)
        sys.exit(0)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - every failure is one line; EXACTLY_DEBUG=1 shows the traceback
        if debug():
            traceback.print_exc()
        fail(_describe(exc))
    sys.exit(0)


__all__ = ["cli", "main"]
