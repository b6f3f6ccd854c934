"""Builds position tables (rotary cos/sin and the like) once, at the maximum length.

Recognises a method that builds a table from `torch.arange(length)` on every call, often with the
length read through `.item()`, and returns rows of it selected by a position tensor:

    seq_len = positions.max().item() + 1
    t = torch.arange(seq_len, device=positions.device)
    freqs = torch.outer(t, self.inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[positions], emb.sin()[positions]

The table statements move to the end of `__init__` with the length set to the maximum, the
tables become non-persistent buffers, and the method only indexes them.
"""
from __future__ import annotations

import libcst as cst

from transforms.codemods._module import BufferCodemod, append_to_init, replace_method, self_attributes
from transforms.codemods.base import MAX_SEQ_LEN_CONSTANT
from transforms.cstutil import find_method, is_docstring, names_in, single_assignment, torch_call_name

_ALWAYS_VISIBLE = frozenset({"self", "torch", "math", "float", "int", "None", "True", "False"})


def _indexed_tables(stmt: cst.BaseStatement, param_names: set[str]) -> tuple[list[cst.BaseExpression], str] | None:
    """`return A[pos], B[pos]` -> ([A, B], "pos") when pos is a parameter."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Return)):
        return None
    value = stmt.body[0].value
    items = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
    tables, index = [], None
    for item in items:
        if not (isinstance(item, cst.Subscript) and len(item.slice) == 1):
            return None
        slice_value = item.slice[0].slice
        if not (isinstance(slice_value, cst.Index) and isinstance(slice_value.value, cst.Name)):
            return None
        name = slice_value.value.value
        if name not in param_names or (index is not None and name != index):
            return None
        tables.append(item.value)
        index = name
    return (tables, index) if index else None


def _buffer_name(table: cst.BaseExpression, taken: set[str], position: int) -> str:
    if isinstance(table, cst.Call) and isinstance(table.func, cst.Attribute):
        base = table.func.attr.value
    elif isinstance(table, cst.Name):
        base = table.value
    else:
        base = f"table{position}"
    name = f"{base}_cached"
    while name in taken:
        name = f"_{name}"
    taken.add(name)
    return name


class StaticRotary(BufferCodemod):
    NAME = "static_rotary"
    TITLE = "Build position tables once, at the maximum length"
    DESCRIPTION = (
        "Moves a table built from `torch.arange(length)` on every call (rotary cos/sin) into `__init__`, "
        f"built once for `{MAX_SEQ_LEN_CONSTANT}` positions and registered as non-persistent buffers. "
        "The method then only selects rows by the position tensor, so the length read with `.item()` is no "
        "longer needed. Values are identical; positions past the maximum now raise an index error."
    )
    SKILL = "static-buffers"
    FIXES = frozenset({"GM101", "GM201"})

    def __init__(self, context, options) -> None:
        super().__init__(context, options)
        self._module_names: set[str] = set()

    def visit_Module(self, node: cst.Module) -> None:
        for stmt in node.body:
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                self._module_names.add(stmt.name.value)
            elif isinstance(stmt, cst.SimpleStatementLine):
                self._module_names |= names_in(stmt)

    def rewrite_method(self, cls, updated, method, body):
        if method.name.value == "__init__" or find_method(cls, "__init__") is None:
            return None
        docstring = body[:1] if body and is_docstring(body[0]) else []
        body = body[len(docstring):]
        params = {p.name.value for p in method.params.params}
        found = _indexed_tables(body[-1], params)
        arange_at = next(
            (i for i, s in enumerate(body) if (a := single_assignment(s)) and torch_call_name(a[1]) == "arange"), None
        )
        if found is None or arange_at is None or arange_at + 1 >= len(body):
            return None
        tables, position = found
        arange_var, arange = single_assignment(body[arange_at])
        table_statements = body[arange_at + 1 : -1]
        # Everything before the arange must only compute its length; everything after it, only the table.
        length_names = {a[0] for s in body[:arange_at] if (a := single_assignment(s))}
        if len(length_names) != arange_at or any(
            names_in(s) & length_names for s in [*table_statements, body[-1]]
        ):
            return None
        visible = set(_ALWAYS_VISIBLE | self._module_names | {arange_var})
        for stmt in table_statements:
            assigned = single_assignment(stmt)
            if assigned is None or not names_in(assigned[1]) <= visible:
                self.record_manual(stmt, "a table statement reads a call argument; it cannot move to __init__")
                return None
            visible.add(assigned[0])
        if not all(names_in(t) <= visible for t in tables):
            return None
        if len([a for a in arange.args if a.keyword is None]) != 1:
            self.record_manual(body[arange_at], "`torch.arange` with a start or step; only `arange(length)` is rewritten")
            return None

        # The table, built in __init__ at the maximum length; `device=` went with the call's inputs.
        init_arange = arange.with_changes(
            args=[
                cst.Arg(cst.Name(MAX_SEQ_LEN_CONSTANT)),
                *[a for a in arange.args if a.keyword is not None and a.keyword.value != "device"],
            ]
        )
        init_arange_args = list(init_arange.args)
        init_arange_args[-1] = init_arange_args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        init_statements = [
            cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(arange_var))], init_arange.with_changes(args=init_arange_args))]),
            *[s.with_changes(leading_lines=[]) for s in table_statements],
        ]
        taken = self_attributes(cls)
        names = [_buffer_name(t, taken, i) for i, t in enumerate(tables)]
        for name, table in zip(names, tables):
            register = cst.parse_statement(f'self.register_buffer("{name}", TABLE, persistent=False)\n')
            init_statements.append(register.visit(_ReplaceName("TABLE", table)))

        selects = ", ".join(f"self.{name}[{position}]" for name in names)
        new_body = [*docstring, cst.parse_statement(f"return {selects}\n").with_changes(
            leading_lines=[cst.EmptyLine(indent=True, comment=cst.Comment(
                "# graphmode: the table is built once in __init__, for every position Decode can reach."))]
        )]
        self.record_edit(method, f"table moved to __init__ as buffers {', '.join(names)}")
        new_method = method.with_changes(body=method.body.with_changes(body=new_body))
        updated = replace_method(updated, method.name.value, new_method)
        return append_to_init(updated, init_statements, f"`{method.name.value}` tables, built once at the maximum length.")



class _ReplaceName(cst.CSTTransformer):
    def __init__(self, name: str, replacement: cst.BaseExpression) -> None:
        self.name, self.replacement = name, replacement

    def leave_Name(self, original_node, updated_node):
        return self.replacement if original_node.value == self.name else updated_node
