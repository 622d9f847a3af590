"""The chart's `helm test` script (deploy/helm/exactly/files/round_trip.py) against a dev
cluster of real processes: the same transactional round trip the hook pod runs."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "helm" / "exactly" / "files" / "round_trip.py"


@pytest.mark.integration
def test_round_trip_script_passes_against_a_dev_cluster(cluster):
    env = {**os.environ, "EXACTLY_BOOTSTRAP_SERVERS": cluster.bootstrap_servers,
           "EXACTLY_TEST_RECORDS": "12", "EXACTLY_TEST_TIMEOUT_S": "90"}
    out = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK: transactional round trip" in out.stdout


def test_round_trip_script_needs_a_bootstrap_address():
    env = {k: v for k, v in os.environ.items() if k != "EXACTLY_BOOTSTRAP_SERVERS"}
    out = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "EXACTLY_BOOTSTRAP_SERVERS" in out.stderr
