"""GM104: `print` of a computed value inside the step."""
from __future__ import annotations

import libcst as cst

from transforms.rules.base import Rule


def _is_literal_text(node: cst.BaseExpression) -> bool:
    """A string literal: plain, concatenated, or an f-string with nothing interpolated."""
    if isinstance(node, cst.SimpleString):
        return True
    if isinstance(node, cst.ConcatenatedString):
        return _is_literal_text(node.left) and _is_literal_text(node.right)
    if isinstance(node, cst.FormattedString):
        return all(isinstance(part, cst.FormattedStringText) for part in node.parts)
    return False


class PrintInStep(Rule):
    CODE = "GM104"
    MESSAGE = (
        "`print` of a computed value in the step: printing a tensor waits for the device and copies it "
        "to the host, and the call breaks the graph; print in the eager caller, or guard it with "
        "`if not torch.compiler.is_compiling():`"
    )
    SKILL = "host-syncs"

    def visit_Call(self, node: cst.Call) -> None:
        if not (isinstance(node.func, cst.Name) and node.func.value == "print"):
            return
        printed = [a for a in node.args if a.keyword is None]
        if any(a.star or not _is_literal_text(a.value) for a in printed) and self.in_step_code(node):
            self.report(node)
