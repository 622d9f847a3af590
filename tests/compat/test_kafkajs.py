"""KafkaJS 2.2.4, unmodified (tests/compat/kafkajs_eos.js, npm-installed at test time):
its exactly-once consume-transform-produce copier (transactionalId, idempotent,
sendOffsets) copies unique ids from a 3-partition topic to another while it is
SIGKILLed twice and restarted with the same transactionalId; read_committed — by
KafkaJS and by kcat — holds every id exactly once. KafkaJS takes the first broker's
ApiVersions for every broker, which the one Kafka API surface of every port allows
(tests/integration/test_kafka_surface.py)."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import uuid

import pytest

from .support import HERE, exactly_once, kill_after, read_committed_kcat, read_committed_sdk, run_to_end, size, start

pytestmark = pytest.mark.integration

KAFKAJS = "2.2.4"
SCRIPT = HERE / "kafkajs_eos.js"


@pytest.fixture(scope="module")
def kafkajs(tmp_path_factory) -> pathlib.Path:
    """A directory with node_modules/kafkajs at 2.2.4, installed with npm once and
    kept next to pytest's temporary directories."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are needed for the KafkaJS test")
    cache = tmp_path_factory.getbasetemp().parent / f"kafkajs-{KAFKAJS}"
    if not (cache / "node_modules" / "kafkajs" / "package.json").exists():
        staging = tmp_path_factory.mktemp("kafkajs-install")
        result = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--no-save",
                                 f"kafkajs@{KAFKAJS}"], cwd=staging, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            pytest.skip(f"npm could not install kafkajs@{KAFKAJS} (registry unreachable?): "
                        f"{result.stderr.strip()[-300:]}")
        try:
            os.rename(staging, cache)
        except OSError:  # installed meanwhile by another run
            pass
    version = subprocess.run(["node", "-p", "require('kafkajs/package.json').version"], cwd=cache,
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version == KAFKAJS
    return cache


def node(kafkajs: pathlib.Path, log: pathlib.Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "NODE_PATH": str(kafkajs / "node_modules"), "KAFKAJS_NO_PARTITIONER_WARNING": "1"}
    return start(["node", str(SCRIPT), *args], log, env=env)


@pytest.mark.timeout(size(600, 1800))
def test_kafkajs_exactly_once_copy_through_two_sigkills(kc, kafkajs, tmp_path):
    """5,000 ids under `make compat` (600 in `make test`); the copier is SIGKILLed
    once a third of the ids it copied are committed, restarted, and SIGKILLed again
    after another third; the third run copies the rest. The output, read
    read_committed by KafkaJS and by kcat, holds every id exactly once."""
    count = size(600, 5000)
    suffix = uuid.uuid4().hex[:8]
    source, sink = f"kjs-in-{suffix}", f"kjs-out-{suffix}"
    brokers = kc.kafka_bootstrap_servers
    log = tmp_path / "kafkajs.log"
    print(run_to_end(node(kafkajs, log, "setup", brokers, source, sink, str(count)), 180, log).strip())
    copy_args = ("copy", brokers, source, sink, f"kjs-group-{suffix}", f"kjs-copier-{suffix}")
    for run in (1, 2):
        committed = kill_after(node(kafkajs, log, *copy_args), count // 3, 300)
        print(f"run {run}: SIGKILLed the copier after it printed committed {committed}")
        assert committed >= count // 3
    out = run_to_end(node(kafkajs, log, *copy_args), 600, log)
    assert "copied everything" in out
    expected = [f"id-{i}" for i in range(count)]
    by_kafkajs = run_to_end(node(kafkajs, log, "read", brokers, sink, str(count)), 180, log).split()
    exactly_once(by_kafkajs, expected, "KafkaJS read_committed")
    exactly_once(read_committed_kcat(kc, sink), expected, "kcat read_committed")
    exactly_once(read_committed_sdk(kc, sink), expected, "exactly SDK read_committed")
