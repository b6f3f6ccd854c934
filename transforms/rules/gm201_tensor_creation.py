"""GM201: a tensor built from scratch on every call that could be built once."""
from __future__ import annotations

import ast

from graphmode.transforms.vocabulary import TENSOR_FACTORIES
from graphmode.transforms.rules.astutil import torch_call_name
from graphmode.transforms.rules.base import Rule


class TensorCreatedInForward(Rule):
    CODE = "GM201"
    MESSAGE = "`torch.{name}` builds a new tensor on every step; pre-create it once as a buffer and index it"
    SKILL = "static-buffers"
    FIXED_BY = ("static_rotary", "static_mask", "static_positions", "cache_object", "carried_cache")
    STEP_ONLY = True

    def visit_Call(self, node: ast.Call) -> None:
        name = torch_call_name(node)
        if name in TENSOR_FACTORIES and self.in_step_code(node):
            self.report(node, self.MESSAGE.format(name=name))
