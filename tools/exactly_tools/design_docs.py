"""Generate the design's table of contents and the module map from the tree.

    python -m exactly_tools.design_docs [--check]

Two blocks are generated, each between its markers:

- `<!-- toc -->` … `<!-- /toc -->` in the design's index (`DESIGN`, docs/design.md): a link to
  every page of the design (docs/design/*.md, in the order of the site's navigation in
  mkdocs.yml) and to each `##` heading of it, nested, with the anchors GitHub gives headings;
- `<!-- module-map -->` … `<!-- /module-map -->` in the module map page (`MAP_PAGE`): every
  Python module of the project's packages (`PACKAGES`; generated protobuf modules
  excepted), one table per directory, each row the module's file name and the first
  sentence of its docstring.

A module without a docstring is an error (ValueError naming it). `--check` changes nothing
and exits 1 when a page differs from the tree (a module added, moved or renamed, a heading
changed); the unit test `test_design_doc` runs the same check.
"""
from __future__ import annotations

import argparse
import ast
import pathlib
import re
import sys

import yaml

from .generated_docs import DOCS, ROOT, regenerate

DESIGN = DOCS / "design.md"
MAP_PAGE = DOCS / "reference" / "modules.md"
NAV_SECTION = "Design"  # the section of mkdocs.yml's nav that lists the design's pages

# The directories whose Python modules the map lists, in the order it lists them.
PACKAGES = ("clients/exactly", "clients/exactly_wire", "services", "tools/exactly_tools", "demo", "bench")

_GENERATED = re.compile(r"_pb2(_grpc)?\.py$")
_TOC = re.compile(r"(<!-- toc -->\n)(.*?)(<!-- /toc -->)", re.S)
_MAP = re.compile(r"(<!-- module-map -->\n)(.*?)(<!-- /module-map -->)", re.S)


def modules(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Every Python module of `PACKAGES` under `root` (relative paths, sorted by directory
    then name), generated protobuf modules and empty package markers excepted."""
    found = []
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            if _GENERATED.search(path.name) or "__pycache__" in path.parts:
                continue
            if path.name == "__init__.py" and not path.read_text().strip():
                continue
            found.append(path.relative_to(root))
    return sorted(found, key=lambda p: (PACKAGES.index(_package_of(p)), str(p.parent), p.name))


def _package_of(path: pathlib.Path) -> str:
    return next(p for p in PACKAGES if str(path).startswith(p + "/"))


def summary(path: pathlib.Path) -> str:
    """The first sentence of the module's docstring, on one line. Raises ValueError when
    the module has no docstring."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        raise ValueError(f"{path}: module has no docstring (the design's module map lists it)")
    first = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?\.)(\s|$)", first)
    return (match.group(1) if match else first).replace("|", "\\|")


def module_map(root: pathlib.Path = ROOT) -> str:
    """The module map: a `#### dir/` title and a table per directory."""
    out: list[str] = []
    current = None
    for rel in modules(root):
        if rel.parent != current:
            current = rel.parent
            out += ["", f"#### `{current}/`", "", "| module | what it is |", "|---|---|"]
        out.append(f"| `{rel.name}` | {summary(root / rel)} |")
    return "\n".join(out[1:]) + "\n"


def anchor(title: str, seen: dict[str, int]) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens,
    `-1`, `-2`… appended to repeats (`seen` counts them)."""
    slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    return slug if n == 0 else f"{slug}-{n}"


class _NavLoader(yaml.SafeLoader):
    """Reads mkdocs.yml, whose Python tags (e.g. the slugify function) are left as None."""


_NavLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def design_pages(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """The design's pages (relative to docs/), in the order of mkdocs.yml's nav section
    `NAV_SECTION`. Raises ValueError when the nav has no such section."""
    nav = yaml.load((root / "mkdocs.yml").read_text(), Loader=_NavLoader)["nav"]
    for entry in nav:
        if isinstance(entry, dict) and NAV_SECTION in entry:
            items = entry[NAV_SECTION]
            paths = [next(iter(i.values())) if isinstance(i, dict) else i for i in items]
            return [pathlib.Path(p) for p in paths if p.startswith("design/")]
    raise ValueError(f"mkdocs.yml's nav has no {NAV_SECTION!r} section")


def headings(text: str) -> list[tuple[int, str]]:
    """(level, title) of every heading of Markdown `text` outside code fences."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith(("```", "~~~")):
            fenced = not fenced
        match = None if fenced else re.match(r"^(#{1,6}) (.+?)\s*$", line)
        if match:
            out.append((len(match.group(1)), match.group(2)))
    return out


def toc(root: pathlib.Path = ROOT) -> str:
    """The design's contents: each page (its `#` title) and its `##` headings."""
    lines = []
    for rel in design_pages(root):
        seen: dict[str, int] = {}
        for level, title in headings((root / "docs" / rel).read_text()):
            slug = anchor(title, seen)
            if level == 1:
                lines.append(f"- [{title.replace('`', '')}]({rel})")
            elif level == 2:
                lines.append(f"  - [{title.replace('`', '')}]({rel}#{slug})")
    return "\n".join(lines) + "\n"


def render(text: str, root: pathlib.Path = ROOT) -> str:
    """`text` with its module map and then its table of contents regenerated, each where
    its markers are."""
    text = _MAP.sub(lambda m: m.group(1) + module_map(root) + m.group(3), text)
    return _TOC.sub(lambda m: m.group(1) + toc(root) + m.group(3), text)


def require_blocks(pages: dict[pathlib.Path, str]) -> None:
    """Raise ValueError when a page lacks the markers of the block it must hold (`pages`:
    path -> `toc` or `module-map`)."""
    for path, name in pages.items():
        if f"<!-- {name} -->" not in path.read_text():
            raise ValueError(f"{path} lacks the <!-- {name} --> markers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exactly_tools.design_docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a page is out of date")
    args = parser.parse_args(argv)
    pages = {DESIGN: "toc", MAP_PAGE: "module-map"}
    require_blocks(pages)
    return regenerate(list(pages), render, args.check,
                      "contents or module map differ from the tree; run python -m exactly_tools.design_docs",
                      lambda texts: f"{len(modules())} modules mapped")


if __name__ == "__main__":
    sys.exit(main())
