"""No import cycle among the project's modules (docs/design.md, "Layout").

The graph has an edge from a module to every project module it imports, at module level,
inside a function (a deferred import is still a dependency) or under `if TYPE_CHECKING:`
(an annotation is a dependency too: two modules that name each other's types are one
module cut in two). A cycle fails the test with the modules on it."""
from __future__ import annotations

import ast
import graphlib
import pathlib

from exactly_tools import design_docs

ROOT = design_docs.ROOT
# Source directory of each top-level package of design_docs.PACKAGES.
NAMES = {"clients/exactly": "exactly", "clients/exactly_wire": "exactly_wire", "services": "services",
         "tools/exactly_tools": "exactly_tools", "demo": "demo", "bench": "bench"}


def _module_name(rel: pathlib.Path) -> str:
    package = next(p for p in NAMES if str(rel).startswith(p + "/"))
    parts = [NAMES[package], *rel.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST):
    """Import nodes of `tree`, wherever they are (those under `if TYPE_CHECKING:` too)."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    paths = {}
    for package in NAMES:
        for path in (ROOT / package).rglob("*.py"):
            if "__pycache__" not in path.parts and not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                paths[_module_name(path.relative_to(ROOT))] = path
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            graph[name] |= {t for t in targets if t in paths and t != name}
    return graph


def test_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 100 and graph["services.common.security.auth"]
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_a_cycle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        assert set(exc.args[1]) == {"a", "b", "c"}
    else:
        raise AssertionError("cycle not found")


def test_deferred_and_type_checking_imports_count():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\n"
                     "def f():\n    import y\n")
    assert sorted(n.names[0].name for n in _imports(tree)) == ["TYPE_CHECKING", "x", "y"]
