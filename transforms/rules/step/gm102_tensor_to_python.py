"""GM102: `int()`, `float()` or `bool()` of a tensor inside the step."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.idioms import produces_tensor, tensor_names
from graphmode.transforms.rules.base import Rule

_CONVERSIONS = frozenset({"int", "float", "bool"})


class TensorToPython(Rule):
    CODE = "GM102"
    MESSAGE = (
        "`{name}()` of a tensor waits for the device and copies the value to the host; "
        "keep it a tensor (index with it, or use `torch.where`/`clamp`) or compute it in the eager caller"
    )
    SKILL = "host-syncs"
    TRACED = True
    EXPLAINED_BY = frozenset({"GM101", "GM102", "GM103", "GM104", "GM402"})
    STEP_ONLY = True
    VALID = (
        # Shapes are Python ints already: no device read.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, x):
                bsz = int(x.shape[0])
                head_dim = int(x.size(-1))
                return x.view(bsz, -1, head_dim)
        """,
        # `torch.finfo(...).min` is a Python float, not a tensor.
        """
        import torch


        class Mask(torch.nn.Module):
            def forward(self, scores, mask):
                fill = float(torch.finfo(scores.dtype).min)
                return scores.masked_fill(mask, fill)
        """,
        # Eager-only code under the guard.
        """
        import torch


        class Stats(torch.nn.Module):
            def forward(self, x):
                if not torch.compiler.is_compiling():
                    self.peak = float(x.abs().max())
                return x
        """,
    )
    INVALID = (
        """
        import torch


        class Trim(torch.nn.Module):
            def forward(self, x, mask):
                length = int(mask.sum())
                return x[:, :length]
        """,
        # A local name assigned a tensor, converted later.
        """
        import torch


        class Scale(torch.nn.Module):
            def forward(self, x):
                peak = torch.amax(x.abs())
                return x / float(peak)
        """,
    )

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
