"""The code blocks of docs/sdk.md and docs/testing.md run as written against a dev cluster, the transactional
ones checked for exactly-once across a SIGKILL (tests/docs/examples.py)."""
from __future__ import annotations

import pytest

from docs.codeblocks import parse, section
from docs.examples import environment, page_tests, run_across_a_crash, workdir

cluster, test_every_block_of_the_page_runs = page_tests("test_examples_sdk")


# A copier whose transactions commit no input offsets (an earlier form of the guide's
# `with producer.transaction()` block): what it committed before a crash is copied again.
DUPLICATING = '''```python
import os

from exactly import Consumer, Producer

bootstrap = os.environ["EXACTLY_BOOTSTRAP_SERVER"]
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "billing",
                     "isolation.level": "read_committed", "enable.auto.commit": False,
                     "auto.offset.reset": "earliest"})
consumer.subscribe(["purchases"])
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "billing-0"})
producer.init_transactions()
while True:
    records = consumer.poll(timeout=1.0)
    if records:
        with producer.transaction():
            for r in records:
                producer.send("invoices", r.value, key=r.key)
```
'''


def test_the_check_fails_an_example_that_duplicates_across_a_crash(cluster, tmp_path):
    block = parse(DUPLICATING, "duplicating.md")[0]
    assert block.transactional
    with pytest.raises(AssertionError, match="not each input exactly once"):
        run_across_a_crash(block, workdir(tmp_path, cluster), environment(cluster), cluster)


def test_the_quick_starts_copy_is_exactly_once_across_a_crash(cluster, tmp_path):
    """The README's quick start runs its copy once (tests/docs/test_quickstart.py); here it
    runs as every transactional example does, killed inside a transaction and run again."""
    (copy,) = [b for b in section("README.md", "Quick start") if b.kind == "file"]
    assert copy.transactional
    print(run_across_a_crash(copy, workdir(tmp_path, cluster), environment(cluster), cluster))
