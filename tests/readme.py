"""The README's examples as the tests run them: each is the fenced code block after a
`<!-- example: NAME -->` marker in README.md, taken from the file at test time (never
copied into a test), so a test breaks when the README's example changes; and the tools
the example tests share: running an example as a script, feeding its input, reading its
output under read_committed, waiting for a consumer group to catch up."""
from __future__ import annotations

import collections
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from typing import Iterable

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
VENV_BIN = pathlib.Path(sys.executable).parent

_BLOCK = re.compile(r"^<!-- example: (?P<name>[\w.-]+)[^>]*-->\n```(?P<lang>[\w-]*)\n(?P<code>.*?)^```$",
                    re.MULTILINE | re.DOTALL)


def examples(path: pathlib.Path = README) -> dict[str, tuple[str, str]]:
    """name -> (language, code) of every marked example of `path`."""
    out = {}
    for m in _BLOCK.finditer(path.read_text()):
        assert m["name"] not in out, f"two examples named {m['name']!r} in {path}"
        out[m["name"]] = (m["lang"], m["code"])
    return out


def example(name: str, path: pathlib.Path = README) -> str:
    """The code of the example `name` of `path` (AssertionError when there is none)."""
    found = examples(path)
    assert name in found, f"no `<!-- example: {name} -->` block in {path}; have {sorted(found)}"
    return found[name][1]


def replace_last_loop(program: str, loop: str) -> str:
    """`program` with its last top-level `while True:` loop (to the end) replaced by
    `loop`: how the README's by-hand variants are run ("in place of the loop above")."""
    cut = program.rindex("\nwhile True:")
    return program[:cut + 1] + loop


class Script:
    """A README example run as a script (`python FILE`, in `cwd`, with `env` added to the
    environment; output to FILE.log); stopped with `kill()` (SIGKILL) or `stop()`."""

    def __init__(self, code: str, cwd: pathlib.Path, env: dict[str, str] | None = None, name: str = "example",
                 python: str = sys.executable):
        self.path = cwd / f"{name}.py"
        self.path.write_text(code)
        self.log = cwd / f"{name}.log"
        self.cwd = cwd
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.python = python
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    def start(self) -> "Script":
        self.runs += 1
        with open(self.log, "ab") as out:
            out.write(f"--- run {self.runs}\n".encode())
            self.proc = subprocess.Popen([self.python, str(self.path)], cwd=self.cwd, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.path.name} still running after {timeout_s} s:\n{self.output()[-3000:]}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the script (and what it started), as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def assert_alive(self) -> None:
        assert self.alive(), f"{self.path.name} exited {self.proc.returncode}:\n{self.output()[-3000:]}"


def produce(bootstrap: str, topic: str, values: Iterable[str], conf: dict | None = None) -> None:
    """Send `values` (keyed by themselves) to `topic` and wait for every acknowledgement."""
    from exactly import Producer
    with Producer({"bootstrap.servers": bootstrap, **(conf or {})}) as p:
        futures = [p.send(topic, v, key=v) for v in values]
        p.flush(60)
        for f in futures:
            f.result(0)


def read_committed(bootstrap: str, topic: str, conf: dict | None = None, timeout_s: float = 60) -> list[str]:
    """Every value of `topic` a read_committed consumer sees, up to the last stable offset
    of each partition."""
    from exactly import AdminClient, Consumer, TopicPartition
    with AdminClient({"bootstrap.servers": bootstrap, **(conf or {})}) as admin:
        parts = sorted(admin.describe_topics([topic])[topic].partitions)
    tps = [TopicPartition(topic, p) for p in parts]
    out: list[str] = []
    with Consumer({"bootstrap.servers": bootstrap, "isolation.level": "read_committed", **(conf or {})}) as c:
        c.assign(tps)
        c.seek_to_beginning(tps)
        end = c.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while any(c.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{topic}: not read to {end} in {timeout_s} s"
            out += [r.value.decode() for r in c.poll(0.5)]
    return out


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.5, script: Script | None = None):
    """Poll `predicate()` until it returns a true value (returned); AssertionError naming
    `what` after `timeout_s`, or as soon as `script` died."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if script is not None:
            script.assert_alive()
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}" + (
            f"\n{script.output()[-3000:]}" if script is not None else "")
        time.sleep(interval_s)


def topic_exists(bootstrap: str, topic: str, conf: dict | None = None) -> bool:
    from exactly import AdminClient
    with AdminClient({"bootstrap.servers": bootstrap, **(conf or {})}) as admin:
        return topic in admin.list_topics()


def assert_exactly_once(got: list[str], expected: Iterable[str], what: str) -> None:
    """Every expected value exactly once in `got`, nothing else."""
    expected = list(expected)
    counts = collections.Counter(got)
    duplicates = {v: n for v, n in counts.items() if n > 1}
    missing = [v for v in expected if v not in counts]
    extra = [v for v in counts if v not in set(expected)]
    assert not duplicates and not missing and not extra, (
        f"{what}: {len(got)} read for {len(expected)} expected; duplicates {len(duplicates)} "
        f"(e.g. {list(duplicates.items())[:3]}), missing {len(missing)} (e.g. {missing[:3]}), extra {extra[:3]}")
