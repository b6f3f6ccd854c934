"""GM102: `int()`, `float()` or `bool()` of a tensor inside the step."""
from __future__ import annotations

import ast

from graphmode.transforms.rules.base import Rule
from graphmode.transforms.rules.idioms import produces_tensor, tensor_names

_CONVERSIONS = frozenset({"int", "float", "bool"})


class TensorToPython(Rule):
    CODE = "GM102"
    MESSAGE = (
        "`{name}()` of a tensor waits for the device and copies the value to the host; "
        "keep it a tensor (index with it, or use `torch.where`/`clamp`) or compute it in the eager caller"
    )
    SKILL = "host-syncs"
    STEP_ONLY = True

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if not (func.__class__ is ast.Name and func.id in _CONVERSIONS):
            return
        if len(node.args) != 1 or node.keywords or node.args[0].__class__ is ast.Starred:
            return
        if not self.in_step_code(node):
            return
        scope = self.enclosing_function(node)
        names = tensor_names(scope) if scope is not None else frozenset()
        if produces_tensor(node.args[0], names):
            self.report(node, self.MESSAGE.format(name=func.id))
