"""Helpers of the `exactly` Spark data source tests (fixtures: conftest.py)."""
from __future__ import annotations

import os
import pathlib
import sys
import time
import uuid

from exactly import AdminClient, Consumer, NewTopic, TopicPartition

ROOT = pathlib.Path(__file__).resolve().parents[2]

SPARK_ENV = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
             "SPARK_LOCAL_IP": "127.0.0.1"}


def spark_env() -> dict[str, str]:
    """The environment of a Spark driver process: the venv's Python for workers,
    loopback only, the repository on the path."""
    env = {**os.environ, **SPARK_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def create_topic(bootstrap: str, partitions: int = 3) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions)], timeout=60)
    return name


def sdk_read(bootstrap: str, topic: str, isolation: str, partitions: int = 3, timeout_s: float = 60.0) -> list:
    """Every record of `topic` up to its end (the LSO under read_committed) with the
    SDK consumer: list of ConsumerRecord."""
    c = Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation, "enable.auto.commit": False,
                  "fetch.max.wait.ms": 100})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_end(tps)
        ends = {tp: c.position(tp) for tp in tps}
        c.seek_to_beginning(tps)
        out = []
        deadline = time.monotonic() + timeout_s
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"reading {topic} did not reach its end"
            out.extend(c.poll(0.5))
        return [r for r in out if r.offset < ends[TopicPartition(r.topic, r.partition)]]
    finally:
        c.close()
