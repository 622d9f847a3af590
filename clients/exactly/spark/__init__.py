"""`exactly.spark`: the `exactly` PySpark data source (Python Data Source API,
pyspark >= 4.0; install with the `spark` extra).

    from exactly.spark import ExactlyDataSource
    spark.dataSource.register(ExactlyDataSource)

Batch and streaming reads of topics (read_committed by default), and an
exactly-once streaming sink built on two-phase commit
(`Producer.prepare_transaction` / `exactly.complete_transaction`). Options and the
guarantee: docs/spark.md; design: `datasource`.

Spark runs the data source in Python worker processes of its own, started with
`PYSPARK_PYTHON` (PySpark's default: `python3` on the PATH, often an interpreter without
`exactly`, which then fails with ModuleNotFoundError). Importing `exactly.spark` sets
`PYSPARK_PYTHON` to this interpreter unless the application set it (`workers_python`);
a SparkContext made before the import keeps the interpreter it was made with, and when that
one cannot import `exactly` the import warns how to fix it (`check_workers_python`).
"""
import os as _os
import sys as _sys

from ._options import OptionError
from ._workers import check_workers_python, workers_python
from .datasource import ExactlyCommitMessage, ExactlyDataSource, InjectedTaskFailure

_os.environ.setdefault("PYSPARK_PYTHON", workers_python())
check_workers_python()

__all__ = ["ExactlyDataSource", "ExactlyCommitMessage", "OptionError", "InjectedTaskFailure",
           "check_workers_python", "workers_python"]
