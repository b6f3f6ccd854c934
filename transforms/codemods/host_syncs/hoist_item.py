"""Moves eager-only statements out of the compiled region: host-side checks (`assert x.item() < n`,
`if t.item(): raise`), shape asserts, and debugging output (`print`, logging, `warnings.warn`).

They stay in eager runs (the original model, Prefill) and are skipped while Dynamo traces, so the
compiled Decode never waits for the device to hand a value to Python, nor breaks its graph to print.
Only functions a model step reaches are touched (see transforms.analysis.reach).
"""
from __future__ import annotations

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from graphmode.transforms.analysis.host_reads import SYNC_METHODS
from graphmode.transforms.codemods.base import StepCodemod
from graphmode.transforms.codemods.lib.helper_names import GUARD
from graphmode.transforms.cstutil import code_of, contains_call, dotted_name, reads_host_value

_COMMENT = "# graphmode: eager only (a host read or print)."
# `if torch.isnan(x).any(): raise ...` reads a tensor value on the host as surely as `.item()` does.
_VALUE_TESTS = ("any", "all")
_LOGGERS = frozenset({"logger", "logging", "log", "_logger", "LOGGER"})
_LOG_LEVELS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "warning_once",
                         "info_once"})
# A file naming none of these (and with no assert) has nothing to move.
_IDIOM_WORDS = frozenset({"print", "warn", *SYNC_METHODS, *_VALUE_TESTS, *_LOG_LEVELS})


def _is_guard(stmt: cst.BaseStatement | None) -> bool:
    return isinstance(stmt, cst.If) and stmt.orelse is None and code_of(stmt.test).strip() == GUARD


def _user_lines(stmt: cst.If) -> list[cst.EmptyLine]:
    """The guard's leading lines other than our own comment: they belong to the statement it wraps."""
    return [line for line in stmt.leading_lines if not (line.comment and line.comment.value == _COMMENT)]


def _is_debug_output(small: cst.BaseSmallStatement) -> bool:
    """`print(...)`, `logger.info(...)`, `logging.warning(...)`, `warnings.warn(...)` as a statement."""
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return False
    name = dotted_name(small.value.func) or ""
    owner, _, level = name.rpartition(".")
    return name == "print" or name == "warnings.warn" or (owner.split(".")[-1] in _LOGGERS and level in _LOG_LEVELS)


def _is_eager_only(stmt: cst.BaseStatement) -> bool:
    """An assert, debugging output, or an `if` that only raises on a host value: code that validates or
    reports and computes nothing the step returns."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return len(stmt.body) == 1 and (isinstance(stmt.body[0], cst.Assert) or _is_debug_output(stmt.body[0]))
    if isinstance(stmt, cst.If) and stmt.orelse is None and isinstance(stmt.body, cst.IndentedBlock):
        body = stmt.body.body
        return (
            (reads_host_value(stmt.test) or any(contains_call(stmt.test, m) for m in _VALUE_TESTS))
            and len(body) == 1
            and isinstance(body[0], cst.SimpleStatementLine)
            and isinstance(body[0].body[0], cst.Raise)
        )
    return False


class HoistItem(StepCodemod):
    NAME = "hoist_item"
    TITLE = "Run checks and debugging output in eager code only"
    DESCRIPTION = (
        "Wraps asserts, checks that read tensor values on the host (`if ...item(): raise`, "
        "`if x.isnan().any(): raise`) and debugging output (`print`, logging, `warnings.warn`) in step code in "
        "`if not torch.compiler.is_compiling():`. They still run in the eager original and in Prefill; the "
        "compiled Decode skips them instead of waiting for the device or breaking its graph."
    )
    SKILL = "host-syncs"
    FIXES = frozenset({"GM101", "GM104", "GM402", "GM602"})
    IDIOM_IN_ONE_FUNCTION = True

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return ":Assert" in words or not words.isdisjoint(_IDIOM_WORDS)

    def _already_guarded(self, node: cst.CSTNode) -> bool:
        current = self.get_metadata(cst.metadata.ParentNodeProvider, node, None)
        while current is not None and not isinstance(current, cst.FunctionDef):
            if isinstance(current, cst.If) and code_of(current.test).strip() == GUARD:
                return True
            current = self.get_metadata(cst.metadata.ParentNodeProvider, current, None)
        return False

    def _guard(self, original: cst.BaseStatement, updated: cst.BaseStatement) -> cst.BaseStatement:
        if not _is_eager_only(original) or not self.in_step_code(original) or self._already_guarded(original):
            return updated
        self.record_edit(original, "runs only when not compiling")
        AddImportsVisitor.add_needed_import(self.context, "torch")
        comment = cst.EmptyLine(indent=True, comment=cst.Comment(_COMMENT))
        return cst.If(
            test=cst.parse_expression(GUARD),
            body=cst.IndentedBlock(body=[updated.with_changes(leading_lines=[])]),
            leading_lines=[*updated.leading_lines, comment],
        )

    def leave_IndentedBlock(self, original_node, updated_node):
        """Consecutive guarded statements share one guard, as a person would write it."""
        merged: list[cst.BaseStatement] = []
        for stmt in updated_node.body:
            previous = merged[-1] if merged else None
            if _is_guard(stmt) and _is_guard(previous) and self._guarded_here(stmt):
                inner = [s.with_changes(leading_lines=[*_user_lines(stmt), *s.leading_lines]) if i == 0 else s
                         for i, s in enumerate(stmt.body.body)]
                merged[-1] = previous.with_changes(body=previous.body.with_changes(body=[*previous.body.body, *inner]))
            else:
                merged.append(stmt)
        return updated_node.with_changes(body=merged)

    def _guarded_here(self, stmt: cst.If) -> bool:
        return any(isinstance(line.comment, cst.Comment) and line.comment.value == _COMMENT
                   for line in stmt.leading_lines)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        return self._guard(original_node, updated_node)

    def leave_If(self, original_node, updated_node):
        return self._guard(original_node, updated_node)
