"""Pure parts of the `exactly` command line: it imports no server dependency, every
subcommand has help, the segment dump decodes batches and markers, percentiles,
tables (the commands themselves are tested through the installed entry point in
tests/integration/test_cli.py)."""
from __future__ import annotations

import ast

import pytest
from click.testing import CliRunner

from exactly_tools import design_docs
from exactly_tools.cli import cli
from exactly_tools.cli.common import parse_key_values, print_table
from exactly_tools.cli.dumplog import describe_batch
from exactly_tools.cli.perf import percentile
from exactly_wire import records

CLI = design_docs.ROOT / "tools" / "exactly_tools" / "cli"
SERVER_ONLY = ("kazoo", "rocksdict", "prometheus_client", "grpc_health", "services")


def test_cli_imports_no_server_dependency():
    for path in CLI.glob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            assert not [n for n in names if n.split(".")[0] in SERVER_ONLY], (path.name, names)


def _commands(group, prefix=()):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, prefix + (name,))
        else:
            yield prefix + (name,)


@pytest.mark.parametrize("path", sorted(_commands(cli)))
def test_every_command_has_help(path):
    res = CliRunner().invoke(cli, [*path, "--help"])
    assert res.exit_code == 0 and "Usage:" in res.output
    if path[0] != "dump-log":
        assert "--bootstrap-server" in res.output and "--command-config" in res.output
    assert "--json" in res.output
    # ... with an example of the command itself, kept line by line.
    examples = res.output.split("Examples:\n", 1)[1].splitlines()
    assert examples and all(line.startswith("  ") for line in examples), res.output
    assert any(f"exactly {' '.join(path)}" in line for line in examples), res.output


def test_describe_batch_data_and_marker():
    data = bytearray(records.encode_batch([(b"k", b"v", [("h", b"1")], 1000)], producer_id=7, producer_epoch=2,
                                          base_sequence=5, transactional=True))
    records.set_base_offset(data, 40)
    b = describe_batch(data, 0, records.parse_header(data), print_data=True)
    assert (b["base_offset"], b["producer_id"], b["producer_epoch"], b["base_sequence"]) == (40, 7, 2, 5)
    assert b["is_transactional"] and not b["is_control"] and b["crc_valid"]
    assert b["records"] == [{"offset": 40, "timestamp": 1000, "key": "k", "value": "v", "headers": {"h": "1"}}]
    marker = records.encode_control_batch(False, 7, 3, 11, 2000)
    m = describe_batch(marker, 0, records.parse_header(marker), print_data=False)
    assert (m["is_control"], m["marker"], m["coordinator_epoch"]) == (True, "ABORT", 11) and "records" not in m
    corrupt = bytearray(data)
    corrupt[-1] ^= 0xFF
    assert describe_batch(corrupt, 0, records.parse_header(corrupt), print_data=True)["crc_valid"] is False


def test_percentile_table_and_pairs(capsys):
    assert percentile([], 0.5) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 3.0 and percentile([1.0, 2.0], 0.999) == 2.0
    print_table(["A", "LONGER"], [("x", None), ("yyyy", 2)])
    assert capsys.readouterr().out.splitlines() == ["A     LONGER", "x     -", "yyyy  2"]
    assert parse_key_values(["a=1", "b=x=y"], "--config") == {"a": "1", "b": "x=y"}
    with pytest.raises(Exception, match="expected key=value"):
        parse_key_values(["nope"], "--config")


def test_version_reads_the_distribution_metadata():
    """The SDK and the command line are the PyPI distribution `exactly-log` (the name
    `exactly` belongs to an unrelated project); `exactly --version` reads its metadata."""
    from importlib.metadata import version
    res = CliRunner().invoke(cli, ["--version"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"exactly, version {version('exactly-log')}"
