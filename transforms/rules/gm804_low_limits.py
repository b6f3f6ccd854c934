"""GM804: a recompile or capture limit set below its default."""
from __future__ import annotations

import libcst as cst

from transforms.cstutil import dotted_name
from transforms.rules.base import Rule
from transforms.rules.idioms import int_value, string_value

# Setting name -> its default: Dynamo's recompile_limit (alias cache_size_limit) and npugraph_ex's
# capture_limit (TorchAir: debug.aclgraph.static_capture_size_limit).
DEFAULTS = {"recompile_limit": 8, "cache_size_limit": 8, "capture_limit": 64, "static_capture_size_limit": 64}


class LowLimit(Rule):
    CODE = "GM804"
    MESSAGE = (
        "`{name}` is {value}, below the default {default}: past it Decode falls back to eager for good "
        "(raises under fullgraph); size it to cover every shape Decode is expected to see (one per batch bucket)"
    )
    SKILL = "compile-limits"

    def _check(self, node: cst.CSTNode, name: str | None, value: cst.BaseExpression) -> None:
        if name not in DEFAULTS:
            return
        number = int_value(value)
        if number is not None and number < DEFAULTS[name]:
            self.report(node, self.MESSAGE.format(name=name, value=number, default=DEFAULTS[name]))

    def visit_Assign(self, node: cst.Assign) -> None:
        """`torch._dynamo.config.recompile_limit = 4`."""
        for target in node.targets:
            name = dotted_name(target.target)
            if isinstance(target.target, cst.Attribute) and name is not None:
                self._check(target, name.rsplit(".", 1)[1], node.value)

    def visit_Arg(self, node: cst.Arg) -> None:
        """`torch.compile(..., recompile_limit=4)`, `CompilerConfig(capture_limit=16)`."""
        if node.keyword is not None:
            self._check(node, node.keyword.value, node.value)

    def visit_DictElement(self, node: cst.DictElement) -> None:
        """`options={"capture_limit": 16}`."""
        self._check(node, string_value(node.key), node.value)
