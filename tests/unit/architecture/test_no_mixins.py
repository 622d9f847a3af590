"""No class of services/ is built from mixins that share private state (docs/design.md,
"Layout"): parts of an object are collaborators, each built with its dependencies
(Kafka's TransactionCoordinator.apply), not base classes that call each other's
private methods.

Two rules, over the classes defined in services/:

- a class has at most one base class defined in the project (more is a mixin
  composition);
- every private attribute a class reads on `self` (`self._name`) is one it, or one of
  its project base classes, defines: a method, a class attribute, or an assignment to
  `self._name` in one of its methods. A private name a class uses but leaves to
  another class to define is private state shared between classes. A class with a
  base from outside the project (a library's) is exempt from this rule only for the
  names that base may define."""
from __future__ import annotations

import ast

from exactly_tools import design_docs

ROOT = design_docs.ROOT
SERVICES = ROOT / "services"


class ClassInfo:
    def __init__(self, module: str, node: ast.ClassDef):
        self.module = module
        self.name = node.name
        self.bases = [ast.unparse(b) for b in node.bases]
        self.defined: set[str] = set()
        self.read: dict[str, int] = {}  # private name read on self -> first line
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(item.name)
            elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                self.defined |= {t.id for t in targets if isinstance(t, ast.Name)}
            if isinstance(item, ast.Assign):
                for t in item.targets:  # __slots__ = ("_a", ...)
                    if isinstance(t, ast.Name) and t.id == "__slots__" and isinstance(item.value, (ast.Tuple, ast.List)):
                        self.defined |= {e.value for e in item.value.elts if isinstance(e, ast.Constant)}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls") \
                    and sub.attr.startswith("_") and not sub.attr.startswith("__"):
                if isinstance(sub.ctx, ast.Store):
                    self.defined.add(sub.attr)
                else:
                    self.read.setdefault(sub.attr, sub.lineno)


def classes(sources: dict[str, str]) -> dict[str, ClassInfo]:
    """Every top-level and nested class of `sources` (module -> source), by name."""
    out: dict[str, ClassInfo] = {}
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, ClassInfo(module, node))
    return out


def _base_name(base: str) -> str:
    """`Generic[P]` -> Generic, `abc.ABC` -> ABC, `pbg.Servicer` -> Servicer."""
    return base.split("[")[0].split(".")[-1]


def mixin_violations(sources: dict[str, str]) -> list[str]:
    """The classes of `sources` built from more than one project base, and the private
    names read on `self` that neither the class nor its project bases define."""
    found = classes(sources)
    out = []
    for info in found.values():
        project_bases = [found[_base_name(b)] for b in info.bases
                         if _base_name(b) in found and _base_name(b) != info.name]
        if len(project_bases) > 1:
            out.append(f"{info.module}: class {info.name} has {len(project_bases)} project base classes "
                       f"({', '.join(b.name for b in project_bases)})")
        if len(project_bases) < len([b for b in info.bases if _base_name(b) not in ("object", "Generic", "Protocol")]):
            continue  # a library base may define the names
        defined = set(info.defined)
        stack, seen = list(project_bases), {info.name}
        while stack:
            base = stack.pop()
            if base.name in seen:
                continue
            seen.add(base.name)
            defined |= base.defined
            stack += [found[_base_name(b)] for b in base.bases if _base_name(b) in found]
        for name, line in sorted(info.read.items()):
            if name not in defined:
                out.append(f"{info.module}:{line}: class {info.name} reads self.{name}, which it does not define")
    return out


def _services_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(SERVICES.rglob("*.py"))
            if "__pycache__" not in p.parts and not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))}


def test_no_class_in_services_is_built_from_mixins_sharing_private_state():
    sources = _services_sources()
    assert len(classes(sources)) > 100
    violations = mixin_violations(sources)
    assert not violations, "mixins sharing private state:\n" + "\n".join(violations)


def test_the_check_finds_mixins_and_their_private_cross_calls():
    source = '''
class Store:
    def __init__(self):
        self._log = []

class Requests:
    async def handle(self):
        return self._append(1)

class Completion:
    def _append(self, x):
        self._log.append(x)

class Coordinator(Requests, Completion, Store):
    pass

class Alone:
    def __init__(self, store):
        self._store = store
    def go(self):
        return self._store

class Child(Alone):
    def more(self):
        return self._store
'''
    assert mixin_violations({"m.py": source}) == [
        "m.py:8: class Requests reads self._append, which it does not define",
        "m.py:12: class Completion reads self._log, which it does not define",
        "m.py: class Coordinator has 3 project base classes (Requests, Completion, Store)",
    ]
