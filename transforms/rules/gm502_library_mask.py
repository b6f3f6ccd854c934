"""GM502: the causal mask built per call by transformers' mask helpers, for the grown length."""
from __future__ import annotations

import ast

from graphmode.transforms.rules.astutil import dotted_name
from graphmode.transforms.rules.base import Rule
from graphmode.transforms.vocabulary import LIBRARY_MASK_HELPERS


class LibraryMask(Rule):
    CODE = "GM502"
    MESSAGE = (
        "the 4-D causal mask is built on every call for `past + new` columns: its width changes every Decode step "
        "and the past length is a Python int; build it once at the maximum length and pick rows by position"
    )
    SKILL = "static-buffers"
    FIXED_BY = ("cache_object",)
    STEP_ONLY = True

    def visit_Call(self, node: ast.Call) -> None:
        name = dotted_name(node.func)
        if name and name.rsplit(".", 1)[-1] in LIBRARY_MASK_HELPERS and self.in_step_code(node):
            self.report(node)
