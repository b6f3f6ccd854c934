"""Moves host-side checks (`assert x.item() < n`, `if t.item(): raise`) out of the compiled region.

They stay in eager runs (the original model, Prefill) and are skipped while Dynamo traces, so the
compiled Decode never waits for the device to hand a value to Python.
"""
from __future__ import annotations

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from transforms.codemods.base import GraphCodemod
from transforms.cstutil import code_of, contains_call

GUARD = "not torch.compiler.is_compiling()"
_SYNCS = ("item", "tolist")


def _reads_host_value(node: cst.CSTNode) -> bool:
    return any(contains_call(node, method) for method in _SYNCS)


def _is_check(stmt: cst.BaseStatement) -> bool:
    """An assert, or an `if` whose whole body raises: code that validates and computes nothing."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assert) and _reads_host_value(stmt.body[0].test)
    if isinstance(stmt, cst.If) and stmt.orelse is None and isinstance(stmt.body, cst.IndentedBlock):
        body = stmt.body.body
        return (
            _reads_host_value(stmt.test)
            and len(body) == 1
            and isinstance(body[0], cst.SimpleStatementLine)
            and isinstance(body[0].body[0], cst.Raise)
        )
    return False


class HoistItem(GraphCodemod):
    NAME = "hoist_item"
    TITLE = "Run host-side checks in eager code only"
    DESCRIPTION = (
        "Wraps checks that read tensor values on the host (`assert t.item() ...`, `if ...item(): raise`) in "
        "`if not torch.compiler.is_compiling():`. The check still runs in the eager original and in Prefill; "
        "the compiled Decode skips it instead of waiting for the device."
    )
    SKILL = "host-syncs"
    FIXES = frozenset({"GM101"})

    def _already_guarded(self, node: cst.CSTNode) -> bool:
        current = self.get_metadata(cst.metadata.ParentNodeProvider, node, None)
        while current is not None and not isinstance(current, cst.FunctionDef):
            if isinstance(current, cst.If) and code_of(current.test).strip() == GUARD:
                return True
            current = self.get_metadata(cst.metadata.ParentNodeProvider, current, None)
        return False

    def _guard(self, original: cst.BaseStatement, updated: cst.BaseStatement) -> cst.BaseStatement:
        func = self.qualname(original)
        if not func or func.endswith("__init__") or not _is_check(original) or self._already_guarded(original):
            return updated
        self.record_edit(original, "host-side check runs only when not compiling")
        AddImportsVisitor.add_needed_import(self.context, "torch")
        comment = cst.EmptyLine(
            indent=True, comment=cst.Comment("# graphmode: checked in eager runs only; a compiled graph cannot read tensor values.")
        )
        return cst.If(
            test=cst.parse_expression(GUARD),
            body=cst.IndentedBlock(body=[updated.with_changes(leading_lines=[])]),
            leading_lines=[*updated.leading_lines, comment],
        )

    def leave_SimpleStatementLine(self, original_node, updated_node):
        return self._guard(original_node, updated_node)

    def leave_If(self, original_node, updated_node):
        return self._guard(original_node, updated_node)
