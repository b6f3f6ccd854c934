"""Builds position tables (rotary cos/sin and the like) once, at the maximum length.

Recognises a method that builds a table from `torch.arange(length)` on every call, often with the
length read through `.item()`, and returns rows of it selected by a position tensor:

    seq_len = positions.max().item() + 1
    t = torch.arange(seq_len, device=positions.device)
    freqs = torch.outer(t, self.inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[positions], emb.sin()[positions]

The table statements move to a `graphmode_resize(self, max_batch_size, max_seq_len, like=None)` method beside it,
which `setup_caches` calls on every module that has one: the length becomes `max_seq_len`, the device the model's
(`like`), the tables non-persistent buffers, and the method only indexes them.

Also recognises the legacy Hugging Face rotary cache that grows on demand (transformers 4.36
`LlamaRotaryEmbedding`): `__init__` calls `self._set_cos_sin_cache(seq_len=..., ...)`, which sets
`self.max_seq_len_cached = seq_len` and registers `cos_cached` / `sin_cached`, and forward is

    if seq_len > self.max_seq_len_cached:
        self._set_cos_sin_cache(seq_len=seq_len, device=x.device, dtype=x.dtype)
    return self.cos_cached[:seq_len].to(dtype=x.dtype), self.sin_cached[:seq_len].to(dtype=x.dtype)

The call in `__init__` stays as it is (its tables cover the length the model names, which is as far as the
entry's `setup_caches` serves), the growth branch goes, and forward returns the whole tables, which callers index
by position (`cos[position_ids]`).
"""
from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import BUILT_TABLES, RESIZE, STATIC_PATH
from graphmode.transforms.codemods.lib.module import (
    BufferCodemod,
    append_to_init,
    defined_at_top,
    insert_after_imports,
    replace_method,
    self_attributes,
)
from graphmode.transforms.cstutil import (
    code_of,
    find_method,
    is_docstring,
    names_in,
    self_attribute_name,
    single_assignment,
    torch_call_name,
    walk,
)
from graphmode.transforms.dispatch import Transformer

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
    SIZES_BUFFERS = True
    TITLE = "Build position tables once, at the maximum length"
    DESCRIPTION = (
        "Moves a table built from `torch.arange(length)` on every call (rotary cos/sin) into a `graphmode_resize` "
        "method, which `setup_caches` calls: the tables are built once, for the positions it serves, and registered "
        "as non-persistent buffers. The method then only selects rows by the position tensor, so the length read "
        "with `.item()` is no longer needed. Values are identical. "
        "A rotary cache that grows on demand (`if seq_len > self.max_seq_len_cached: self._set_cos_sin_cache(...)`) "
        "keeps the tables `__init__` builds for the model's own length (as far as `setup_caches` serves), the "
        "growth branch (which re-registered the buffers and changed an int attribute, a recompile) goes, and "
        "forward returns the whole "
        "tables instead of the `[:seq_len]` slice, whose shape changed every step. Callers must select rows by "
        "position, as transformers' `apply_rotary_pos_emb` does with `cos[position_ids]`: rows 0..seq_len-1 are the "
        "same rows as before."
    )
    SKILL = "static-buffers"
    FIXES = frozenset({"GM101", "GM201", "GM401"})

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return "arange" in words or ":Gt" in words  # a table from arange, or `if L > self.cached:`

    def __init__(self, context, options) -> None:
        super().__init__(context, options)
        self._module_names: set[str] = set()
        self._calls_tables = False  # an `__init__` calls BUILT_TABLES, whose class the module then needs

    def visit_Module(self, node: cst.Module) -> None:
        for stmt in node.body:
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                self._module_names.add(stmt.name.value)
            elif isinstance(stmt, cst.SimpleStatementLine):
                self._module_names |= names_in(stmt)

    def rewrite_method(self, cls, updated, method, body):
        if method.name.value == "__init__" or find_method(cls, "__init__") is None:
            return None
        growth = _growth_branch(cls, method, body)
        if growth is not None:
            return self._rewrite_growing_cache(cls, updated, method, body, growth)
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
                self.record_manual(stmt, "a table statement reads a call argument; it cannot move to "
                                         "`graphmode_resize`")
                return None
            visible.add(assigned[0])
        if not all(names_in(t) <= visible for t in tables):
            return None
        if len([a for a in arange.args if a.keyword is None]) != 1:
            self.record_manual(body[arange_at],
                               "`torch.arange` with a start or step; only `arange(length)` is rewritten")
            return None

        taken = self_attributes(cls)
        names = [_buffer_name(t, taken, i) for i, t in enumerate(tables)]
        selects = ", ".join(f"self.{name}[{position}]" for name in names)
        new_body = [*docstring, cst.parse_statement(f"return {selects}\n").with_changes(
            leading_lines=[cst.EmptyLine(indent=True, comment=cst.Comment(
                "# graphmode: rows of the tables setup_caches built."))]
        )]
        self.record_edit(method, f"table built by setup_caches as buffers {', '.join(names)}")
        new_method = method.with_changes(body=method.body.with_changes(body=new_body))
        updated = replace_method(updated, method.name.value, new_method)
        params = method.params
        if [p.name.value for p in params.params] == ["self", position] and not params.kwonly_params \
                and not params.posonly_params and not isinstance(params.star_arg, cst.Param) and not params.star_kwarg:
            # The position is the method's only argument: its own code (the original, which the static path keeps
            # beside the rows it selects) builds the tables once `setup_caches` hands it every position, so nothing
            # is copied; `__init__` names the method and the tables.
            self._calls_tables = True
            listed = ", ".join(f'"{name}"' for name in names) + ("" if len(names) > 1 else ",")
            return append_to_init(updated, [cst.parse_statement(
                f"{BUILT_TABLES}(self.{method.name.value}, ({listed}))\n")],
                f"`{method.name.value}`'s tables, built once for every position.")
        # Else the tables, built by `setup_caches` for the positions it serves (a `graphmode_resize` method, which it
        # calls on every module that has one), on the device of the model's parameters (`like`).
        resize = cst.parse_statement(
            "class C:\n"
            f"    def {RESIZE}(self, max_batch_size, max_seq_len, like=None):\n"
            f'        """`{method.name.value}`\'s tables, built by `setup_caches` (added by graphmode)."""\n'
            "        pass\n").body.body[0]
        resize_statements = self._copied_tables(arange, arange_var, table_statements, tables, names)
        resize = resize.with_changes(body=resize.body.with_changes(body=[resize.body.body[0], *resize_statements]),
                                     leading_lines=[cst.EmptyLine(indent=False)])
        members = []
        for member in updated.body.body:
            members.append(member)
            if isinstance(member, cst.FunctionDef) and member.name.value == method.name.value:
                members.append(resize)
        return updated.with_changes(body=updated.body.with_changes(body=members))

    def finish_module(self, module: cst.Module) -> cst.Module:
        if self._calls_tables and not defined_at_top(module, STATIC_PATH):
            module = insert_after_imports(module, helper_statements(STATIC_PATH))
        return module

    @staticmethod
    def _copied_tables(arange, arange_var, table_statements, tables, names) -> list[cst.BaseStatement]:
        """The table statements, with the length `max_seq_len` and the model's device, and the buffers they make:
        for a method that takes more than the positions, which `setup_caches` cannot call."""
        resize_arange = arange.with_changes(args=[
            cst.Arg(cst.Name("max_seq_len"), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            *[a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for a in arange.args
              if a.keyword is not None and a.keyword.value != "device"],
            cst.Arg(cst.parse_expression("like.device"), keyword=cst.Name("device"),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))),
        ])
        resize_statements = [
            cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(arange_var))], resize_arange)]),
            *[s.with_changes(leading_lines=[]) for s in table_statements],
        ]
        for name, table in zip(names, tables):
            register = cst.parse_statement(f'self.register_buffer("{name}", TABLE, persistent=False)\n')
            resize_statements.append(register.visit(_ReplaceName("TABLE", table)))
        return resize_statements

    # -- a cache that grows on demand --------------------------------------------------------------
    def _rewrite_growing_cache(self, cls, updated, method, body, growth):
        branch, length, builder = growth
        docstring = body[:1] if body and is_docstring(body[0]) else []
        rest = body[len(docstring):]
        if rest[:1] != [branch] or len(rest) != 2:
            self.record_manual(branch, "the cache grows on demand, but forward does more than grow it and return "
                                       "slices of it; rewrite by hand")
            return None
        if len(branch.body.body) != 1 or _self_call(branch.body.body[0]) != builder.name.value:
            self.record_manual(branch, f"the growth branch does more than call `self.{builder.name.value}`")
            return None
        tables = _builder_tables(builder)
        slices = _sliced_tables(rest[1], length, tables)
        if slices is None:
            self.record_manual(rest[1], f"only `return self.T[:{length}]` of the tables `{builder.name.value}` "
                                        "registers (optionally cast with `.to(...)`) is rewritten")
            return None
        original_init = find_method(cls, "__init__").body.body
        calls = [i for i, s in enumerate(original_init) if _self_call(s) == builder.name.value]
        if len(calls) != 1 or _length_arg(original_init[calls[0]], builder) is None:
            self.record_manual(branch, f"`__init__` does not build the cache with one `self.{builder.name.value}(...)` "
                                       "call that passes the length")
            return None

        # __init__ is left as it is: the tables it builds cover the length it passes (the model's own limit), and
        # `setup_caches` serves no more positions than the config names.
        # forward: no growth, the whole tables.
        returned = _on_one_line(rest[1].visit(_WholeTables(slices)))
        comments = [line for line in rest[1].leading_lines if line.comment is not None]
        returned = returned.with_changes(leading_lines=[
            *branch.leading_lines, *comments,
            cst.EmptyLine(indent=True, comment=cst.Comment(
                "# graphmode: whole tables, every position; callers select rows by position.")),
        ])
        new_method = method.with_changes(body=method.body.with_changes(body=[*docstring, returned]))
        updated = replace_method(updated, method.name.value, new_method)
        attribute = _compared_attribute(branch.test)
        self.record_edit(branch, f"growth of `self.{attribute}` removed; the cache covers every position")
        self.record_edit(rest[1], f"returns the whole tables {', '.join(sorted(set(slices.values())))} instead of "
                                  f"`[:{length}]`; callers index them by position")
        return updated


