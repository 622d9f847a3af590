"""`exactly-dev` and `exactly` as a newcomer runs them, in a fresh directory, with the
virtualenv's bin directory on PATH and no EXACTLY_BOOTSTRAP_SERVER: `exactly-dev up`
without --dir makes the cluster in .run/dev and says what it does step by step, writes
client.properties, and `exactly` finds the cluster there by itself. Then the console tools
as a person uses them: `consume --max-records` with fewer records ends after --timeout-ms,
Ctrl-C on `consume` is a normal stop with the count, interactive `produce` prompts. (The
documented blocks of getting-started.md and operating/cli.md run in tests/docs.)"""
from __future__ import annotations

import json
import os
import pathlib
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

VENV_BIN = pathlib.Path(sys.executable).parent


def shell_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("EXACTLY_BOOTSTRAP_SERVER", "EXACTLY_DEV_DIR", "EXACTLY_DEBUG")}
    return {**env, "PATH": f"{VENV_BIN}:{env.get('PATH', '')}", **extra}


def bash(script: str, cwd: pathlib.Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """Run `script` with bash -euo pipefail (every command must succeed), echoing each
    command (-x) on stderr."""
    return subprocess.run(["bash", "-euxo", "pipefail", "-c", script], cwd=cwd, env=shell_env(**env),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def newcomer(tmp_path):
    """A fresh directory whose dev cluster (.run/dev) is stopped afterwards."""
    yield tmp_path
    if (tmp_path / ".run" / "dev" / "cluster.json").exists():
        subprocess.run([str(VENV_BIN / "exactly-dev"), "down"], cwd=tmp_path, env=shell_env(), timeout=120,
                       capture_output=True)


def test_dev_cluster_without_dir_says_each_step_and_exactly_finds_it(newcomer):
    up = subprocess.run([str(VENV_BIN / "exactly-dev"), "up"], cwd=newcomer, env=shell_env(), capture_output=True,
                        text=True, timeout=300)
    assert up.returncode == 0, up.stderr[-4000:]
    steps = up.stderr.splitlines()
    assert steps[0] == "Starting ZooKeeper ...", steps
    assert any(line.startswith("  ZooKeeper serving on 127.0.0.1:") for line in steps), steps
    for name in ("pl-0", "pl-1", "pl-2", "txn-0", "group-0"):
        assert any(line.startswith(f"  {name} serving on 127.0.0.1:") for line in steps), steps
    assert steps[-1].startswith("Up in "), steps
    cluster = json.loads((newcomer / ".run" / "dev" / "cluster.json").read_text())
    bootstrap = cluster["bootstrap_servers"]
    assert "Dev cluster serving in .run/dev" in up.stdout
    assert f"export EXACTLY_BOOTSTRAP_SERVER={bootstrap}" in up.stdout
    assert f"bootstrap.servers={bootstrap}" in (newcomer / ".run" / "dev" / "client.properties").read_text()
    env = bash("exactly-dev env", newcomer)
    assert env.stdout == f"export EXACTLY_BOOTSTRAP_SERVER={bootstrap}\n", env
    # exactly without --bootstrap-server or the variable: the cluster in .run/dev.
    made = bash("exactly topics create --topic found && exactly topics list && exactly-dev status", newcomer)
    assert made.returncode == 0 and "Created topic found." in made.stdout and "txn-0" in made.stdout, made
    # Elsewhere, EXACTLY_DEV_DIR names it.
    elsewhere = newcomer / "elsewhere"
    elsewhere.mkdir()
    listed = bash("exactly topics list", elsewhere, EXACTLY_DEV_DIR=str(newcomer / ".run" / "dev"))
    assert listed.returncode == 0 and "found" in listed.stdout, listed


def _cluster(newcomer) -> str:
    up = subprocess.run([str(VENV_BIN / "exactly-dev"), "up", "--partition-leaders", "1", "--json"], cwd=newcomer,
                        env=shell_env(), capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr
    return json.loads(up.stdout)["bootstrap_servers"]     # --json: cluster.json on stdout, progress on stderr


def test_console_consumer_and_producer_as_a_person_uses_them(newcomer):
    _cluster(newcomer)
    exactly = str(VENV_BIN / "exactly")
    env = shell_env()
    run = dict(cwd=newcomer, env=env, capture_output=True, text=True, timeout=120)
    assert subprocess.run([exactly, "topics", "create", "--topic", "few"], **run).returncode == 0
    assert subprocess.run([exactly, "produce", "few"], input="a\nb\n", **run).returncode == 0

    # --max-records 10 with two records: ends --timeout-ms after the last one.
    started = time.monotonic()
    res = subprocess.run([exactly, "consume", "few", "--from-beginning", "--max-records", "10", "--timeout-ms",
                          "3000"], **run)
    assert res.returncode == 0 and res.stdout.splitlines() == ["a", "b"], res
    assert "Processed a total of 2 records." in res.stderr and time.monotonic() - started < 60

    # Ctrl-C: a normal stop with the count, not an error.
    proc = subprocess.Popen([exactly, "consume", "few", "--from-beginning"], cwd=newcomer, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "a\n" and proc.stdout.readline() == "b\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (proc.returncode, err)
    assert "Processed a total of 2 records." in err and "error" not in err, err

    # Interactive produce: a '>' prompt for each line, as kafka-console-producer.
    main, child = pty.openpty()
    proc = subprocess.Popen([exactly, "produce", "few"], cwd=newcomer, env=env, stdin=child, stdout=child,
                            stderr=child, close_fds=True)
    os.close(child)
    seen = _read_until(main, b">", 60)
    os.write(main, b"typed\n")
    seen += _read_until(main, b">", 30)
    os.write(main, b"\x04")                                  # Ctrl-D: end of input
    seen += _read_until(main, b"Produced 1 records to few.", 60)
    assert proc.wait(timeout=60) == 0, seen
    os.close(main)
    res = subprocess.run([exactly, "consume", "few", "--from-beginning", "--max-records", "3"], **run)
    assert res.stdout.splitlines() == ["a", "b", "typed"], res


def _read_until(fd: int, wanted: bytes, timeout_s: float) -> bytes:
    deadline = time.monotonic() + timeout_s
    got = b""
    while wanted not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"no {wanted!r} in {got!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
    assert wanted in got, got
    return got
