"""The services depend on the wire layer (`exactly_wire`), never on the SDK package
`exactly` (docs/design.md, "Layout")."""
from __future__ import annotations

import ast
from pathlib import Path

from exactly_tools import design_docs

SERVICES = design_docs.ROOT / "services"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_services_do_not_import_the_sdk():
    offenders = {str(p.relative_to(SERVICES)): sorted(m for m in _imported_modules(p)
                                                       if m == "exactly" or m.startswith("exactly."))
                 for p in sorted(SERVICES.rglob("*.py"))}
    assert {p: m for p, m in offenders.items() if m} == {}
