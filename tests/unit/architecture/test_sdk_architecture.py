"""Rules of the SDK's and the tools' code (clients/, tools/; docs/design/sdk.md, "The producer's
modules"), checked on their syntax trees:

- No call is named by a string. A call names its RPC in code: a handler class per RPC
  (`exactly._txn_calls`) or a value that reads the stub's method (`exactly._client.Rpc`), so
  grep and a type checker find every caller of an RPC. So: no `getattr` with a computed
  name, no `getattr`, `operator.attrgetter` or `operator.methodcaller` naming an RPC of
  `exactly.v1`, and no RPC's name passed as an argument (except to an error message).
- No internal re-export: a module's `__all__` names what the module defines. A package's
  `__init__` is its public face and gathers its modules' names; the SDK's public modules
  may publish a name of the wire layer they wrap (`exactly_wire`: TopicPartition, ErrorCode,
  the schema functions).
"""
from __future__ import annotations

import ast
import pathlib

from exactly_tools import design_docs
from exactly_wire.v1 import exactly_pb2 as pb

ROOT = design_docs.ROOT
RPCS = frozenset(m.name for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods)
# Calls whose string arguments are words of a message, not names to resolve.
_MESSAGE_CALLS = {"check", "for_code", "debug", "info", "warning", "error", "exception"}
# Where a computed getattr reads data, not a call: a settings schema's field by its Kafka key
# (ConfigSchema.get, for the topic configs that map to broker-level keys).
_FIELD_READS = {"clients/exactly_wire/config.py"}


def _sources(*folders: str) -> dict[str, ast.Module]:
    """The syntax tree of every hand-written module under `folders` (not the generated gRPC code)."""
    out = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            rel = path.relative_to(ROOT).as_posix()
            out[rel] = ast.parse(path.read_text(), rel)
    return out


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _string(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def calls_named_by_string(trees: dict[str, ast.Module]) -> list[str]:
    """`path:line: what` of each attribute resolved by a computed name (`getattr(x, name)`),
    each RPC resolved by its name as a string (`getattr(stub, "EndTxn")`,
    `operator.attrgetter("EndTxn")`, `operator.methodcaller(...)`), and each RPC name
    passed as an argument of a call other than an error message's."""
    found = []
    for path, tree in trees.items():
        for node in sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: n.lineno):
            name = _name(node.func)
            where = f"{path}:{node.lineno}: {ast.unparse(node)[:80]}"
            if name == "getattr" and len(node.args) >= 2:
                attr = _string(node.args[1])
                if attr is None or attr in RPCS:
                    found.append(where)
                continue
            if name in ("attrgetter", "methodcaller"):
                found.append(where)
                continue
            if name in _MESSAGE_CALLS or name.endswith("Error"):
                continue
            if any(_string(a) in RPCS for a in [*node.args, *(k.value for k in node.keywords)]):
                found.append(where)
    return found


def test_the_check_finds_calls_named_by_a_string():
    sample = {"x.py": ast.parse(
        'resp = core.call(getattr(core.group_stub(addr), method), request)\n'   # 1: computed
        'end = getattr(stub, "EndTxn")\n'                                         # 2: an RPC by name
        'get = operator.attrgetter("CreateAcls")\n'                                # 3
        'self._request("OffsetCommit", request, timeout_s)\n'                      # 4: a name to resolve later
        'Effect(key, 1, "txn", method="InitProducerId")\n'                          # 5
        'errors.check(resp.error_code, "OffsetFetch")\n'                           # a message: fine
        'resp = core.call(core.txn_stub(addr).EndTxn, request)\n'                  # named in code: fine
        'closed = getattr(self, "_closed", True)\n')}                              # a literal attribute: fine
    assert [f.split(":")[1] for f in calls_named_by_string(sample)] == ["1", "2", "3", "4", "5"]


def test_no_sdk_or_tools_call_is_named_by_a_string():
    trees = {path: tree for path, tree in _sources("clients", "tools").items() if path not in _FIELD_READS}
    found = calls_named_by_string(trees)
    assert found == [], "name the RPC in code (exactly._txn_calls, exactly._client.Rpc):\n" + "\n".join(found)


# ---------------------------------------------------------------- re-exports

def _defined(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level other than by importing them."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _exported(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return [n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return []


def _imported_from(tree: ast.Module) -> dict[str, str]:
    """Imported name -> the module it comes from, as written ("." prefixes for relative imports)."""
    return {alias.asname or alias.name: "." * node.level + (node.module or "")
            for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names}


def re_exports(trees: dict[str, ast.Module]) -> list[str]:
    """`path: name from module` of each name a module's `__all__` lists without defining
    it, other than in a package's `__init__` and, from the wire layer (`exactly_wire`), in
    a public module of the SDK."""
    found = []
    for path, tree in trees.items():
        if path.endswith("/__init__.py"):
            continue
        public = not pathlib.PurePosixPath(path).name.startswith("_")
        defined, imported = _defined(tree), _imported_from(tree)
        for name in _exported(tree):
            if name in defined:
                continue
            source = imported.get(name, "?")
            if public and source.split(".")[0] == "exactly_wire":
                continue
            found.append(f"{path}: {name} from {source}")
    return found


def test_the_check_finds_a_re_export():
    sample = {"clients/exactly/producer.py": ast.parse(
        "from ._two_phase import PreparedTxnState\nfrom exactly_wire.types import TopicPartition\n"
        "class Producer: ...\n__all__ = ['Producer', 'PreparedTxnState', 'TopicPartition']\n"),
        "clients/exactly/_fetcher.py": ast.parse(
            "from exactly_wire.types import TopicPartition\nA, B = 1, 2\n__all__ = ['A', 'B', 'TopicPartition']\n"),
        "clients/exactly/__init__.py": ast.parse("from .producer import Producer\n__all__ = ['Producer']\n")}
    assert re_exports(sample) == ["clients/exactly/producer.py: PreparedTxnState from ._two_phase",
                                  "clients/exactly/_fetcher.py: TopicPartition from exactly_wire.types"]


def test_no_module_of_the_sdk_re_exports_another_modules_names():
    found = re_exports(_sources("clients", "tools"))
    assert found == [], "import each name from the module that defines it:\n" + "\n".join(found)
