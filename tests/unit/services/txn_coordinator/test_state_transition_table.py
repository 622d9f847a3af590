"""The transition table is the one gate of a transaction's state: every row (the
guarded handover included) allows exactly its transitions, through the check and
through a prepare -> complete of the metadata; and no code of the transaction
coordinator assigns the state anywhere but in the table's apply function."""
from __future__ import annotations

import ast
import itertools

import pytest

from exactly_tools import design_docs
from services.txn_coordinator.state import (TRANSITION_TABLE, VALID_PREVIOUS, Guard, GuardNotHeldError,
                                            InvalidTransitionError, TransactionMetadata, TxnState,
                                            TxnTransitMetadata, check_transition)

S = TxnState
NOW = 1_000_000
PACKAGE = design_docs.ROOT / "services" / "txn_coordinator"

# Written out independently of the module: (current, target, guard) allowed.
EXPECTED = {(c, t, None) for t, previous in {
    S.EMPTY: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.ONGOING: {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.PREPARE_COMMIT: {S.ONGOING},
    S.PREPARE_ABORT: {S.ONGOING, S.PREPARE_EPOCH_FENCE},
    S.COMPLETE_COMMIT: {S.PREPARE_COMMIT},
    S.COMPLETE_ABORT: {S.PREPARE_ABORT},
    S.DEAD: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.PREPARE_EPOCH_FENCE: {S.ONGOING},
}.items() for c in previous} | {
    (S.PREPARE_COMMIT, S.ONGOING, Guard.MARKERS_WRITTEN),  # the handover
    (S.PREPARE_ABORT, S.ONGOING, Guard.MARKERS_WRITTEN),
}
GUARDS = [None, *Guard]


def test_the_table_holds_exactly_the_expected_rows():
    rows = {(c, r.target, r.guard) for r in TRANSITION_TABLE for c in r.previous}
    assert rows == EXPECTED
    assert {(c, t) for c, t, g in EXPECTED if g is None} == {(c, t) for t, p in VALID_PREVIOUS.items() for c in p}


@pytest.mark.parametrize("current,target,guard", list(itertools.product(TxnState, TxnState, GUARDS)),
                         ids=lambda v: getattr(v, "kafka_name", None) or getattr(v, "name", "unguarded"))
def test_every_row_allows_its_transitions_and_refuses_the_others(current, target, guard):
    if (current, target, guard) in EXPECTED:
        row = check_transition("t", current, target, guard)
        assert (row.target, row.guard) == (target, guard) and current in row.previous
    else:
        with pytest.raises(InvalidTransitionError):
            check_transition("t", current, target, guard)


def _md(state: TxnState) -> TransactionMetadata:
    ongoing = state not in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.DEAD)
    return TransactionMetadata("t", 7, producer_epoch=3, txn_timeout_ms=60000, state=state,
                               partitions=[("a", 0)] if ongoing else (), txn_start_timestamp=NOW if ongoing else -1,
                               txn_last_update_timestamp=NOW)


def _transit(md: TransactionMetadata, target: TxnState) -> TxnTransitMetadata:
    """A transit to `target` that keeps every invariant complete_transition re-checks."""
    snap = md.snapshot()
    if target in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.DEAD, S.EMPTY):
        return TxnTransitMetadata(7, -1, 3, -1, 60000, target, frozenset(), -1, NOW + 1)
    if target is S.ONGOING:
        return TxnTransitMetadata(7, -1, 3, -1, 60000, target, snap.partitions | {("b", 0)},
                                  snap.txn_start_timestamp if md.state is S.ONGOING else NOW + 1, NOW + 1)
    return TxnTransitMetadata(7, -1, 3, -1, 60000, target, snap.partitions, snap.txn_start_timestamp, NOW + 1)


@pytest.mark.parametrize("current,target,guard", [
    (c, t, g) for c, t, g in itertools.product(TxnState, TxnState, GUARDS)
    if t is not S.PREPARE_EPOCH_FENCE and c is not S.PREPARE_EPOCH_FENCE],
    ids=lambda v: getattr(v, "kafka_name", None) or getattr(v, "name", "unguarded"))
def test_complete_transition_applies_a_row_only(current, target, guard):
    """The metadata completes a pending transition only along a row of the table
    with the pending transition's guard (PrepareEpochFence, never completed, is
    covered by the fencing tests)."""
    md = _md(current)
    if guard is Guard.MARKERS_WRITTEN:
        md.record_markers_written(md.snapshot())  # the fact the guarded row needs, where it can hold
    md.pending_state = target
    md._pending_guard = guard
    transit = _transit(md, target)
    if (current, target, guard) in EXPECTED:
        md.complete_transition(transit)
        assert (md.state, md.pending_state) == (target, None)
    else:
        with pytest.raises(InvalidTransitionError):
            md.complete_transition(transit)
        assert md.state is current


def test_the_handover_is_prepared_through_its_guarded_row():
    md = _md(S.PREPARE_ABORT)
    with pytest.raises(GuardNotHeldError):  # the machine checks its guard's fact itself
        md.prepare_next_transaction([("b", 0)], NOW + 1)
    assert md.record_markers_written(md.snapshot())
    transit = md.prepare_next_transaction([("b", 0)], NOW + 1)
    assert md._pending_guard is Guard.MARKERS_WRITTEN
    md.complete_transition(transit)
    assert (md.state, md.partitions) == (S.ONGOING, {("b", 0)})
    with pytest.raises(InvalidTransitionError):  # Ongoing -> Ongoing is no handover
        md.prepare_next_transaction([("c", 0)], NOW + 2)


def test_the_state_cannot_be_assigned_from_outside():
    with pytest.raises(AttributeError):
        _md(S.EMPTY).state = S.ONGOING


# Assignments of the state field allowed outside the apply function: the initial
# state of a new metadata object, and a protobuf message's own `state` field.
ALLOWED = {
    ("state.py", "TransactionMetadata.__init__", "self._state"),
    ("state.py", "TransactionMetadata._apply", "self._state"),
    ("servicer.py", "TxnCoordinatorServicer.DescribeTransactions", "desc.state"),
}


def _state_stores(tree: ast.AST):
    """(qualified function, target source) of every store to an attribute `state` or
    `_state`, and every setattr(..., "state" / "_state", ...)."""
    out = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, scope + [child.name])
                continue
            if isinstance(child, ast.Attribute) and isinstance(child.ctx, (ast.Store, ast.Del)) \
                    and child.attr in ("state", "_state"):
                out.append((".".join(scope), ast.unparse(child)))
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "setattr" \
                    and len(child.args) > 1 and isinstance(child.args[1], ast.Constant) \
                    and child.args[1].value in ("state", "_state"):
                out.append((".".join(scope), ast.unparse(child)))
            visit(child, scope)
    visit(tree, [])
    return out


def test_no_code_assigns_the_state_outside_the_apply_function():
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for scope, target in _state_stores(ast.parse(path.read_text(), str(path))):
            found.add((str(path.relative_to(PACKAGE)), scope, target))
    assert found - ALLOWED == set(), "state assigned outside TransactionMetadata._apply"
    assert ("state.py", "TransactionMetadata._apply", "self._state") in found  # the scan sees the one it allows


def test_the_scan_finds_a_stray_assignment():
    code = "def f(md):\n    md.state = 1\n\nclass C:\n    def g(self, md):\n        setattr(md, '_state', 2)\n"
    assert _state_stores(ast.parse(code)) == [("f", "md.state"), ("C.g", "setattr(md, '_state', 2)")]
