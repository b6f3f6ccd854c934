"""GM501: a position passed as a Python int, a new constant on every Decode step."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import is_position_param
from graphmode.transforms.analysis.reach import SWITCH_TEST, static_twin
from graphmode.transforms.rules.base import Rule


class IntPosition(Rule):
    CODE = "GM501"
    MESSAGE = (
        "`{name}` is a Python int that changes every Decode step: Dynamo guards it as a constant "
        "and recompiles each step; pass a position tensor instead"
    )
    SKILL = "positions-as-tensors"
    TRACED = True
    EXPLAINED_BY = frozenset({"GM501", "GM302", "GM201", "GM303"})
    VALID = (
        # The position arrives as a tensor.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, x, start_pos: torch.Tensor):
                return x + self.freqs[start_pos]
        """,
        # A `pos` without an int annotation may be anything; only the well-known names count unannotated.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, x, pos):
                return x + self.freqs[pos]
        """,
    )
    INVALID = (
        """
        import torch


        class Transformer(torch.nn.Module):
            def forward(self, tokens, start_pos: int):
                return self.layers(tokens, start_pos)
        """,
        # An int-annotated name that reads as a position.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, x, cache_pos: int):
                return x + self.freqs[cache_pos]
        """,
        """
        def decode_one_token(model, token, past_length):
            return model(token, past_length)
        """,
    )

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if static_twin(node) is not None or self.file.fact("static_path", _has_static_path):
            # graphmode's output: the entries hand the static path a position tensor, whatever the model's own
            # annotation says (its twin's, or its own body where only the name changed); its callers, their int
            return
        for param in node.args.args:
            if is_position_param(param):
                self.report(param, self.MESSAGE.format(name=param.arg))


def _has_static_path(tree: ast.Module) -> bool:
    """The file is graphmode's output: it defines or imports the switch its methods ask."""
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == SWITCH_TEST:
            return True
        if isinstance(stmt, ast.ImportFrom) and any((a.asname or a.name) == SWITCH_TEST for a in stmt.names):
            return True
    return False