def _on_one_line(stmt: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    """`return (a, b)` written over several lines, as one line: `return a, b` (shorter without its slices, it may fit
    where the original did not; transforms.output.line_wrap wraps it again where it does not)."""
    value = stmt.body[0].value if isinstance(stmt.body[0], cst.Return) else None
    if not isinstance(value, cst.Tuple) or "#" in code_of(value) \
            or any("\n" in code_of(e.value) for e in value.elements):
        return stmt  # a comment inside, or an element over several lines: kept as written
    flat = cst.parse_statement(f"return {', '.join(code_of(e.value).strip() for e in value.elements)}\n")
    return flat.with_changes(leading_lines=stmt.leading_lines)


def _compared_attribute(test: cst.BaseExpression) -> str | None:
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        return self_attribute_name(test.comparisons[0].comparator)
    return None


def _self_call(stmt: cst.CSTNode) -> str | None:
    """`self.M(...)` on a line of its own -> "M"."""
    if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, cst.Call)):
        return self_attribute_name(stmt.body[0].value.func)
    return None


def _growth_branch(cls: cst.ClassDef, method: cst.FunctionDef, body: list[cst.BaseStatement]):
    """`if L > self.A:` (L a parameter) whose body calls `self.M(...)`, M a method of the class that sets
    `self.A`: -> (the if, "L", M). None when the method has no such branch."""
    params = {p.name.value for p in method.params.params}
    for stmt in body:
        if not (isinstance(stmt, cst.If) and stmt.orelse is None and isinstance(stmt.test, cst.Comparison)
                and len(stmt.test.comparisons) == 1 and isinstance(stmt.test.comparisons[0].operator, cst.GreaterThan)
                and isinstance(stmt.test.left, cst.Name) and stmt.test.left.value in params):
            continue
        attribute = _compared_attribute(stmt.test)
        if attribute is None:
            continue
        for inner in stmt.body.body:
            builder = find_method(cls, name) if (name := _self_call(inner)) else None
            if builder is not None and attribute in _assigned_attributes(builder):
                return stmt, stmt.test.left.value, builder
    return None


