"""GM801: the GE backend asked for dynamic shapes."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.idioms import is_true, keyword
from graphmode.transforms.rules.base import Rule
from graphmode.transforms.rules.compile_calls.calls import GE, BackendNames, compile_backend, is_torch_compile


class GEDynamic(BackendNames, Rule):
    CODE = "GM801"
    MESSAGE = (
        "`torch.compile` with the GE backend and `dynamic=True` builds a dynamic-shape GE graph; GE Decode "
        "should be static: compile the Decode entry with `dynamic=False, fullgraph=True`"
    )
    SKILL = "compile-calls"
    VALID = (
        """
        import torch
        import torchair


        def compile_decode(model, config):
            backend = torchair.get_npu_backend(compiler_config=config)
            return torch.compile(model.decode, backend=backend, dynamic=False, fullgraph=True)
        """,
        # Dynamic shapes are not a GE matter for other backends.
        """
        import torch


        def compile_decode(model):
            return torch.compile(model.decode, backend="inductor", dynamic=True)
        """,
    )
    INVALID = (
        # The backend found through a name assigned it.
        """
        import torch
        import torchair


        def compile_decode(model, config):
            npu_backend = torchair.get_npu_backend(compiler_config=config)
            return torch.compile(model.decode, backend=npu_backend, dynamic=True)
        """,
        """
        import torch


        def compile_decode(model):
            return torch.compile(model.decode, backend="npu", dynamic=True, fullgraph=True)
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        if not is_torch_compile(node) or compile_backend(node, self.file, self.backend_names) != GE:
            return
        dynamic = keyword(node, "dynamic")
        if dynamic is not None and is_true(dynamic.value):
            self.report(node)
