"""GM103: a tensor copied to the host (`.cpu()`, `.numpy()`, `.to("cpu")`) inside the step."""
from __future__ import annotations

import libcst as cst

from transforms.cstutil import method_call_name
from transforms.rules.base import Rule
from transforms.rules.idioms import keyword, string_value


def _to_cpu(node: cst.Call) -> bool:
    """`.to("cpu")` / `.to(device="cpu")`."""
    if method_call_name(node) != "to":
        return False
    device = keyword(node, "device")
    if device is None and node.args and node.args[0].keyword is None:
        device = node.args[0]
    return device is not None and string_value(device.value) == "cpu"


class CopyToHost(Rule):
    CODE = "GM103"
    MESSAGE = (
        "`{name}` copies the tensor to the host mid-step and waits for the device; "
        "return the device tensor and copy it in the eager caller after the compiled call"
    )
    SKILL = "host-syncs"

    def visit_Call(self, node: cst.Call) -> None:
        name = method_call_name(node)
        if name in {"cpu", "numpy"}:
            label = f".{name}()"
        elif _to_cpu(node):
            label = '.to("cpu")'
        else:
            return
        if self.in_step_code(node):
            self.report(node, self.MESSAGE.format(name=label))
