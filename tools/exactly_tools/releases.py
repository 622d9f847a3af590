"""An earlier commit of Exactly installed beside the working tree: for the upgrade tests
(tests/system/test_rolling_upgrade.py), whose services run from a virtualenv of their own
while the others run the current code (exactly_tools.devcluster, Service.python), and for
the side-by-side benchmark (`python -m bench.server_cost --against COMMIT`), whose
clusters and clients of that commit run from it.

`install(commit)` extracts the commit's tree with `git archive` into
`.run/releases/<commit>/src` (the repository's gitignored run directory), generates its gRPC
modules (scripts/gen_protos.sh of that tree, with this interpreter's grpcio-tools), makes a
virtualenv `.run/releases/<commit>/venv` and `pip install`s the tree's wheel into it. The third-party
packages are the ones of this environment (a `.pth` file puts its site-packages after the
virtualenv's own; its `.pth` files, the editable install of the working tree among them,
are not processed there), so the install needs no network and the two versions differ
only in Exactly's own code. A second call finds the install complete (a marker written
last) and returns at once; concurrent calls (test workers) wait on a file lock.
"""
from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

# The working tree of an editable install (tools/exactly_tools/releases.py).
ROOT = pathlib.Path(__file__).resolve().parents[2]


class ReleaseInstallError(RuntimeError):
    """The release could not be installed (git, the gRPC code generation, venv or pip failed)."""


@dataclass(frozen=True)
class Release:
    """An installed release: its commit, source tree and interpreter."""

    commit: str
    src: pathlib.Path
    python: pathlib.Path


def _run(cmd: list[str], what: str, timeout_s: float = 600.0, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=timeout_s, **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise ReleaseInstallError(f"{what}: no answer within {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        raise ReleaseInstallError(f"{what} failed ({done.returncode}): "
                                  f"{done.stderr.decode(errors='replace')[-2000:]}")
    return done


def install(commit: str, root: pathlib.Path = ROOT) -> Release:
    """The release of `commit` (any name git resolves; a commit of this repository's
    history), installed under `root`/.run/releases/<full hash> unless it already is.
    Raises ReleaseInstallError."""
    full = _run(["git", "-C", str(root), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                f"resolving {commit}").stdout.decode().strip()
    home = root / ".run" / "releases" / full
    release = Release(full, home / "src", home / "venv" / "bin" / "python")
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{full}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = home / "installed"
        if marker.exists() and marker.read_text() == full and release.python.exists():
            return release
        shutil.rmtree(home, ignore_errors=True)
        release.src.mkdir(parents=True)
        archive = _run(["git", "-C", str(root), "archive", "--format=tar", full], f"git archive {full}").stdout
        _run(["tar", "-x", "-C", str(release.src)], f"extracting {full}", input=archive)
        _run(["bash", "scripts/gen_protos.sh"], "generating the gRPC modules", cwd=release.src,
             env={**os.environ, "PYTHON": sys.executable})
        _run([sys.executable, "-m", "venv", str(home / "venv")], "creating the virtualenv")
        site = _run([str(release.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    "locating the virtualenv's site-packages").stdout.decode().strip()
        deps = sysconfig.get_paths()["purelib"]
        # A path line, not a site dir: the .pth files there (the working tree's editable install) stay off.
        pathlib.Path(site, "zz_third_party.pth").write_text(deps + "\n")
        # The wheel is built by this environment's setuptools; the virtualenv's pip installs it.
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
              str(home / "wheel"), str(release.src)], f"building the wheel of {full}")
        wheel = next((home / "wheel").glob("*.whl"))
        _run([str(release.python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
             f"pip install of {full}")
        marker.write_text(full)
    return release
