"""Generate the configuration tables of the documentation from the schemas (and the
Kafka API tables from the API surface, exactly_tools.kafka_api_docs).

    python -m exactly_tools.config_docs [--check] [FILE ...]

Each table sits between `<!-- config-table: NAME -->` and `<!-- /config-table -->`
(in docs/reference/configuration.md), NAME being a key of `TABLES`; the text between the
markers is replaced by `exactly_wire.config.markdown_table` of that role's schema, or for
`topic` by the topic-config schema's table (services.common.topic_config). The files are
README.md and every page under docs/ unless given. `--check` changes nothing and exits 1
when a file differs from the schemas (drift).
"""
from __future__ import annotations

import argparse
import functools
import pathlib
import re
import sys
from typing import Callable

from exactly.config import AdminSchema, ConsumerSchema, ProducerSchema
from exactly_wire.config import ConfigSchema, markdown_table
from services.common import topic_config
from services.common.settings import GroupCoordinatorSchema, PartitionLeaderSchema, TxnCoordinatorSchema

from . import kafka_api_docs
from .generated_docs import DOCS, documents, regenerate

# The page that holds the tables.
PAGE = DOCS / "reference" / "configuration.md"

SCHEMAS: dict[str, type[ConfigSchema]] = {
    "producer": ProducerSchema,
    "consumer": ConsumerSchema,
    "admin": AdminSchema,
    "partition_leader": PartitionLeaderSchema,
    "txn_coordinator": TxnCoordinatorSchema,
    "group_coordinator": GroupCoordinatorSchema,
}
# Block name -> its table, in the order of docs/reference/configuration.md: the roles' schemas,
# then the topic configs.
TABLES: dict[str, Callable[[], str]] = {
    **{role: functools.partial(markdown_table, schema) for role, schema in SCHEMAS.items()},
    "topic": topic_config.markdown_table,
}

_BLOCK = re.compile(r"(<!-- config-table: (\w+) -->\n)(.*?)(<!-- /config-table -->)", re.S)


def render(text: str) -> str:
    """`text` with every config-table block regenerated, and the Kafka API tables
    (exactly_tools.kafka_api_docs). Raises KeyError for a block naming no known table."""
    text = _BLOCK.sub(lambda m: m.group(1) + TABLES[m.group(2)]() + "\n" + m.group(4), text)
    return kafka_api_docs.render(text)


def blocks(text: str) -> list[str]:
    """The role names of the config-table blocks in `text`, in order."""
    return [m.group(2) for m in _BLOCK.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exactly_tools.config_docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=pathlib.Path, help="default: README.md and docs/**/*.md")
    parser.add_argument("--check", action="store_true", help="exit 1 when a file's tables are out of date")
    args = parser.parse_args(argv)
    return regenerate(args.files or documents(), render, args.check,
                      "configuration or Kafka API tables differ from the code; run python -m exactly_tools.config_docs",
                      lambda texts: f"{sum(len(blocks(t)) for t in texts)} configuration tables, "
                                    f"{sum(len(kafka_api_docs.blocks(t)) for t in texts)} Kafka API tables")


if __name__ == "__main__":
    sys.exit(main())
