"""`--profile DIR`: py-spy flame graphs (SVG) of the producer (this process), a
partition leader and the transaction coordinator while a transactional producer
commits every 10 ms. The profiled run is an extra one, not among the measured
repetitions."""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys


class PySpy:
    """py-spy record against several pids at once; stop() writes the SVGs."""

    def __init__(self, directory: pathlib.Path, targets: dict[str, int], rate: int = 100, prefix: str = "txn-10ms",
                 fmt: str = "flamegraph"):
        exe = shutil.which("py-spy") or str(pathlib.Path(sys.executable).parent / "py-spy")
        if not os.path.exists(exe):
            raise RuntimeError("py-spy is not installed (pip install -r bench/requirements.txt)")
        directory.mkdir(parents=True, exist_ok=True)
        suffix = {"flamegraph": "svg", "raw": "folded.txt", "speedscope": "speedscope.json"}[fmt]
        self.outputs = {name: directory / f"{prefix}-{name}.{suffix}" for name in targets}
        self.logs = {name: directory / f"{prefix}-{name}.py-spy.log" for name in targets}
        self.procs = {}
        for name, pid in targets.items():
            with open(self.logs[name], "wb") as log:
                self.procs[name] = subprocess.Popen(
                    [exe, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking", "--threads",
                     "--format", fmt, "--output", str(self.outputs[name])],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> dict[str, str]:
        """SIGINT every recorder (py-spy writes its output then) and wait."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        written = {}
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if self.outputs[name].exists():
                written[name] = str(self.outputs[name])
        return written
