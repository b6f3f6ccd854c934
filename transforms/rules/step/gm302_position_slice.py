"""GM302: a tensor (a preallocated cache, typically) sliced up to a Python-int position."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import ast_names_in, is_position_param, name_of
from graphmode.transforms.analysis.idioms import local_assignments, per_function
from graphmode.transforms.rules.base import Rule


def _int_arithmetic(node: ast.expr) -> bool:
    """Names, int literals and `+ - * //` of them, or `min`/`max` of such: how positions are combined."""
    cls = node.__class__
    if cls is ast.Name or (cls is ast.Constant and (node.value.__class__ is int or name_of(node) is not None)):
        return True
    if cls is ast.BinOp:
        return _int_arithmetic(node.left) and _int_arithmetic(node.right)
    if cls is ast.Call:
        return _min_max_of_ints(node)
    return False


def _min_max_of_ints(call: ast.Call) -> bool:
    """`min(...)` or `max(...)` of int arithmetic, every argument written out."""
    if not (call.func.__class__ is ast.Name and call.func.id in {"min", "max"}):
        return False
    return not call.keywords and all(a.__class__ is not ast.Starred and _int_arithmetic(a) for a in call.args)


@per_function
def position_names(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, str]:
    """Position parameters of func, and local names computed from them by int arithmetic
    (`end = start_pos + seqlen`) -> the parameter's name."""
    found = {p.arg: p.arg for p in func.args.args if is_position_param(p)}
    if not found:
        return found
    assigned = local_assignments(func)
    changed = True
    while changed:
        changed = False
        for name, values in assigned.items():
            if name in found:
                continue
            for value in values:
                if not _int_arithmetic(value):
                    continue
                hits = sorted(ast_names_in(value) & found.keys())
                if hits:
                    found[name] = found[hits[0]]
                    changed = True
                    break
    return found


class PositionSlice(Rule):
    CODE = "GM302"
    MESSAGE = (
        "a slice bounded by the Python-int position `{name}` changes every Decode step (a new constant, "
        "and for a read a new shape), so the graph recompiles or recaptures; read the whole cache under "
        "a mask and write it with `index_copy_` at a position tensor"
    )
    SKILL = "static-kv-cache"
    TRACED = True
    EXPLAINED_BY = frozenset({"GM201", "GM301", "GM302", "GM303", "GM502", "GM501"})
    STEP_ONLY = True
    VALID = (
        # The position is a tensor: written with index_copy_, no slice by it.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, k, input_pos: torch.Tensor):
                self.cache_k.index_copy_(1, input_pos, k)
                return self.cache_k
        """,
        # A slice by the new tokens' length is not a slice by the position.
        """
        import torch


        class Rotary(torch.nn.Module):
            def forward(self, x, seqlen):
                return x * self.freqs[:seqlen]
        """,
        # Indexing one element at the position is not a slice.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, k, start_pos: int):
                self.cache_k[:, start_pos] = k[:, 0]
                return self.cache_k
        """,
    )
    INVALID = (
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, k, start_pos: int):
                seqlen = k.shape[1]
                self.cache_k[:, start_pos : start_pos + seqlen] = k
                return self.cache_k
        """,
        # A local name computed from the position by int arithmetic.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, k, start_pos: int):
                seqlen = k.shape[1]
                end = start_pos + seqlen
                return self.cache_k[:, :end]
        """,
    )

    def visit_Subscript(self, node: ast.Subscript) -> None:
        bounds = _slice_bounds(node.slice)
        if not bounds:
            return
        scope = self.enclosing_function(node)
        if scope is None:
            return
        positions = position_names(scope)
        if not positions:
            return
        hits = sorted({positions[n] for bound in bounds for n in ast_names_in(bound) if n in positions})
        if hits and self.in_step_code(node):
            self.report(node, self.MESSAGE.format(name=hits[0]))


def _slice_bounds(index: ast.expr) -> list[ast.expr]:
    """The lower, upper and step expressions written in the slices of a subscript's index (`x[a:b, :c]`)."""
    elements = index.elts if index.__class__ is ast.Tuple else (index,)
    return [
        part
        for element in elements
        if element.__class__ is ast.Slice
        for part in (element.lower, element.upper, element.step)
        if part is not None
    ]
