"""GM102: `int()`, `float()` or `bool()` of a tensor inside the step."""
from __future__ import annotations

import libcst as cst

from transforms.rules.base import Rule
from transforms.rules.idioms import produces_tensor, tensor_names

_CONVERSIONS = frozenset({"int", "float", "bool"})


class TensorToPython(Rule):
    CODE = "GM102"
    MESSAGE = (
        "`{name}()` of a tensor waits for the device and copies the value to the host; "
        "keep it a tensor (index with it, or use `torch.where`/`clamp`) or compute it in the eager caller"
    )
    SKILL = "host-syncs"

    def __init__(self, path: str, step_functions: set[cst.FunctionDef]) -> None:
        super().__init__(path, step_functions)
        self._names: dict[cst.FunctionDef, frozenset[str]] = {}

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Name) and func.value in _CONVERSIONS):
            return
        if len(node.args) != 1 or node.args[0].keyword is not None or node.args[0].star:
            return
        if not self.in_step_code(node):
            return
        scope = self.enclosing_function(node)
        if scope is not None and scope not in self._names:
            self._names[scope] = tensor_names(scope)
        names = self._names.get(scope, frozenset()) if scope is not None else frozenset()
        if produces_tensor(node.args[0].value, names):
            self.report(node, self.MESSAGE.format(name=func.value))
