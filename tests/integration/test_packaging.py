"""`pip install .` installs the SDK with only what a client needs: the services,
Kubernetes, Spark and demo dependencies are extras (pyproject.toml)."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVER_ONLY = {"kazoo", "rocksdict", "kubernetes", "tqdm", "pyspark", "pyarrow", "prometheus-client",
               "grpcio-health-checking", "psycopg", "psycopg-binary", "uvloop"}

pytestmark = pytest.mark.integration


def test_pip_install_of_the_sdk_pulls_no_server_dependencies(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(ROOT)], check=True, timeout=600,
                   capture_output=True)
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], check=True, timeout=120,
                            capture_output=True, text=True).stdout
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(listed)}
    # The distribution is exactly-log (PyPI's `exactly` is another project); the import name is exactly.
    assert "exactly-log" in installed and "exactly" not in installed
    assert {"grpcio", "protobuf", "cramjam"} <= installed
    assert installed & SERVER_ONLY == set()
    # The SDK works without them: configuration is validated, errors are typed.
    probe = ("from exactly import Producer, errors\n"
             "try:\n    Producer({'bootstrap.servers': '127.0.0.1:1', 'group.id': 'g'})\n"
             "except errors.ConfigurationError as e:\n    print(e.key)\n")
    out = subprocess.run([str(py), "-c", probe], check=True, timeout=120, capture_output=True, text=True,
                         cwd=tmp_path).stdout
    assert out.strip() == "group.id"
    # The `exactly` command line ships with the SDK and runs without the server extras.
    cli = subprocess.run([str(venv / "bin" / "exactly"), "topics", "list", "--bootstrap-server", "127.0.0.1:1"], timeout=120, capture_output=True, text=True, cwd=tmp_path)
    assert cli.returncode != 0 and "Traceback" not in cli.stderr and "cannot reach the cluster" in cli.stderr
    version = subprocess.run([str(venv / "bin" / "exactly"), "--version"], timeout=120, capture_output=True,
                             text=True, cwd=tmp_path)
    release = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version.returncode == 0 and version.stdout.strip() == f"exactly, version {release}", version
