"""Generate the metrics reference (docs/reference/metrics.md) from the series the services
register with prometheus-client.

    python -m exactly_tools.metrics_docs [--check]

The table sits between `<!-- metrics-table -->` and `<!-- /metrics-table -->`: one row per
series family declared at module level in `MODULES` (counters, gauges and histograms, and the
collectors that read service state at scrape time, asked for their families with nothing
tracked), with its type, labels and help text, sorted by name. `--check` changes nothing and
exits 1 when the page differs (a series added, renamed or documented differently).
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys

from prometheus_client.metrics import MetricWrapperBase

from services.common.metrics import LoopCollector
from services.partition_leader.metrics import ClusterCollector

from .generated_docs import DOCS, regenerate

PAGE = DOCS / "reference" / "metrics.md"
# The modules that declare the services' series (every role imports services.common.metrics).
MODULES = ("services.common.metrics", "services.partition_leader.metrics", "services.partition_leader.cleaner",
           "services.txn_coordinator.metrics", "services.group_coordinator.metrics")
_BLOCK = re.compile(r"(<!-- metrics-table -->\n)(.*?)(<!-- /metrics-table -->)", re.S)
_SUFFIX = {"counter": "_total"}


def series() -> list[tuple[str, str, tuple[str, ...], str, str]]:
    """(name as scraped, type, label names, help, declaring module) of every series family
    declared at module level in `MODULES`, sorted by name. Counters carry `_total`, as
    Prometheus scrapes them."""
    rows = {}
    for module_name in MODULES:
        for value in vars(importlib.import_module(module_name)).values():
            value = getattr(value, "_gauge", value)  # a wrapper holding its gauge
            if isinstance(value, MetricWrapperBase):
                families = [(f, tuple(value._labelnames)) for f in value.describe()]  # noqa: SLF001
            elif isinstance(value, (LoopCollector, ClusterCollector)):
                made = value.families([]) if isinstance(value, LoopCollector) else value.families()
                families = [(f, tuple(getattr(f, "_labelnames", ()))) for f in made]
            else:
                continue
            for family, labels in families:
                name = family.name + _SUFFIX.get(family.type, "")
                rows[name] = (name, family.type, labels, " ".join(family.documentation.split()), module_name)
    return [rows[k] for k in sorted(rows)]


def table() -> str:
    rows = ["| series | type | labels | what it is | declared in |", "|---|---|---|---|---|"]
    for name, kind, labels, doc, module in series():
        rows.append(f"| `{name}` | {kind} | {', '.join(f'`{x}`' for x in labels)} | {doc.replace('|', '/')} | "
                    f"`{module}` |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """`text` with its metrics table regenerated (where its markers are)."""
    return _BLOCK.sub(lambda m: m.group(1) + table() + m.group(3), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exactly_tools.metrics_docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    args = parser.parse_args(argv)
    if "<!-- metrics-table -->" not in PAGE.read_text():
        raise ValueError(f"{PAGE} lacks the <!-- metrics-table --> markers")
    return regenerate([PAGE], render, args.check,
                      "metrics table differs from the services' series; run python -m exactly_tools.metrics_docs",
                      lambda texts: f"{len(series())} series families")


if __name__ == "__main__":
    sys.exit(main())
