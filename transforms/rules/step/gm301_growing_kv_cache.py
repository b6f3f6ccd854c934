"""GM301: a key/value cache that grows by concatenation."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import arg_value, ast_torch_call_name, first_arg, name_of
from graphmode.transforms.analysis.growing_caches import cat_pieces, grows_past
from graphmode.transforms.rules.base import Rule


def _grows_past(call: ast.Call) -> bool:
    """`torch.cat([past[0], k], ...)` / `torch.cat((past_key, k))`: the old part comes first (the question is
    transforms.analysis.growing_caches', which the cache codemods ask too)."""
    first_argument = first_arg(call)
    value = arg_value(first_argument) if first_argument is not None else None
    parts = cat_pieces(value.elts if value.__class__ in (ast.List, ast.Tuple) else None, ())
    if parts is None:
        return False
    old = arg_value(parts.old)
    return grows_past(old.__class__ is ast.Subscript, name_of(old))


class GrowingKVCache(Rule):
    CODE = "GM301"
    MESSAGE = (
        "the KV cache grows with `torch.cat`: every Decode step has a new shape and new memory; "
        "preallocate it and write in place at the position"
    )
    SKILL = "static-kv-cache"
    TRACED = True
    EXPLAINED_BY = frozenset({"GM201", "GM301", "GM302", "GM303", "GM502"})
    STEP_ONLY = True
    VALID = (
        # rotate_half: its first part is a negated slice, not an old cache.
        """
        import torch


        class Rotary(torch.nn.Module):
            def forward(self, x):
                half = x.shape[-1] // 2
                return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        """,
        # Joining two new tensors, not growing a cache.
        """
        import torch


        class Fuse(torch.nn.Module):
            def forward(self, k, v):
                return torch.cat([k, v], dim=-1)
        """,
    )
    INVALID = (
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, k, v, past_key_value=None):
                if past_key_value is not None:
                    k = torch.cat([past_key_value[0], k], dim=2)
                    v = torch.cat([past_key_value[1], v], dim=2)
                return k, v
        """,
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, k, past_key):
                return torch.cat((past_key, k), dim=-2)
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        if ast_torch_call_name(node) == "cat" and _grows_past(node) and self.in_step_code(node):
            self.report(node)
