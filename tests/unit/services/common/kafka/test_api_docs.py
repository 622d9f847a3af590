"""The Kafka API tables of docs/reference/kafka-api.md are the surface (exactly_tools.kafka_api_docs): every
key served, at the versions advertised, and every other key Kafka defines with the
reason it is not served."""
from __future__ import annotations

import re

from kio.schema.index import api_key_map

from exactly_tools import kafka_api_docs
from services.common.kafka import surface

PAGE = kafka_api_docs.PAGE
_ROW = re.compile(r"^\| (\w+) \((\d+)\) \| ([^|]+) \|", re.M)


def _rows(text: str, name: str) -> dict[int, str]:
    block = text.split(f"<!-- kafka-api-table: {name} -->", 1)[1].split("<!-- /kafka-api-table -->", 1)[0]
    return {int(key): rest.strip() for _, key, rest in _ROW.findall(block)}


def test_the_tables_are_generated_from_the_surface():
    text = PAGE.read_text()
    assert kafka_api_docs.blocks(text) == ["served", "not-served"]
    assert kafka_api_docs.render(text) == text, "run: python -m exactly_tools.config_docs"


def test_every_served_key_is_listed_with_its_versions():
    served = _rows(PAGE.read_text(), "served")
    for key, s in surface.SURFACE.items():
        want = str(s.min_version) if s.min_version == s.max_version else f"{s.min_version}-{s.max_version}"
        assert served.get(key) == want, (key, served.get(key), want)
    assert set(served) == set(surface.SURFACE) | {17, 18, 36}


def test_every_other_kafka_key_says_why_it_is_not_served():
    text = PAGE.read_text()
    served, not_served = _rows(text, "served"), _rows(text, "not-served")
    assert set(served) | set(not_served) == set(api_key_map) and not set(served) & set(not_served)
    assert set(not_served) == set(kafka_api_docs.NOT_SERVED), set(not_served) ^ set(kafka_api_docs.NOT_SERVED)