def _assigned_attributes(func: cst.FunctionDef) -> set[str]:
    # A walk, not a CSTVisitor's visit (which builds every node again): the same targets.
    return {name for node in walk(func) if type(node) is cst.AssignTarget
            and (name := self_attribute_name(node.target)) is not None}


def _builder_tables(builder: cst.FunctionDef) -> set[str]:
    """Names the builder registers as buffers (or assigns as `self.X`)."""
    found = set(_assigned_attributes(builder))
    for node in walk(builder):
        if (type(node) is cst.Call and isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "register_buffer" and node.args
                and isinstance(node.args[0].value, cst.SimpleString)):
            found.add(node.args[0].value.evaluated_value)
    return found


def _length_arg(stmt: cst.SimpleStatementLine, builder: cst.FunctionDef) -> cst.Arg | None:
    """The argument of `self.M(...)` that binds M's first parameter after `self`."""
    params = [p.name.value for p in builder.params.params]
    if len(params) < 2 or params[0] != "self":
        return None
    args = stmt.body[0].value.args
    if any(a.star for a in args):
        return None
    keyword = [a for a in args if a.keyword is not None and a.keyword.value == params[1]]
    positional = [a for a in args if a.keyword is None]
    return keyword[0] if keyword else (positional[0] if positional else None)


