"""The code blocks of docs/spark.md run as written against a dev cluster, the transactional
ones checked for exactly-once across a SIGKILL (tests/docs/examples.py)."""
from __future__ import annotations

from docs.examples import page_tests

# Spark starts twice per run of the page.
cluster, test_every_block_of_the_page_runs = page_tests("test_examples_spark", timeout_s=1200)
