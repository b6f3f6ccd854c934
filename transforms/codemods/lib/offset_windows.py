"""Tables handed to a function that cuts them at an offset, given as rows at the positions on the static path.

Bloom-lineage attention reads the past length off the carried cache and hands it to a rotary helper, which cuts
the cos/sin tables at it:

    offset = past_key.shape[0]                                   # in attention, when a cache is handed in
    query, key = apply_rotary(query, key, cos, sin, offset=offset)

    def apply_rotary(q, k, cos, sin, offset: int = 0):
        cos, sin = cos[offset:q.shape[0] + offset, ...], sin[offset:q.shape[0] + offset, ...]

On the static path no cache is handed in (the buffers hold it), so that length is gone, and a Python int that
moves every step would recompile Decode anyway. The slots the entries write are the positions of the tokens
computed, so in the static copy the call gets the tables' rows at those slots and offset 0: the function's window
`T[0 : n]` of them is `T[offset : offset + n]` of the whole table, row for row.

The parameter is one the runtime evidence saw change every Decode step, and the function must use it only in such
windows (first dim, `T[P : E + P]` or `T[P : P + E]`, the rest whole) of tables that are its own parameters.
"""
from __future__ import annotations

import libcst as cst

from graphmode.transforms.cstutil import code_of, is_full_slice, nodes_of_type


def _window_table(subscript: cst.Subscript, offset: str) -> str | None:
    """The table's name when `subscript` is `T[P : E + P, ...]` or `T[P : P + E]` (P the offset); else None."""
    if not isinstance(subscript.value, cst.Name) or not subscript.slice:
        return None
    first, *rest = subscript.slice
    window = first.slice
    if not (isinstance(window, cst.Slice) and window.step is None and isinstance(window.lower, cst.Name)
            and window.lower.value == offset and isinstance(window.upper, cst.BinaryOperation)
            and isinstance(window.upper.operator, cst.Add)):
        return None
    sides = (window.upper.left, window.upper.right)
    if not any(isinstance(side, cst.Name) and side.value == offset for side in sides):
        return None
    whole = all(is_full_slice(e) or (isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Ellipsis))
                for e in rest)
    return subscript.value.value if whole else None


def windowed_tables(function: cst.FunctionDef, offset: str) -> set[str] | None:
    """The parameters of `function` it cuts at its parameter `offset`, when every use of `offset` is in such a
    window; None otherwise."""
    params = {p.name.value for p in function.params.params}
    uses = [n for n in nodes_of_type(function.body, cst.Name) if n.value == offset]
    tables: set[str] = set()
    covered = 0
    for subscript in nodes_of_type(function.body, cst.Subscript):
        table = _window_table(subscript, offset)
        if table is not None:
            tables.add(table)
            covered += sum(1 for n in nodes_of_type(subscript.slice[0], cst.Name) if n.value == offset)
    if not tables or covered != len(uses) or not tables <= params or offset not in params:
        return None
    return tables


def rows_at_slots(module: cst.Module, method: cst.FunctionDef, changing: set[tuple[str, str]],
                  slots: str) -> dict[cst.Call, tuple[cst.Call, str]]:
    """Calls in `method` of a function of `module` (by name, or by a local alias `f = function`) that cuts tables at
    an int parameter the evidence saw change every step (`changing`: (function, parameter)) -> (the call with the
    tables' rows at `slots` and offset 0, the function's name)."""
    functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    aliases = {}
    for assign in nodes_of_type(method.body, cst.Assign):
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        if isinstance(target, cst.Name) and isinstance(assign.value, cst.Name) and assign.value.value in functions:
            aliases[target.value] = assign.value.value
    found: dict[cst.Call, tuple[cst.Call, str]] = {}
    for call in nodes_of_type(method.body, cst.Call):
        if not isinstance(call.func, cst.Name):
            continue
        name = aliases.get(call.func.value, call.func.value)
        function = functions.get(name)
        if function is None:
            continue
        params = [p.name.value for p in function.params.params]
        for offset in (p for p in params if (name, p) in changing):
            tables = windowed_tables(function, offset)
            if tables is None:
                continue
            args = list(call.args)
            bound: dict[str, int] = {}
            for index, arg in enumerate(args):
                if arg.star:
                    break
                key = arg.keyword.value if arg.keyword is not None else (params[index] if index < len(params) else None)
                if key is not None:
                    bound[key] = index
            if offset not in bound or not tables <= set(bound):
                continue
            for table in tables:
                arg = args[bound[table]]
                args[bound[table]] = arg.with_changes(
                    value=cst.parse_expression(f"{code_of(arg.value).strip()}[{slots}]"))
            args[bound[offset]] = args[bound[offset]].with_changes(value=cst.Integer("0"))
            found[call] = (call.with_changes(args=args), name)
    return found
