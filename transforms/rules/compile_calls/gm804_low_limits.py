"""GM804: a recompile or capture limit set below its default."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import ast_dotted_name
from graphmode.transforms.analysis.idioms import int_value, string_value
from graphmode.transforms.rules.base import Rule

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
    VALID = (
        # Raised above the default to cover every batch bucket.
        """
        import torch

        torch._dynamo.config.recompile_limit = 32
        """,
        # At the default is not below it.
        """
        import torchair

        config = torchair.CompilerConfig()
        config.debug.aclgraph.static_capture_size_limit = 64
        """,
    )
    INVALID = (
        """
        import torch

        torch._dynamo.config.cache_size_limit = 1
        """,
        """
        import torch


        def compile_decode(model):
            return torch.compile(model.decode, backend="npugraph_ex", fullgraph=True, options={"capture_limit": 16})
        """,
        """
        import torchair

        config = torchair.CompilerConfig(capture_limit=8)
        """,
    )

    def _check(self, node: ast.AST, name: str | None, value: ast.expr, within: ast.AST | None = None) -> None:
        if name not in DEFAULTS:
            return
        number = int_value(value)
        if number is not None and number < DEFAULTS[name]:
            # An assignment target or a dict key starts at its parentheses, as libcst has it.
            self.report(node if within is None else self.file.own_start(node, within),
                        self.MESSAGE.format(name=name, value=number, default=DEFAULTS[name]))

    def visit_Assign(self, node: ast.Assign) -> None:
        """`torch._dynamo.config.recompile_limit = 4`."""
        for target in node.targets:
            if target.__class__ is ast.Attribute and target.attr in DEFAULTS and ast_dotted_name(target) is not None:
                self._check(target, target.attr, node.value, node)

    def visit_keyword(self, node: ast.keyword) -> None:
        """`torch.compile(..., recompile_limit=4)`, `CompilerConfig(capture_limit=16)`."""
        if node.arg is not None:
            self._check(node, node.arg, node.value)

    def visit_Dict(self, node: ast.Dict) -> None:
        """`options={"capture_limit": 16}`."""
        for key, value in zip(node.keys, node.values):
            if key is not None and key.__class__ is ast.Constant and key.value in DEFAULTS:
                self._check(key, string_value(key, self.file), value, node)
