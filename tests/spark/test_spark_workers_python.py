"""The `exactly` data source runs as a user writes it, without PYSPARK_PYTHON and with a
`python3` on the PATH that cannot import `exactly` (a virtualenv's python run by its path,
not activated): Spark's Python workers would start that `python3` and fail with
ModuleNotFoundError; importing exactly.spark points them at the driver's interpreter. A
session made before the import keeps its workers' interpreter, and the import warns how to
fix it."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from spark_helpers import create_topic

from exactly import Producer

pytestmark = pytest.mark.integration

READ = '''
import os
from pyspark.sql import SparkSession
from exactly.spark import ExactlyDataSource

spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
spark.dataSource.register(ExactlyDataSource)
n = spark.read.format("exactly").option("bootstrap.servers", os.environ["EXACTLY_BOOTSTRAP_SERVER"]) \\
    .option("subscribe", os.environ["TOPIC"]).load().count()
print(f"read {n}")
spark.stop()
'''

SESSION_FIRST = '''
import warnings
from pyspark.sql import SparkSession

spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    import exactly.spark  # noqa: F401
print("warned:", [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)])
spark.stop()
'''


def user_environment(**extra: str) -> dict[str, str]:
    """The environment of a user who runs .venv/bin/python without activating the
    virtualenv: no PYSPARK_PYTHON, and a PATH without the virtualenv's bin directory."""
    venv_bin = str(pathlib.Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                                                             "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    return {**env, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1", **extra}


def test_the_data_source_runs_without_pyspark_python(spark_cluster, tmp_path):
    env = user_environment()
    probe = subprocess.run(["python3", "-c", "import exactly"], env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0, "the test needs a python3 on the PATH that cannot import exactly"
    topic = create_topic(spark_cluster.bootstrap_servers)
    with Producer({"bootstrap.servers": spark_cluster.bootstrap_servers}) as p:
        for i in range(10):
            p.send(topic, f"v{i}", key=f"k{i}")
    script = tmp_path / "read.py"
    script.write_text(READ)
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**env, "EXACTLY_BOOTSTRAP_SERVER": spark_cluster.bootstrap_servers, "TOPIC": topic})
    assert res.returncode == 0, res.stderr[-4000:]
    assert "read 10" in res.stdout.splitlines()


def test_a_session_made_before_the_import_gets_a_warning_saying_what_to_set(tmp_path):
    script = tmp_path / "session_first.py"
    script.write_text(SESSION_FIRST)
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env=user_environment())
    assert res.returncode == 0, res.stderr[-4000:]
    warned = [line for line in res.stdout.splitlines() if line.startswith("warned:")]
    assert warned and "cannot import exactly" in warned[0] and f"PYSPARK_PYTHON={sys.executable}" in warned[0], \
        res.stdout