def _is_prefix_slice(element: cst.SubscriptElement, length: str) -> bool:
    part = element.slice
    return (isinstance(part, cst.Slice) and part.step is None and isinstance(part.upper, cst.Name)
            and part.upper.value == length
            and (part.lower is None or (isinstance(part.lower, cst.Integer) and part.lower.value == "0")))


def _is_passthrough(element: cst.SubscriptElement) -> bool:
    part = element.slice
    if isinstance(part, cst.Slice):
        return part.lower is None and part.upper is None and part.step is None
    return isinstance(part, cst.Index) and isinstance(part.value, cst.Ellipsis)


def _sliced_tables(stmt: cst.BaseStatement, length: str, tables: set[str]) -> dict[cst.Subscript, str] | None:
    """`return self.A[:L].to(...), self.B[:L].to(...)` (or `[:, :, :L, ...]`) with A, B tables of the
    builder -> {subscript: table}; None for anything else."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Return)
            and stmt.body[0].value is not None):
        return None
    value = stmt.body[0].value
    items = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
    found: dict[cst.Subscript, str] = {}
    for item in items:
        while m.matches(item, m.Call(func=m.Attribute(attr=m.Name("to")))):
            item = item.func.value
        if not isinstance(item, cst.Subscript):
            return None
        table = self_attribute_name(item.value)
        prefix = [e for e in item.slice if _is_prefix_slice(e, length)]
        if (table not in tables or len(prefix) != 1
                or not all(e is prefix[0] or _is_passthrough(e) for e in item.slice)):
            return None
        found[item] = table
    return found or None


class _WholeTables(Transformer):
    def __init__(self, slices: dict[cst.Subscript, str]) -> None:
        self.slices = slices

    def leave_Subscript(self, original_node, updated_node):
        return updated_node.value if original_node in self.slices else updated_node


class _ReplaceName(Transformer):
    def __init__(self, name: str, replacement: cst.BaseExpression) -> None:
        self.name, self.replacement = name, replacement

    def leave_Name(self, original_node, updated_node):
        return self.replacement if original_node.value == self.name else updated_node
