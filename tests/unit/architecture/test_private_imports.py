"""No module of services/ imports another module's private names (docs/design.md,
"Layout of services/common"): a name starting with one underscore is its module's own,
so `from X import _name` across modules is refused. A name needed elsewhere is made
public (documented) in its module or moved to where it is used. Aliasing a public
name to a private one (`import x as _x`) is fine."""
from __future__ import annotations

import ast

from exactly_tools import design_docs

ROOT = design_docs.ROOT
PROJECT = ("services", "exactly", "exactly_wire", "exactly_tools")


def private_imports(source: str) -> list[tuple[int, str, str]]:
    """(line, module as written, name) of each `from <project module> import _name`
    in `source` (relative imports count as project modules; dunder names do not)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = "." * node.level + (node.module or "")
        if not node.level and module.split(".")[0] not in PROJECT:
            continue
        found += [(node.lineno, module, alias.name) for alias in node.names
                  if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_private_name_imported_across_modules():
    offenders = [f"{path.relative_to(ROOT)}:{line}: from {module} import {name}"
                 for path in sorted((ROOT / "services").rglob("*.py")) if "__pycache__" not in path.parts
                 for line, module, name in private_imports(path.read_text())]
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)


def test_a_private_import_is_found():
    source = ("from .guard import safe_deserializer, _Undecodable\n"
              "from services.common.transport import (\n    tunnel,\n    _hidden)\n"
              "from exactly_wire.clock import monotonic_ms as _monotonic_ms\n"
              "from os import _exit\nfrom . import __version__\n")
    assert private_imports(source) == [(1, ".guard", "_Undecodable"),
                                       (2, "services.common.transport", "_hidden")]
