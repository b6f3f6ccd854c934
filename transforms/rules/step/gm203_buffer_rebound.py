"""GM203: a buffer of the module replaced by a new tensor in the step."""
from __future__ import annotations

import ast

from graphmode.transforms.rules.base import Rule


def registered_buffers(tree: ast.Module) -> frozenset[str]:
    """The names the file registers with `register_buffer("name", ...)`, in any class."""
    return frozenset(
        node.args[0].value for node in ast.walk(tree)
        if node.__class__ is ast.Call and node.func.__class__ is ast.Attribute and node.func.attr == "register_buffer"
        and node.args and node.args[0].__class__ is ast.Constant and isinstance(node.args[0].value, str))


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
    )

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) != 1 or node.targets[0].__class__ is not ast.Attribute:
            return
        target = node.targets[0]
        if target.value.__class__ is not ast.Name or not self.in_step_code(node):
            return
        function = self.enclosing_function(node)
        arguments = function.args.posonlyargs + function.args.args if function is not None else []
        if not arguments or arguments[0].arg != target.value.id:  # `self.x`, not another object's attribute
            return
        if target.attr in self.file.fact("registered_buffers", registered_buffers):
            self.report(node, self.MESSAGE.format(target=f"{target.value.id}.{target.attr}", name=target.attr))
