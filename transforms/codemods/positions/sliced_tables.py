"""Selects rows of a table precomputed in `__init__` by the position tensor instead of a slice.

Recognises, in a method that takes a position `P`, a slice of a table the class builds in `__init__`

    self.freqs_cis = precompute_freqs_cis(dim, params.max_seq_len * 2, theta)   # __init__
    freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]                 # forward

and turns the slice into `self.freqs_cis[input_pos]`: the same rows, selected by a tensor, so the
step number is data rather than a constant Dynamo guards on. The table, as the model builds it, becomes a buffer
(`graphmode_table_buffers`: it then follows the model's device, so `self.freqs_cis = self.freqs_cis.to(...)` in the
method is dropped), and `setup_caches` serves no more positions than it has rows.
"""
from __future__ import annotations

import libcst as cst

from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import TABLE_BUFFERS
from graphmode.transforms.codemods.lib.module import (
    BufferCodemod,
    ReplaceNodes,
    defined_at_top,
    insert_after_imports,
    moves_to_device,
    replace_method,
)
from graphmode.transforms.cstutil import (
    POSITION_TENSOR,
    code_of,
    find_method,
    is_position_window,
    position_param,
    self_attribute_name,
    string_tuple,
)

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


class SlicedTables(BufferCodemod):
    NAME = "sliced_tables"
    SIZES_BUFFERS = True
    TITLE = "Select precomputed table rows by the position tensor"
    DESCRIPTION = (
        "Replaces `self.table[start_pos : start_pos + n]` (a rotary table precomputed in `__init__`, sliced by the "
        f"Python-int position) with `self.table[{POSITION_TENSOR}]`, the same rows selected by the position tensor. "
        "The table, as the model builds it, becomes a non-persistent buffer, so the per-call `.to(device)` "
        "reassignment is dropped, and `setup_caches` refuses more positions than it has rows. Values are identical."
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
        plans: dict[str, tuple[cst.SimpleStatementLine, cst.BaseExpression]] = {}
        for attribute in attributes:
            site = next(w for w in windows if self_attribute_name(w.value) == attribute)
            found = _table_statement(init, attribute)
            if found is None:
                self.record_manual(site, f"`self.{attribute}` is sliced by the position but not built in __init__")
                return None
            plans[attribute] = found

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

        # __init__: the model's own tables, as built, made buffers whose rows setup_caches reads as a limit.
        current_init = find_method(updated, "__init__")
        built = {code_of(stmt) for stmt, _ in plans.values()}
        last = max(i for i, s in enumerate(current_init.body.body) if code_of(s) in built)
        call = cst.parse_statement(f"{TABLE_BUFFERS}(self, {string_tuple(list(plans))})\n").with_changes(
            leading_lines=[cst.EmptyLine(indent=True, comment=cst.Comment(
                "# graphmode: buffers; setup_caches serves no more positions than their rows."))])
        for attribute, (stmt, _) in plans.items():
            self.record_edit(stmt, f"`self.{attribute}` made a buffer; setup_caches serves no more positions than "
                                   "its rows")
        body = list(current_init.body.body)
        return replace_method(updated, "__init__", current_init.with_changes(
            body=current_init.body.with_changes(body=[*body[:last + 1], call, *body[last + 1:]])))

    def finish_module(self, module: cst.Module) -> cst.Module:
        if defined_at_top(module, TABLE_BUFFERS):
            return module
        return insert_after_imports(module, helper_statements(TABLE_BUFFERS))


