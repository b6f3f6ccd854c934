"""GM501: a position passed as a Python int, a new constant on every Decode step."""
from __future__ import annotations

import ast

from graphmode.transforms.rules.astutil import is_position_param
from graphmode.transforms.rules.base import Rule


class IntPosition(Rule):
    CODE = "GM501"
    MESSAGE = (
        "`{name}` is a Python int that changes every Decode step: Dynamo guards it as a constant "
        "and recompiles each step; pass a position tensor instead"
    )
    SKILL = "positions-as-tensors"
    FIXED_BY = ("static_positions",)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for param in node.args.args:
            if is_position_param(param):
                self.report(param, self.MESSAGE.format(name=param.arg))
