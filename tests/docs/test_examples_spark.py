"""The code blocks of docs/spark.md run as written against a dev cluster, the transactional
ones checked for exactly-once across a SIGKILL (tests/docs/examples.py)."""
from __future__ import annotations

from docs.examples import page_tests

# Spark starts twice per run of the page. Its first run runs 20 ms between two looks, not 2 ms:
# stopped (SIGSTOP) most of the time, Spark's JVM gave up on a Python worker that had not
# connected back within its 10 s of wall time ("Python worker failed to connect back"), and a
# micro-batch takes far longer than 20 ms, so a look still falls inside its transaction.
cluster, test_every_block_of_the_page_runs = page_tests("test_examples_spark", timeout_s=1200, run_slice_s=0.02)
