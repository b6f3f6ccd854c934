"""GM203: a buffer of the module replaced by a new tensor in the step."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.buffers import first_value_lines, registered_buffers
from graphmode.transforms.rules.base import Rule


class BufferRebound(Rule):
    CODE = "GM203"
    MESSAGE = (
        "`{target} = ...` puts a new tensor in place of the module's buffer `{name}` on every step: a captured graph "
        "(npugraph_ex, CUDA graphs) replays against the memory it was captured with and reads the old values; "
        "write the buffer in place (`{target}.copy_(...)`)"
    )
    SKILL = "static-buffers"
    STEP_ONLY = True
    VALID = (
        # Registered and written in place: the address stays.
        """
        import torch


        class Rotary(torch.nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.register_buffer("inv_freq", torch.ones(dim // 2), persistent=False)

            def forward(self, x, scale):
                self.inv_freq.copy_(1.0 / (scale * 10000 ** (torch.arange(0, 8, 2).float() / 8)))
                return x * self.inv_freq
        """,
        # Set once at build time, outside the step.
        """
        import torch


        class Rotary(torch.nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.register_buffer("inv_freq", torch.ones(dim // 2), persistent=False)
                self.inv_freq = self.inv_freq * 2

            def forward(self, x):
                return x * self.inv_freq
        """,
        # A buffer registered empty and filled on the first call.
        """
        import torch


        class Rotary(torch.nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.dim = dim
                self.register_buffer("inv_freq", None, persistent=False)

            def forward(self, x):
                if self.inv_freq is None:
                    self.inv_freq = 1.0 / (10000 ** (torch.arange(0, self.dim, 2).float() / self.dim))
                return x * self.inv_freq
        """,
        # Tables rebuilt (and registered again) at a new length: a build, whose tensors are new in any case.
        """
        import torch


        class Rotary(torch.nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.register_buffer("inv_freq", torch.ones(dim // 2), persistent=False)

            def _build(self, length, device):
                self.inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float().to(device) / 8))
                self.register_buffer("cos", torch.outer(torch.arange(length), self.inv_freq).cos(), persistent=False)

            def forward(self, x, length):
                if length > self.cos.shape[0]:
                    self._build(length, x.device)
                return x * self.cos[:length]
        """,
    )
    INVALID = (
        # LongRoPE (Phi-3): the frequencies recomputed and rebound every call.
        """
        import torch


        class Rotary(torch.nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.register_buffer("inv_freq", torch.ones(dim // 2), persistent=False)

            def forward(self, x, factors):
                self.inv_freq = 1.0 / (factors * 10000 ** (torch.arange(0, 8, 2).float() / 8))
                return x * self.inv_freq
        """,
        # CTRL: an `nn.Buffer` moved and cast in every forward; Dynamo breaks the graph at the buffer's registration.
        """
        import torch


        class Model(torch.nn.Module):
            def __init__(self, length, dim):
                super().__init__()
                self.pos_encoding = torch.nn.Buffer(torch.zeros(length, dim), persistent=False)

            def forward(self, x, position_ids):
                self.pos_encoding = self.pos_encoding.to(device=x.device, dtype=x.dtype)
                return x + self.pos_encoding[position_ids]
        """,
    )

    def visit_Assign(self, node: ast.Assign) -> None:
        target = node.targets[0] if len(node.targets) == 1 else None
        if target.__class__ is not ast.Attribute or target.value.__class__ is not ast.Name \
                or target.attr not in self.file.fact("registered_buffers", registered_buffers):
            return
        function = self.enclosing_function(node)
        if function is None or not self.in_step_code(node) or not _is_first_parameter(function, target.value.id):
            return  # another object's attribute, or outside the step
        # Not a buffer's first value, nor a function that registers buffers anew (it builds tables, new in any case).
        if node.lineno not in first_value_lines(function) and not registered_buffers(function):
            self.report(node, self.MESSAGE.format(target=f"{target.value.id}.{target.attr}", name=target.attr))


def _is_first_parameter(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    arguments = function.args.posonlyargs + function.args.args
    return bool(arguments) and arguments[0].arg == name
