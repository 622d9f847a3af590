"""The PromQL expressions of the Grafana dashboards in this folder.

    from exprs import dashboard_expressions      # or load this file with importlib
    for dashboard, panel, expr in dashboard_expressions():
        ...                                         # e.g. GET /api/v1/query?query=<expr>

By default the Grafana variables are resolved so each expression can be sent to
Prometheus as is: `$__rate_interval` (and `$__interval`, `$__range`) become
`rate_interval`, and the dashboard's own variables (`$topic`, `$service`, ...) become `.*`
(they are only used with regex matchers, `=~`). `resolve=False` returns the expressions
exactly as stored. Only the standard library is used.

Run as a script to print them: `python deploy/grafana/exprs.py [--raw]`.
"""
from __future__ import annotations

import json
import pathlib
import re
import sys

DASHBOARD_DIR = pathlib.Path(__file__).resolve().parent

_GRAFANA_INTERVALS = ("__rate_interval", "__interval", "__range")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def dashboard_files(directory: pathlib.Path = DASHBOARD_DIR) -> list[pathlib.Path]:
    """The dashboard JSON files of `directory`, sorted by name."""
    return sorted(directory.glob("*.json"))


def _panels(panels: list[dict]) -> list[dict]:
    """Every panel, including those nested in collapsed rows, in document order."""
    out: list[dict] = []
    for panel in panels:
        out.append(panel)
        out.extend(_panels(panel.get("panels", [])))
    return out


def resolve_variables(expr: str, rate_interval: str = "1m") -> str:
    """`expr` with Grafana's interval variables replaced by `rate_interval` (a PromQL
    duration) and every other variable by `.*`."""

    def substitute(match: re.Match) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        return rate_interval if name in _GRAFANA_INTERVALS else ".*"

    return _VARIABLE.sub(substitute, expr)


def dashboard_expressions(*, resolve: bool = True, rate_interval: str = "1m",
                          directory: pathlib.Path = DASHBOARD_DIR) -> list[tuple[str, str, str]]:
    """All panel query expressions as (dashboard title, panel title, expr), in file then
    panel then target order. Hidden targets are included; rows have none."""
    result: list[tuple[str, str, str]] = []
    for path in dashboard_files(directory):
        board = json.loads(path.read_text())
        for panel in _panels(board.get("panels", [])):
            for target in panel.get("targets", []):
                expr = target.get("expr")
                if not expr:
                    continue
                if resolve:
                    expr = resolve_variables(expr, rate_interval)
                result.append((board["title"], panel.get("title", ""), expr))
    return result


def main(argv: list[str]) -> int:
    for dashboard, panel, expr in dashboard_expressions(resolve="--raw" not in argv):
        print(f"{dashboard} | {panel} | {expr}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
