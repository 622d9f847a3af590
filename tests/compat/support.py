"""Helpers of the compatibility suite (tests/compat): sizes, topics, and reading a
topic read_committed with the exactly SDK and with kcat."""
from __future__ import annotations

import os
import pathlib
import shutil
import queue
import signal
import subprocess
import threading
import time
import uuid

import pytest

from waiting import wait_for

FULL = os.environ.get("EXACTLY_COMPAT_FULL") == "1"
ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent


def size(short: int, full: int) -> int:
    """`full` under `make compat` (EXACTLY_COMPAT_FULL=1), else `short`."""
    return full if FULL else short


def compat_python(name: str) -> pathlib.Path:
    """The interpreter of the framework's own virtualenv .compat/<name> (created by
    scripts/setup.sh: its pins may clash with the project's)."""
    python = ROOT / ".compat" / name / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: `make setup` (scripts/setup.sh) creates it")
    return python


def new_topic(kc, partitions: int = 3, prefix: str = "c") -> str:
    """A fresh topic with `partitions` partitions, created through the Kafka port
    (confluent-kafka's AdminClient) and led by a partition leader each."""
    from confluent_kafka.admin import AdminClient, NewTopic
    from exactly import AdminClient as XAdmin, errors
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kc.kafka_bootstrap_servers})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)

    def led() -> bool:
        try:
            parts = x.describe_topics([name])[name].partitions
        except errors.UnknownTopicOrPartitionError:
            return False
        return len(parts) == partitions and all(p.leader for p in parts.values())
    with XAdmin({"bootstrap.servers": kc.bootstrap_servers}) as x:
        wait_for(led, 30, f"leaders for {name}")
    return name


def produce_ids(kc, topic: str, count: int, prefix: str = "id-", partitioner: str = "consistent_random") -> list[str]:
    """Send `<prefix>0` .. `<prefix>count-1` (key = value) to `topic` with
    confluent-kafka's plain producer and librdkafka's `partitioner` (murmur2_random:
    the Java client's, which aiokafka and kafka-python share); returns them."""
    from confluent_kafka import Producer
    ids = [f"{prefix}{i}" for i in range(count)]
    p = Producer({"bootstrap.servers": kc.kafka_bootstrap_servers, "linger.ms": 20, "partitioner": partitioner})
    for i in ids:
        p.produce(topic, key=i.encode(), value=i.encode())
        p.poll(0)
    assert p.flush(60) == 0
    return ids


def read_committed_sdk(kc, topic: str, partitions: int = 3) -> list[str]:
    """`topic`'s values as the exactly SDK reads them read_committed, once every
    transaction on it is complete."""
    from integration.test_kafka_clients import read_sdk
    return [v.decode() for v in read_sdk(kc, topic, "read_committed", partitions, timeout_s=60)]


def read_committed_kcat(kc, topic: str, isolation: str = "read_committed") -> list[str]:
    """`topic`'s values as kcat reads them (`kcat -C -X isolation.level=read_committed
    -o beginning -e`, or the given `isolation`), one per line."""
    if shutil.which("kcat") is None:
        pytest.fail("kcat is missing: `make setup` (scripts/setup.sh) installs it")
    read = subprocess.run(["kcat", "-b", kc.kafka_bootstrap_servers, "-C", "-t", topic, "-o", "beginning", "-e",
                           "-q", "-f", "%s\\n", "-X", f"isolation.level={isolation}"],
                          capture_output=True, text=True, timeout=120, check=True)
    return read.stdout.split()


def exactly_once(got: list[str], expected: list[str], what: str) -> None:
    """Assert `got` holds every one of `expected` exactly once (any order), printing
    the figures."""
    duplicates = len(got) - len(set(got))
    missing = len(set(expected) - set(got))
    extra = len(set(got) - set(expected))
    print(f"{what}: {len(got)} records, {len(set(got))} distinct, duplicates {duplicates}, missing {missing}, "
          f"unexpected {extra}")
    assert sorted(got) == sorted(expected), (duplicates, missing, extra)


def start(args: list[str], log: pathlib.Path, pipe_stdout: bool = True, **kw) -> subprocess.Popen:
    """Start `args` with stdout piped (text; with pipe_stdout=False appended to `log`
    too) and stderr appended to `log`: a pipe nobody reads fills up and stalls the
    program."""
    with open(log, "a") as err:
        return subprocess.Popen(args, stdout=subprocess.PIPE if pipe_stdout else err, stderr=err, text=True, **kw)


def run_to_end(proc: subprocess.Popen, timeout: float, log: pathlib.Path | None = None) -> str:
    """Wait up to `timeout` seconds for `proc` to exit; assert exit 0 and return its
    stdout (the tail of `log`, its stderr, in the failure message)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=30)
        raise
    err = log.read_text(errors="replace")[-4000:] if log else ""
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out[-2000:]}\nstderr:\n{err}"
    return out


def kill_after(proc: subprocess.Popen, at_least: int, timeout: float, word: str = "committed") -> int:
    """Read the program's "<word> N" lines until N >= at_least, then SIGKILL it;
    returns the last N seen (the program may have done more since). Fails if that
    takes longer than `timeout` seconds or the program exits first."""
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] and None, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    seen = 0
    try:
        while seen < at_least:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no '{word} {at_least}' within {timeout} s (last seen {seen}, "
                            f"exit code {proc.poll()})")
            if line.startswith(word + " "):
                seen = int(line.split()[1])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        reader.join(30)
        proc.stdout.close()
    return seen


def run_until_copied(args: list[str], log: pathlib.Path, kc, sink: str, expected: list[str], timeout: float,
                     **kw) -> None:
    """Start a program that never exits by itself (a stream processor) and SIGKILL it
    once kcat reads every one of `expected` from `sink` under read_committed (checked
    every 2 s). Fails if it exits first or that takes longer than `timeout` seconds."""
    proc = start(args, log, pipe_stdout=False, **kw)  # nobody reads it: FastStream logs every message there
    try:
        wait_for(lambda: set(expected) <= set(read_committed_kcat(kc, sink)) or proc.poll() is not None,
                 timeout, lambda: f"{pathlib.Path(args[1]).name} to copy every id (log: {log.read_text()[-3000:]})",
                 interval_s=2)
        assert proc.poll() is None, f"{args[1]} exited: {log.read_text()[-3000:]}"
    finally:
        proc.kill()
        proc.communicate(timeout=30)
