"""GM301: a key/value cache that grows by concatenation."""
from __future__ import annotations

import ast

from graphmode.transforms.rules.astutil import arg_value, first_arg, name_of, torch_call_name
from graphmode.transforms.rules.base import Rule


def _first_item_is_subscript(call: ast.Call) -> bool:
    """`torch.cat([past[0], k], ...)` / `torch.cat((past_key, k))`: the old part comes first."""
    first_argument = first_arg(call)
    if first_argument is None:
        return False
    value = arg_value(first_argument)
    if value.__class__ not in (ast.List, ast.Tuple):
        return False
    elements = value.elts
    if len(elements) != 2:
        return False
    first = arg_value(elements[0])
    if first.__class__ is ast.Subscript:
        return True
    name = name_of(first)
    return name is not None and "past" in name


class GrowingKVCache(Rule):
    CODE = "GM301"
    MESSAGE = (
        "the KV cache grows with `torch.cat`: every Decode step has a new shape and new memory; "
        "preallocate it and write in place at the position"
    )
    SKILL = "static-kv-cache"
    FIXED_BY = ("static_kv_cache", "cache_object", "carried_cache")
    STEP_ONLY = True

    def visit_Call(self, node: ast.Call) -> None:
        if torch_call_name(node) == "cat" and _first_item_is_subscript(node) and self.in_step_code(node):
            self.report(node)
