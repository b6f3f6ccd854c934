"""GM104: `print` of a computed value inside the step."""
from __future__ import annotations

import ast

from graphmode.transforms.rules.base import Rule


def _is_literal_text(node: ast.expr) -> bool:
    """A string literal: plain, concatenated, or an f-string with nothing interpolated."""
    if node.__class__ is ast.Constant:
        return node.value.__class__ in (str, bytes)
    if node.__class__ is ast.JoinedStr:
        return all(part.__class__ is ast.Constant for part in node.values)
    return False


class PrintInStep(Rule):
    CODE = "GM104"
    MESSAGE = (
        "`print` of a computed value in the step: printing a tensor waits for the device and copies it "
        "to the host, and the call breaks the graph; print in the eager caller, or guard it with "
        "`if not torch.compiler.is_compiling():`"
    )
    SKILL = "host-syncs"
    EXPLAINED_BY = frozenset({"GM101", "GM102", "GM103", "GM104", "GM402"})
    STEP_ONLY = True
    VALID = (
        # A literal message prints no computed value.
        """
        import torch


        class Block(torch.nn.Module):
            def forward(self, x):
                print("block entered")
                return x + 1
        """,
        # Eager-only code under the guard.
        """
        import torch


        class Block(torch.nn.Module):
            def forward(self, x):
                if not torch.compiler.is_compiling():
                    print(x.shape)
                return x + 1
        """,
    )
    INVALID = (
        """
        import torch


        class Block(torch.nn.Module):
            def forward(self, x):
                print(x.shape)
                return x + 1
        """,
        # An f-string that interpolates is a computed value.
        """
        import torch


        class Block(torch.nn.Module):
            def forward(self, x):
                print(f"mean={x.mean()}")
                return x + 1
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        if not (node.func.__class__ is ast.Name and node.func.id == "print"):
            return
        starred = any(k.arg is None for k in node.keywords)  # `**k` is printed too
        if (starred or any(a.__class__ is ast.Starred or not _is_literal_text(a) for a in node.args)) \
                and self.in_step_code(node):
            self.report(node)
