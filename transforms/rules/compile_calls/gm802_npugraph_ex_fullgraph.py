"""GM802: npugraph_ex without fullgraph=True."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.idioms import is_true, keyword
from graphmode.transforms.rules.base import Rule
from graphmode.transforms.rules.compile_calls.calls import NPUGRAPH_EX, BackendNames, compile_backend, is_torch_compile


class NpugraphExFullgraph(BackendNames, Rule):
    CODE = "GM802"
    MESSAGE = (
        "`torch.compile(..., backend=\"npugraph_ex\")` without `fullgraph=True`: a graph break silently "
        "splits Decode into separately captured pieces with eager Python between them; pass `fullgraph=True`"
    )
    SKILL = "compile-calls"
    VALID = (
        """
        import torch


        def compile_decode(model):
            return torch.compile(model.decode, backend="npugraph_ex", fullgraph=True, dynamic=False)
        """,
        # GE is another backend: GM801 is its rule.
        """
        import torch


        def compile_decode(model):
            return torch.compile(model.decode, backend="npu", dynamic=False)
        """,
    )
    INVALID = (
        """
        import torch


        def compile_decode(model):
            return torch.compile(model.decode, backend="npugraph_ex", dynamic=False)
        """,
        """
        import torch


        def compile_decode(model):
            return torch.compile(model.decode, backend="npugraph_ex", fullgraph=False)
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        if not is_torch_compile(node) or compile_backend(node, self.file, self.backend_names) != NPUGRAPH_EX:
            return
        fullgraph = keyword(node, "fullgraph")
        if fullgraph is None or not is_true(fullgraph.value):
            self.report(node)
