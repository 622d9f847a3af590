"""The documentation site builds with `mkdocs build --strict` (mkdocs.yml): every page in
the navigation, every link and anchor between pages resolves, the Python API pages render
from the SDK's docstrings, and nothing is fetched from the network."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def build(site: pathlib.Path) -> subprocess.CompletedProcess:
    """Run `mkdocs build --strict` of the repository into `site`."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_site_builds_strict(tmp_path):
    proc = build(tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = (tmp_path / "site" / "reference" / "api.html").read_text()
    for anchor in ("exactly.Producer.send", "exactly.Consumer.poll", "exactly.AdminClient.create_topics",
                   "exactly.aio.AIOProducer", "exactly.postgres.transaction", "exactly.errors.ExactlyError"):
        assert f'id="{anchor}"' in api, anchor
    assert (tmp_path / "site" / "reference" / "configuration.html").exists()


def test_a_broken_link_fails_the_build(tmp_path):
    """--strict is what keeps links checked: a page linking to a missing page fails."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](missing.md)\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nstrict: true\n")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode != 0 and "missing.md" in proc.stdout + proc.stderr
