"""GM302: a tensor (a preallocated cache, typically) sliced up to a Python-int position."""
from __future__ import annotations

import libcst as cst

from transforms.cstutil import is_position_param, names_in
from transforms.rules.base import Rule
from transforms.rules.idioms import local_assignments


def _int_arithmetic(node: cst.BaseExpression) -> bool:
    """Names, int literals and `+ - * //` of them, or `min`/`max` of such: how positions are combined."""
    if isinstance(node, (cst.Name, cst.Integer)):
        return True
    if isinstance(node, cst.BinaryOperation):
        return _int_arithmetic(node.left) and _int_arithmetic(node.right)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in {"min", "max"}:
        return all(a.keyword is None and not a.star and _int_arithmetic(a.value) for a in node.args)
    return False


def _position_names(func: cst.FunctionDef) -> dict[str, str]:
    """Position parameters of func, and local names computed from them by int arithmetic
    (`end = start_pos + seqlen`) -> the parameter's name."""
    found = {p.name.value: p.name.value for p in func.params.params if is_position_param(p)}
    if not found:
        return found
    assigned = local_assignments(func)
    changed = True
    while changed:
        changed = False
        for name, values in assigned.items():
            if name in found:
                continue
            for value in values:
                if not _int_arithmetic(value):
                    continue
                hits = sorted(names_in(value) & found.keys())
                if hits:
                    found[name] = found[hits[0]]
                    changed = True
                    break
    return found


class PositionSlice(Rule):
    CODE = "GM302"
    MESSAGE = (
        "a slice bounded by the Python-int position `{name}` changes every Decode step (a new constant, "
        "and for a read a new shape), so the graph recompiles or recaptures; read the whole cache under "
        "a mask and write it with `index_copy_` at a position tensor"
    )
    SKILL = "static-kv-cache"

    def __init__(self, path: str, step_functions: set[cst.FunctionDef]) -> None:
        super().__init__(path, step_functions)
        self._positions: dict[cst.FunctionDef, dict[str, str]] = {}

    def visit_Subscript(self, node: cst.Subscript) -> None:
        bounds = [
            part
            for element in node.slice
            if isinstance(element.slice, cst.Slice)
            for part in (element.slice.lower, element.slice.upper, element.slice.step)
            if part is not None
        ]
        if not bounds:
            return
        scope = self.enclosing_function(node)
        if scope is None:
            return
        if scope not in self._positions:
            self._positions[scope] = _position_names(scope)
        positions = self._positions[scope]
        hits = sorted({positions[n] for bound in bounds for n in names_in(bound) if n in positions})
        if hits and self.in_step_code(node):
            self.report(node, self.MESSAGE.format(name=hits[0]))
