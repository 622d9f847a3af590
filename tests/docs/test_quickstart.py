"""The README's quick start, run from a fresh clone exactly as written: its commands are
read from README.md (section "Quick start", tests/docs/codeblocks.py), run in order in one
shell in a `git clone` of this repository, and must end with the committed transactional
copy within QUICKSTART_LIMIT_S of wall time, setup included. The output shown under each
command must be what it printed (`...` stands for any text)."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import time

from docs.codeblocks import ROOT, Block, section

QUICKSTART_LIMIT_S = 300.0
_MARK = "@@quickstart-block@@"


def script(blocks: list[Block], clone: pathlib.Path) -> str:
    """One bash script of the quick start's commands, writing its files where they appear
    and printing `_MARK N` before the commands of the Nth block."""
    lines = []
    for n, block in enumerate(blocks):
        if block.kind == "file":
            (clone / block.title).write_text(block.text)
        elif block.kind == "bash":
            lines += [f"echo '{_MARK} {n}'", block.text]
        else:
            assert block.kind == "text", f"{block.id}: the quick start runs python files, bash and shows text"
    return "\n".join(lines) + "\n"


def outputs(stdout: str) -> dict[int, str]:
    """What each block printed, by its index (`script`'s marks)."""
    out, current = {}, None
    for line in stdout.splitlines(keepends=True):
        m = re.match(rf"{_MARK} (\d+)$", line.rstrip("\n"))
        if m:
            current = int(m.group(1))
            out[current] = ""
        elif current is not None:
            out[current] += line
    return out


def expected_lines_missing(expected: str, printed: str) -> list[str]:
    """The lines of `expected` (`...`: any text) that no line of `printed` matches, in order."""
    missing, lines = [], printed.splitlines()
    for want in expected.splitlines():
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("...")) + r"\s*$")
        found = next((i for i, line in enumerate(lines) if pattern.match(line)), None)
        if found is None:
            missing.append(want)
        else:
            lines = lines[found + 1:]
    return missing


def test_quick_start_from_a_fresh_clone(tmp_path):
    blocks = section("README.md", "Quick start")
    started = time.monotonic()
    clone = tmp_path / "exactly"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EXACTLY_", "VIRTUAL_ENV", "PYTHON"))}
    try:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script(blocks, clone)], cwd=clone, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=QUICKSTART_LIMIT_S + 60)
        elapsed = time.monotonic() - started
    finally:
        if (clone / ".run" / "dev" / "cluster.json").exists():
            subprocess.run([str(clone / ".venv" / "bin" / "exactly-dev"), "down", "--dir", ".run/dev"], cwd=clone,
                           capture_output=True, timeout=120)
    print(f"quick start: {elapsed:.0f} s from git clone to the copy read back")
    logs = "".join(f"\n--- {log.name}\n" + log.read_text()[-1500:]
                   for log in sorted((clone / ".run" / "dev" / "logs").glob("*.log")))
    assert proc.returncode == 0, proc.stdout[-6000:] + logs
    printed = outputs(proc.stdout)
    for n, block in enumerate(blocks):
        if block.kind == "text":
            ran = max(i for i in printed if i < n)
            missing = expected_lines_missing(block.text, printed[ran])
            assert not missing, f"{block.id}: the quick start shows {missing}, the command printed:\n{printed[ran]}"
    assert re.search(r"^copied 1000 records in \d+ transactions$", proc.stdout, re.M), proc.stdout
    assert elapsed < QUICKSTART_LIMIT_S, f"the quick start took {elapsed:.0f} s"


def test_expected_output_matching():
    assert expected_lines_missing("copied 1000 records in ... transactions", "x\ncopied 1000 records in 3 transactions\n") == []
    assert expected_lines_missing("a\nb", "b\na\n") == ["b"]
    assert expected_lines_missing("1000", "999\n") == ["1000"]
