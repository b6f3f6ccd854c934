"""GM402: Python control flow (`if`, `while`, `x if c else y`) decided by a tensor's values."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import ast_names_in, ast_torch_call_name, method_call_name, preorder
from graphmode.transforms.analysis.idioms import produces_tensor, tensor_names_at
from graphmode.transforms.rules.base import Rule

# Calls whose result a branch can only use after reading tensor data on the host.
_VALUE_METHODS = frozenset({"any", "all", "equal", "allclose"})
_VALUE_TORCH = frozenset(
    {"any", "all", "equal", "allclose", "isclose", "isnan", "isinf", "isfinite", "isneginf", "isposinf",
     "is_nonzero", "count_nonzero"}
)
# Comparisons that look at identity or membership, not at tensor values.
_NOT_VALUE_OPS = (ast.Is, ast.IsNot, ast.In, ast.NotIn)


def _value_calls(test: ast.expr) -> list[ast.Call]:
    return [
        node for node in preorder(test, skip=(ast.Lambda,))
        if node.__class__ is ast.Call
        and (method_call_name(node) in _VALUE_METHODS or ast_torch_call_name(node) in _VALUE_TORCH)
    ]


def _atoms(test: ast.expr) -> list[ast.expr]:
    """The conditions `and`/`or`/`not` combine."""
    if test.__class__ is ast.BoolOp:
        return [atom for value in test.values for atom in _atoms(value)]
    if test.__class__ is ast.UnaryOp and test.op.__class__ is ast.Not:
        return _atoms(test.operand)
    return [test]


def _tensor_condition(test: ast.expr, names: frozenset[str]) -> ast.expr | None:
    """The part of test that is a tensor value, or None."""
    calls = _value_calls(test)
    if calls:
        return calls[0]
    for atom in _atoms(test):
        if atom.__class__ is ast.Compare:
            if any(isinstance(op, _NOT_VALUE_OPS) for op in atom.ops):
                continue
            for side in [atom.left, *atom.comparators]:
                if produces_tensor(side, names):
                    return atom
        elif produces_tensor(atom, names):
            return atom
    return None


class TensorBranch(Rule):
    CODE = "GM402"
    MESSAGE = (
        "Python `{kind}` on a tensor value (`{name}`) reads the device to choose a path, a graph break "
        "(an error under fullgraph); compute both sides and select with `torch.where`/`masked_fill`, "
        "or decide in the eager caller"
    )
    SKILL = "refactoring-principles"
    TRACED = True
    EXPLAINED_BY = frozenset({"GM101", "GM102", "GM103", "GM104", "GM402"})
    STEP_ONLY = True
    VALID = (
        # `torch.is_*` answers a Python bool about the runtime, not about tensor data.
        """
        import torch


        class Block(torch.nn.Module):
            def forward(self, x):
                if torch.is_autocast_enabled():
                    x = x.float()
                return self.proj(x)
        """,
        # A Python-int length read from the shape is no tensor value.
        """
        import torch


        class Block(torch.nn.Module):
            def forward(self, x):
                seq_len = x.shape[1]
                if seq_len > self.window:
                    x = x[:, -self.window :]
                return x
        """,
        # Identity tests look at no data.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, scores, mask=None):
                return scores if mask is None else scores + mask
        """,
    )
    INVALID = (
        """
        import torch


        class Guard(torch.nn.Module):
            def forward(self, x):
                if torch.isnan(x).any():
                    x = torch.nan_to_num(x)
                return x
        """,
        """
        import torch


        class Generator(torch.nn.Module):
            def forward(self, tokens, eos_id):
                while (tokens[:, -1] != eos_id).any():
                    tokens = self.step(tokens)
                return tokens
        """,
        # A local name assigned a reduction, compared in a conditional expression.
        """
        import torch


        class Clip(torch.nn.Module):
            def forward(self, x):
                peak = x.abs().max()
                return x / peak if peak > 1 else x
        """,
    )

    def _check(self, node: ast.AST, test: ast.expr, kind: str) -> None:
        if not self.in_step_code(node):
            return
        scope = self.enclosing_function(node)
        names: frozenset[str] = frozenset()
        if scope is not None:
            # What each name holds where it is tested; a `while` test also sees what its body binds.
            read = ast_names_in(test)
            names = tensor_names_at(scope, node.lineno, read)
            if node.__class__ is ast.While:
                names |= tensor_names_at(scope, node.end_lineno + 1, read)
        hit = _tensor_condition(test, names)
        if hit is not None:
            text = " ".join(self.file.code_of(hit, node).split())
            if len(text) > 40:
                text = text[:37] + "..."
            self.report(node, self.MESSAGE.format(kind=kind, name=text))

    def visit_If(self, node: ast.If) -> None:
        self._check(node, node.test, "if")

    def visit_While(self, node: ast.While) -> None:
        self._check(node, node.test, "while")

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._check(node, node.test, "... if ... else")
