"""GM201: a tensor built from scratch on every call that could be built once."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import ast_torch_call_name
from graphmode.transforms.rules.base import Rule
from graphmode.transforms.vocabulary import TENSOR_FACTORIES


class TensorCreatedInForward(Rule):
    CODE = "GM201"
    MESSAGE = "`torch.{name}` builds a new tensor on every step; pre-create it once as a buffer and index it"
    SKILL = "static-buffers"
    TRACED = True
    EXPLAINED_BY = frozenset({"GM201", "GM301", "GM302", "GM303", "GM502"})
    STEP_ONLY = True
    VALID = (
        # Built once in __init__ (no step reaches it) and indexed in forward.
        """
        import torch


        class Rotary(torch.nn.Module):
            def __init__(self, dim, max_len):
                super().__init__()
                self.register_buffer("positions", torch.arange(max_len))

            def forward(self, x):
                return self.positions[: x.shape[1]]
        """,
        # `torch.where` selects between existing tensors; it is no factory.
        """
        import torch


        class Mask(torch.nn.Module):
            def forward(self, scores, keep):
                return torch.where(keep, scores, scores.new_tensor(float("-inf")))
        """,
    )
    INVALID = (
        """
        import torch


        class Mask(torch.nn.Module):
            def forward(self, x):
                n = x.shape[1]
                mask = torch.full((n, n), float("-inf"), device=x.device)
                return torch.triu(mask, diagonal=1)
        """,
        """
        import torch


        def forward(tokens):
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            return tokens + positions
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        name = ast_torch_call_name(node)
        if name in TENSOR_FACTORIES and self.in_step_code(node):
            self.report(node, self.MESSAGE.format(name=name))
