"""Regenerating the generated parts of the documentation (the reference pages' tables, the
design's contents, the module map): rewrite them, or with `check` only report drift."""
from __future__ import annotations

import pathlib
import sys
from typing import Callable, Iterable

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def documents(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Every Markdown document of the project a generator may fill: README.md and the pages
    of the documentation site (docs/**/*.md), sorted."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def regenerate(paths: Iterable[pathlib.Path], render: Callable[[str], str], check: bool, drift: str,
               summary: Callable[[list[str]], str]) -> int:
    """Render each of `paths`' text. With `check`: exit status 1 and `drift` on stderr for
    each file that differs from its rendering, else 0, writing nothing. Without: write each
    rendering that differs, print `summary(rendered texts)`, 0."""
    status, rendered = 0, []
    for path in paths:
        text = path.read_text()
        new = render(text)
        rendered.append(new)
        if new == text:
            continue
        if check:
            print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {drift}", file=sys.stderr)
            status = 1
        else:
            path.write_text(new)
    if not check:
        print(summary(rendered))
    return status
