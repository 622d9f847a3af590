"""`exactly.spark`: the `exactly` PySpark data source (Python Data Source API,
pyspark >= 4.0; install with the `spark` extra).

    from exactly.spark import ExactlyDataSource
    spark.dataSource.register(ExactlyDataSource)

Batch and streaming reads of topics (read_committed by default), and an
exactly-once streaming sink built on two-phase commit
(`Producer.prepare_transaction` / `exactly.complete_transaction`). Options and the
guarantee: docs/spark.md; design: `datasource`.
"""
from ._options import OptionError
from .datasource import ExactlyCommitMessage, ExactlyDataSource, InjectedTaskFailure

__all__ = ["ExactlyDataSource", "ExactlyCommitMessage", "OptionError", "InjectedTaskFailure"]
