"""GM301: a key/value cache that grows by concatenation."""
from __future__ import annotations

import libcst as cst

from transforms.cstutil import torch_call_name
from transforms.rules.base import Rule


def _first_item_is_subscript(call: cst.Call) -> bool:
    """`torch.cat([past[0], k], ...)` / `torch.cat((past_key, k))`: the old part comes first."""
    if not call.args or not isinstance(call.args[0].value, (cst.List, cst.Tuple)):
        return False
    elements = call.args[0].value.elements
    if len(elements) != 2:
        return False
    first = elements[0].value
    return isinstance(first, cst.Subscript) or (isinstance(first, cst.Name) and "past" in first.value)


class GrowingKVCache(Rule):
    CODE = "GM301"
    MESSAGE = (
        "the KV cache grows with `torch.cat`: every Decode step has a new shape and new memory; "
        "preallocate it and write in place at the position"
    )
    SKILL = "static-kv-cache"
    FIXED_BY = ("static_kv_cache",)

    def visit_Call(self, node: cst.Call) -> None:
        if torch_call_name(node) == "cat" and _first_item_is_subscript(node) and self.in_step_code(node):
            self.report(node)
