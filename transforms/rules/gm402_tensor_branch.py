"""GM402: Python control flow (`if`, `while`, `x if c else y`) decided by a tensor's values."""
from __future__ import annotations

import libcst as cst

from transforms.cstutil import code_of, method_call_name, torch_call_name
from transforms.rules.base import Rule
from transforms.rules.idioms import produces_tensor, tensor_names

# Calls whose result a branch can only use after reading tensor data on the host.
_VALUE_METHODS = frozenset({"any", "all", "equal", "allclose"})
_VALUE_TORCH = frozenset(
    {"any", "all", "equal", "allclose", "isclose", "isnan", "isinf", "isfinite", "isneginf", "isposinf",
     "is_nonzero", "count_nonzero"}
)
# Comparisons that look at identity or membership, not at tensor values.
_NOT_VALUE_OPS = (cst.Is, cst.IsNot, cst.In, cst.NotIn)


def _value_calls(test: cst.BaseExpression) -> list[cst.Call]:
    found: list[cst.Call] = []

    class _Finder(cst.CSTVisitor):
        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Call(self, node: cst.Call) -> None:
            if method_call_name(node) in _VALUE_METHODS or torch_call_name(node) in _VALUE_TORCH:
                found.append(node)

    test.visit(_Finder())
    return found


def _atoms(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The conditions `and`/`or`/`not` combine."""
    if isinstance(test, cst.BooleanOperation):
        return _atoms(test.left) + _atoms(test.right)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _atoms(test.expression)
    return [test]


def _tensor_condition(test: cst.BaseExpression, names: frozenset[str]) -> cst.BaseExpression | None:
    """The part of test that is a tensor value, or None."""
    calls = _value_calls(test)
    if calls:
        return calls[0]
    for atom in _atoms(test):
        if isinstance(atom, cst.Comparison):
            if any(isinstance(t.operator, _NOT_VALUE_OPS) for t in atom.comparisons):
                continue
            for side in [atom.left] + [t.comparator for t in atom.comparisons]:
                if produces_tensor(side, names):
                    return atom
        elif produces_tensor(atom, names):
            return atom
    return None


class TensorBranch(Rule):
    CODE = "GM402"
    MESSAGE = (
        "Python `{kind}` on a tensor value (`{name}`) reads the device to choose a path, a graph break "
        "(an error under fullgraph); compute both sides and select with `torch.where`/`masked_fill`, "
        "or decide in the eager caller"
    )
    SKILL = "refactoring-principles"

    def __init__(self, path: str, step_functions: set[cst.FunctionDef]) -> None:
        super().__init__(path, step_functions)
        self._names: dict[cst.FunctionDef, frozenset[str]] = {}

    def _check(self, node: cst.CSTNode, test: cst.BaseExpression, kind: str) -> None:
        if not self.in_step_code(node):
            return
        scope = self.enclosing_function(node)
        if scope is not None and scope not in self._names:
            self._names[scope] = tensor_names(scope)
        names = self._names.get(scope, frozenset()) if scope is not None else frozenset()
        hit = _tensor_condition(test, names)
        if hit is not None:
            text = " ".join(code_of(hit).split())
            if len(text) > 40:
                text = text[:37] + "..."
            self.report(node, self.MESSAGE.format(kind=kind, name=text))

    def visit_If(self, node: cst.If) -> None:
        self._check(node, node.test, "if")

    def visit_While(self, node: cst.While) -> None:
        self._check(node, node.test, "while")

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._check(node, node.test, "... if ... else")
