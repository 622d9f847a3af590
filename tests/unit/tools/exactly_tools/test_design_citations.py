"""Every citation of the design by section (docs/design.md and the section's name in quotes) in the tree names a
section of the design's pages (docs/design/*.md: a heading, or a paragraph's bold run-in
title), so a citation keeps leading somewhere when the design changes."""
from __future__ import annotations

import re

from exactly_tools import design_docs

ROOT = design_docs.ROOT
_CITATION = re.compile(r'docs/design\.md,?\s+"([^"]+)"')
_SUFFIXES = (".py", ".md", ".proto", ".yaml", ".yml", ".sh", ".js", ".txt", ".toml")
_SKIP = {".git", ".venv", ".compat", "site", "node_modules", "__pycache__", ".run"}


def _files():
    stack = [ROOT]
    while stack:
        for path in stack.pop().iterdir():
            if path.name in _SKIP:
                continue
            if path.is_dir():
                stack.append(path)
            elif path.suffix in _SUFFIXES or path.name == "Makefile":
                yield path


def _normal(name: str) -> str:
    return " ".join(name.replace("->", "→").replace("`", "").split()).rstrip(".").lower()


def sections() -> set[str]:
    """The names a citation may use: every heading of the design's pages, and every bold
    run-in paragraph title (`**Name.**`), normalised; a heading with a parenthesis also
    answers to its name without it."""
    names = set()
    for rel in design_docs.design_pages():
        text = (ROOT / "docs" / rel).read_text()
        found = [title for _level, title in design_docs.headings(text)] + re.findall(r"\*\*([^*]+)\*\*", text)
        for name in found:
            names.add(_normal(name))
            names.add(_normal(re.sub(r"\s*\([^)]*\)$", "", name)))
    return names


def test_every_citation_names_a_section_of_the_design():
    known = sections()
    bad = []
    for path in _files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for match in _CITATION.finditer(text):
            if _normal(match.group(1)) not in known:
                bad.append(f"{path.relative_to(ROOT)}: {match.group(1)!r}")
    assert not bad, "citations of sections the design does not have:\n" + "\n".join(sorted(bad))


def test_the_design_has_pages_and_sections():
    assert len(design_docs.design_pages()) > 15
    known = sections()
    assert {"transactions", "prepare → append → complete", "two-phase commit with a database",
            "producer-id bindings"} <= known
