"""GM801: the GE backend asked for dynamic shapes."""
from __future__ import annotations

import ast

from graphmode.transforms.rules.base import Rule
from graphmode.transforms.rules.compile_calls import GE, BackendNames, compile_backend, is_torch_compile
from graphmode.transforms.rules.idioms import is_true, keyword


class GEDynamic(BackendNames, Rule):
    CODE = "GM801"
    MESSAGE = (
        "`torch.compile` with the GE backend and `dynamic=True` builds a dynamic-shape GE graph; GE Decode "
        "should be static: compile the Decode entry with `dynamic=False, fullgraph=True`"
    )
    SKILL = "compile-calls"

    def visit_Call(self, node: ast.Call) -> None:
        if not is_torch_compile(node) or compile_backend(node, self.file, self.backend_names) != GE:
            return
        dynamic = keyword(node, "dynamic")
        if dynamic is not None and is_true(dynamic.value):
            self.report(node)
