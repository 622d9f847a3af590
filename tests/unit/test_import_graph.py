"""No import cycle among the project's modules (docs/design.md, "Layout").

The graph has an edge from a module to every project module it imports, at module level
or inside a function (a deferred import is still a dependency); imports under
`if TYPE_CHECKING:` are annotations only and are left out. A cycle fails the test with
the modules on it."""
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


def _runtime_imports(tree: ast.AST):
    """Import nodes of `tree`, skipping the bodies of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


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
        for node in _runtime_imports(ast.parse(path.read_text())):
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


def test_deferred_imports_count_and_type_checking_ones_do_not():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\n"
                     "def f():\n    import y\n")
    assert sorted(n.names[0].name for n in _runtime_imports(tree)) == ["TYPE_CHECKING", "y"]
