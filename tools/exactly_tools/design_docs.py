"""Generate the design's table of contents and the module map from the tree.

    python -m exactly_tools.design_docs [--check]

Two blocks are generated, each between its markers:

- `<!-- toc -->` … `<!-- /toc -->` in the design (`DESIGN`): a link to every `##` and `###`
  heading, nested, with the anchors GitHub gives headings;
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

from .generated_docs import DOCS, ROOT, regenerate

DESIGN = DOCS / "design.md"
MAP_PAGE = DOCS / "reference" / "modules.md"

# The directories whose Python modules the map lists, in the order it lists them.
PACKAGES = ("clients/exactly", "clients/exactly_wire", "services", "tools/exactly_tools", "demo", "bench")

_GENERATED = re.compile(r"_pb2(_grpc)?\.py$")
_TOC = re.compile(r"(<!-- toc -->\n)(.*?)(<!-- /toc -->)", re.S)
_MAP = re.compile(r"(<!-- module-map -->\n)(.*?)(<!-- /module-map -->)", re.S)
_HEADING = re.compile(r"^(#{2,3}) (.+?)\s*$")


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


def toc(text: str) -> str:
    """The table of contents of `text`: every `##`/`###` heading outside code fences but
    the contents' own."""
    lines, seen, fenced = [], {}, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match and match.group(2) != "Contents":
            title = match.group(2)
            indent = "  " * (len(match.group(1)) - 2)
            lines.append(f"{indent}- [{title.replace('`', '')}](#{anchor(title, seen)})")
    return "\n".join(lines) + "\n"


def render(text: str, root: pathlib.Path = ROOT) -> str:
    """`text` with its module map and then its table of contents regenerated, each where
    its markers are."""
    text = _MAP.sub(lambda m: m.group(1) + module_map(root) + m.group(3), text)
    return _TOC.sub(lambda m: m.group(1) + toc(text) + m.group(3), text)


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
