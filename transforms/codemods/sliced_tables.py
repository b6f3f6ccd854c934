"""Selects rows of a table precomputed in `__init__` by the position tensor instead of a slice.

Recognises, in a method that takes a position `P`, a slice of a table the class builds in `__init__`

    self.freqs_cis = precompute_freqs_cis(dim, params.max_seq_len * 2, theta)   # __init__
    freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]                 # forward

and turns the slice into `self.freqs_cis[input_pos]`: the same rows, selected by a tensor, so the
step number is data rather than a constant Dynamo guards on. The table becomes a non-persistent
buffer (it then follows the model's device, so `self.freqs_cis = self.freqs_cis.to(...)` in the
method is dropped), and its length argument, the one that names the maximum length, is raised to at
least `GRAPHMODE_MAX_SEQ_LEN`. A table whose length argument cannot be told is left to a person.
"""
from __future__ import annotations

import re

import libcst as cst

from graphmode.transforms.codemods._module import BufferCodemod, ReplaceNodes, moves_to_device, replace_method
from graphmode.transforms.codemods.base import MAX_SEQ_LEN_CONSTANT
from graphmode.transforms.cstutil import (
    POSITION_TENSOR,
    code_of,
    find_method,
    is_position_window,
    position_param,
    self_attribute_name,
)

_LENGTH = re.compile(r"max_(seq|position|len)")


def _windows(method: cst.FunctionDef, name: str) -> list[cst.Subscript]:
    """Every `self.A[P : P + n]` in the method."""
    found: list[cst.Subscript] = []

    class _Collector(cst.CSTVisitor):
        def visit_Subscript(self, node: cst.Subscript) -> None:
            if self_attribute_name(node.value) and len(node.slice) == 1 and is_position_window(node.slice[0], name):
                found.append(node)

    method.visit(_Collector())
    return found


def _table_statement(init: cst.FunctionDef,
                     attribute: str) -> tuple[cst.SimpleStatementLine, cst.BaseExpression] | None:
    """The `__init__` statement that builds the table (`self.A = X` or `self.register_buffer("A", X, ...)`)
    and the expression X."""
    for stmt in init.body.body:
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
            continue
        small = stmt.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1 \
                and self_attribute_name(small.targets[0].target) == attribute:
            return stmt, small.value
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            call = small.value
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "register_buffer" \
                    and self_attribute_name(call.func) and len(call.args) >= 2 \
                    and isinstance(call.args[0].value, cst.SimpleString) \
                    and call.args[0].value.evaluated_value == attribute:
                return stmt, call.args[1].value
    return None


def _length_args(table: cst.BaseExpression) -> list[cst.Arg]:
    """Arguments anywhere in the table expression that name the maximum length."""
    found: list[cst.Arg] = []

    class _Collector(cst.CSTVisitor):
        def visit_Arg(self, node: cst.Arg) -> None:
            if _LENGTH.search(code_of(node.value)):
                found.append(node)

    table.visit(_Collector())
    return found


class SlicedTables(BufferCodemod):
    NAME = "sliced_tables"
    SIZES_BUFFERS = True
    TITLE = "Select precomputed table rows by the position tensor"
    DESCRIPTION = (
        "Replaces `self.table[start_pos : start_pos + n]` (a rotary table precomputed in `__init__`, sliced by the "
        f"Python-int position) with `self.table[{POSITION_TENSOR}]`, the same rows selected by the position tensor. "
        "The table becomes a non-persistent buffer built for at least "
        f"`{MAX_SEQ_LEN_CONSTANT}` positions, so the per-call `.to(device)` reassignment is dropped. Values are "
        "identical; positions past the table now raise an index error."
    )
    SKILL = "positions-as-tensors"
    FIXES = frozenset({"GM302"})

    @classmethod
    def may_apply(cls, source, options) -> bool:
        return source.has_position_param
    REQUIRES = ("static_positions",)

    def rewrite_method(self, cls, updated, method, body):
        param = position_param(method)
        init = find_method(cls, "__init__")
        if method.name.value == "__init__" or param is None:
            return None
        windows = _windows(method, param.name.value)
        if not windows:
            return None
        if init is None:
            self.record_manual(windows[0], "a table sliced by the position, but the class has no __init__ building it")
            return None
        attributes = list(dict.fromkeys(self_attribute_name(w.value) for w in windows))
        plans: dict[str, tuple[cst.SimpleStatementLine, cst.BaseExpression, cst.Arg]] = {}
        for attribute in attributes:
            site = next(w for w in windows if self_attribute_name(w.value) == attribute)
            found = _table_statement(init, attribute)
            if found is None:
                self.record_manual(site, f"`self.{attribute}` is sliced by the position but not built in __init__")
                return None
            lengths = _length_args(found[1])
            if len(lengths) != 1:
                self.record_manual(site, f"cannot tell which argument sets the length of `self.{attribute}`, so "
                                         f"that it covers {MAX_SEQ_LEN_CONSTANT} positions")
                return None
            plans[attribute] = (found[0], found[1], lengths[0])

        # The method: slices become indexes; device moves of the (now buffer) tables go.
        replace: dict[cst.CSTNode, cst.CSTNode] = {}
        for window in windows:
            replace[window] = window.with_changes(slice=[cst.SubscriptElement(cst.Index(cst.Name(POSITION_TENSOR)))])
            self.record_edit(window, f"`{code_of(window)}` becomes `self.{self_attribute_name(window.value)}"
                                     f"[{POSITION_TENSOR}]`")
        drop = {s for s in body for a in attributes if moves_to_device(s, a)}
        for stmt in drop:
            self.record_edit(stmt, "device move dropped: the table is a buffer and follows the model")
        new_method = method.visit(ReplaceNodes(replace, drop))
        updated = replace_method(updated, method.name.value, new_method)

        # __init__: the table registered as a buffer, at least GRAPHMODE_MAX_SEQ_LEN long.
        init_replace: dict[cst.CSTNode, cst.CSTNode] = {}
        for attribute, (stmt, table, length) in plans.items():
            wrapped = length.with_changes(value=cst.parse_expression(
                f"max({code_of(length.value)}, {MAX_SEQ_LEN_CONSTANT})"))
            table = table.visit(ReplaceNodes({length: wrapped}, set()))
            small = stmt.body[0]
            if isinstance(small, cst.Assign):
                register = cst.parse_statement(f'self.register_buffer("{attribute}", TABLE, persistent=False)\n')
                new_stmt = register.visit(ReplaceNodes({register.body[0].value.args[1].value: table}, set()))
                new_stmt = new_stmt.with_changes(leading_lines=stmt.leading_lines)
            else:
                call = small.value
                args = list(call.args)
                args[1] = args[1].with_changes(value=table)
                new_stmt = stmt.with_changes(body=[small.with_changes(value=call.with_changes(args=args))])
            init_replace[stmt] = new_stmt
            self.record_edit(stmt, f"`self.{attribute}` registered as a buffer covering {MAX_SEQ_LEN_CONSTANT}")
        current_init = find_method(updated, "__init__")
        by_code = {code_of(k): v for k, v in init_replace.items()}
        new_body = [by_code.get(code_of(s), s) for s in current_init.body.body]
        return replace_method(updated, "__init__", current_init.with_changes(
            body=current_init.body.with_changes(body=new_body)))
