"""GM303: a KV cache object written and measured through transformers' Cache API."""
from __future__ import annotations

import ast

from transforms.rules.base import Rule
from transforms.vocabulary import CACHE_OBJECT_LENGTHS, CACHE_OBJECT_WRITE

_CACHE_WORDS = ("past", "cache")


def _is_cache_name(node: ast.expr) -> bool:
    return node.__class__ is ast.Name and any(word in node.id.lower() for word in _CACHE_WORDS)


class CacheObject(Rule):
    CODE = "GM303"
    MESSAGE = (
        "the KV cache is an object that grows on every step (`update` concatenates, `get_usable_length` returns a "
        "Python int that changes): every Decode step has new shapes and a new constant; preallocate buffers and "
        "write them at the position"
    )
    SKILL = "static-kv-cache"
    FIXED_BY = ("cache_object",)
    STEP_ONLY = True

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if func.__class__ is not ast.Attribute or not _is_cache_name(func.value):
            return
        write = func.attr == CACHE_OBJECT_WRITE and len(node.args) >= 2
        if (write or func.attr in CACHE_OBJECT_LENGTHS) and self.in_step_code(node):
            self.report(node)
