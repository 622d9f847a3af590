"""The Python interpreter of Spark's Python workers, which run the `exactly` data source
and so must import `exactly` (exactly.spark sets PYSPARK_PYTHON to it; module docstring
of exactly.spark)."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings


def workers_python() -> str:
    """The interpreter Spark's Python workers should run: PYSPARK_PYTHON when set, else
    this one (sys.executable), which imports `exactly`."""
    return os.environ.get("PYSPARK_PYTHON") or sys.executable


def workers_problem(python: str, timeout_s: float = 60.0) -> str | None:
    """Why `python` cannot run the data source's workers (it does not start, or cannot
    import `exactly`), or None when it can; `sys.executable` always can."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return None
    try:
        probe = subprocess.run([python, "-c", "import exactly.spark._options"], capture_output=True, text=True,
                               timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} does not run: {exc}"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{python} cannot import exactly ({last})"
    return None


def check_workers_python() -> str | None:
    """When a SparkContext is already active, whether its Python workers' interpreter
    imports `exactly`: a RuntimeWarning saying how to fix it when not (PYSPARK_PYTHON set
    before the session is made). Returns the problem, or None (no context, or none)."""
    sc_module = sys.modules.get("pyspark.context") or sys.modules.get("pyspark")
    context = getattr(getattr(sc_module, "SparkContext", None), "_active_spark_context", None)
    if context is None:
        return None
    problem = workers_problem(getattr(context, "pythonExec", None) or "python3")
    if problem is not None:
        warnings.warn(f"Spark's Python workers run {problem}: the exactly data source fails in them. Set "
                      f"PYSPARK_PYTHON={sys.executable} before the SparkSession is made (importing exactly.spark "
                      "first does it).", RuntimeWarning, stacklevel=3)
    return problem


__all__ = ["workers_python", "workers_problem", "check_workers_python"]
