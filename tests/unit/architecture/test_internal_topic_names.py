"""Each internal topic's name is spelled once in services/: in
services/common/protocol.py, which every other module reads it from (code, log
messages, metric help and docstrings name the constant)."""
from __future__ import annotations

from exactly_tools import design_docs
from services.common import protocol

ROOT = design_docs.ROOT


def spelled(name: str) -> list[str]:
    """`path:line` of every line of services/ that spells `name`."""
    return [f"{path.relative_to(ROOT)}:{i}" for path in sorted((ROOT / "services").rglob("*.py"))
            if "__pycache__" not in path.parts
            for i, line in enumerate(path.read_text().splitlines(), 1) if name in line]


def test_each_internal_topic_name_is_spelled_once_in_services():
    for name in (protocol.TRANSACTION_STATE_TOPIC, protocol.CONSUMER_OFFSETS_TOPIC):
        assert spelled(name) == [f"services/common/protocol.py:{_line_of(name)}"], name
    assert set(protocol.INTERNAL_TOPIC_FOR_KIND.values()) == {"__transaction_state", "__consumer_offsets"}


def _line_of(name: str) -> int:
    return next(i for i, line in enumerate((ROOT / "services/common/protocol.py").read_text().splitlines(), 1)
                if f'"{name}"' in line)
