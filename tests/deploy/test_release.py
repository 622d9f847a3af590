"""The release is written once, in pyproject.toml, and everything that names it agrees: the
installed distribution, `exactly --version`, `exactly-dev --version`, the services'
`--version`, the Helm chart's version and appVersion (the image tag's default), every image
tag the documentation shows, and CHANGELOG.md's entry for it. (The image built with that tag,
its label, the services' start-up log line and /metrics' exactly_build_info: test_image.py.)"""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tomllib

import yaml

import exactly
import exactly_wire

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "exactly"
BIN = pathlib.Path(sys.executable).parent
# Keep a Changelog: "## [1.2.3] - 2026-11-28" (or "## [Unreleased]").
_ENTRY = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$", re.M)
_SEMVER = r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?"


def release() -> str:
    """pyproject.toml's [project] version: the one place the release is written."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def changelog_entries(text: str) -> dict[str, str]:
    """{version: the entry's text up to the next entry} of a Keep a Changelog file."""
    heads = list(_ENTRY.finditer(text))
    return {m["version"]: text[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
            for i, m in enumerate(heads)}


def test_the_release_is_a_semantic_version_and_the_installed_one():
    assert re.fullmatch(_SEMVER, release()), release()
    # A stale editable install (pyproject.toml changed, not reinstalled) would report another.
    assert exactly_wire.version() == release()
    assert exactly.__version__ == release()


def test_the_commands_print_the_release():
    for argv, expected in ((["exactly", "--version"], f"exactly, version {release()}"),
                           (["exactly-dev", "--version"], f"exactly-dev, version {release()}")):
        out = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == expected
    for role in ("partition_leader", "txn_coordinator", "group_coordinator"):
        out = subprocess.run([sys.executable, "-m", f"services.{role}", "--version"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"Exactly {role} {release()}"


def test_the_chart_is_the_release():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == release()
    assert chart["appVersion"] == release()
    # The image tag defaults to appVersion (templates/_helpers.tpl, exactly.image).
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == "exactly" and values["image"]["tag"] == ""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert ".Values.image.tag | default .Chart.AppVersion" in helpers


def test_every_image_tag_the_documentation_shows_is_the_release():
    """A command or comment naming the image as exactly:X.Y.Z names this release."""
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
             *sorted(p for p in (REPO / "deploy").rglob("*") if p.is_file() and p.suffix in ("", ".md", ".yaml", ".sh"))]
    shown = {}
    for path in files:
        for m in re.finditer(rf"\bexactly:({_SEMVER})\b", path.read_text(errors="replace")):
            shown.setdefault(m[1], []).append(str(path.relative_to(REPO)))
    assert shown, "no image tag found: the Kubernetes page and the chart's README show one"
    assert set(shown) == {release()}, shown


def test_the_changelog_has_an_entry_for_the_release():
    text = (REPO / "CHANGELOG.md").read_text()
    entries = changelog_entries(text)
    assert release() in entries, f"CHANGELOG.md has no '## [{release()}] - DATE' entry: {sorted(entries)}"
    head = _ENTRY.search(text, text.index(f"## [{release()}]"))
    assert head["date"], "the release's entry has a date"
    entry = entries[release()]
    # What an operator needs before upgrading: the format and protocol changes and the steps.
    for section in ("### Upgrading from", "### Feature levels", "### Formats", "### Protocol"):
        assert section in entry, f"the entry for {release()} has no '{section}' section"
    # Newest first: only [Unreleased] may come before the release.
    assert [v for v in entries if v != "Unreleased"][0] == release()


def test_changelog_entries_are_read():
    text = "# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2026-11-28\n\nnew\n\n## [0.1.0] - 2026-11-27\n\nfirst\n"
    entries = changelog_entries(text)
    assert list(entries) == ["Unreleased", "0.2.0", "0.1.0"]
    assert entries["0.2.0"].strip() == "new" and entries["0.1.0"].strip() == "first"


def test_the_changelog_links_to_pages_that_exist():
    text = (REPO / "CHANGELOG.md").read_text()
    local = [target for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in target]
    assert "docs/operating/upgrades.md" in local, "the changelog links to the upgrade procedure"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, missing
