"""GM303: a KV cache object written and measured through transformers' Cache API."""
from __future__ import annotations

import ast

from graphmode.transforms.rules.base import Rule
from graphmode.transforms.vocabulary import CACHE_OBJECT_LENGTHS, CACHE_OBJECT_WRITE

_CACHE_WORDS = ("past", "cache")


def _is_cache_name(node: ast.expr) -> bool:
    return node.__class__ is ast.Name and any(word in node.id.lower() for word in _CACHE_WORDS)


class CacheObject(Rule):
    CODE = "GM303"
    MESSAGE = (
        "the KV cache is an object passed through forward (a dynamic cache's `update` concatenates, "
        "`get_usable_length` returns a Python int that changes): every Decode step has new shapes and a new "
        "constant; preallocate buffers and write them at the position, or pass a static cache where the library "
        "has one"
    )
    SKILL = "static-kv-cache"
    STEP_ONLY = True
    VALID = (
        # Written for static caches: `cache_position` says the caller picks a cache that does not grow.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, hidden_states, past_key_value=None, cache_position=None):
                k, v = self.k_proj(hidden_states), self.v_proj(hidden_states)
                cache_kwargs = {"cache_position": cache_position}
                k, v = past_key_value.update(k, v, self.layer_idx, cache_kwargs)
                return k, v
        """,
        # A dict's one-argument `update` is not a cache write.
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, hidden_states, sin, cos):
                cache_kwargs = {}
                cache_kwargs.update({"sin": sin, "cos": cos})
                return hidden_states, cache_kwargs
        """,
    )
    INVALID = (
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, hidden_states, past_key_value=None):
                k, v = self.k_proj(hidden_states), self.v_proj(hidden_states)
                if past_key_value is not None:
                    k, v = past_key_value.update(k, v, self.layer_idx)
                return k, v
        """,
        """
        import torch


        class Attention(torch.nn.Module):
            def forward(self, hidden_states, past_key_value=None):
                kv_seq_len = hidden_states.shape[-2]
                kv_seq_len += past_key_value.get_usable_length(kv_seq_len, self.layer_idx)
                return kv_seq_len
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if func.__class__ is not ast.Attribute or not _is_cache_name(func.value):
            return
        write = func.attr == CACHE_OBJECT_WRITE and len(node.args) >= 2
        if (write or func.attr in CACHE_OBJECT_LENGTHS) and self.in_step_code(node) \
                and not _takes_cache_position(self.enclosing_function(node)):
            self.report(node)


def _takes_cache_position(function: ast.AST | None) -> bool:
    """Code written for static caches (transformers 4.38+ passes `cache_position` to the cache): whether it
    grows is the caller's choice of cache (`StaticCache` does not), not this code's."""
    if function is None:
        return False
    arguments = function.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    return "cache_position" in names
