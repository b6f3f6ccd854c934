"""GM101: a value copied from the device to the host inside the step."""
from __future__ import annotations

import ast

from graphmode.transforms.rules.astutil import method_call_name
from graphmode.transforms.rules.base import Rule

_SYNC_METHODS = frozenset({"item", "tolist"})


class HostSync(Rule):
    CODE = "GM101"
    MESSAGE = "`.{name}()` waits for the device and copies a value to the host; a captured graph cannot contain it"
    SKILL = "host-syncs"
    FIXED_BY = ("hoist_item", "static_rotary", "host_scalars", "scalar_arguments")
    STEP_ONLY = True

    def visit_Call(self, node: ast.Call) -> None:
        name = method_call_name(node)
        if name in _SYNC_METHODS and not node.args and not node.keywords and self.in_step_code(node):
            self.report(node, self.MESSAGE.format(name=name))
