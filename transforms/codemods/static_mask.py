"""Replaces a causal mask built inside forward with one buffer built once.

Recognises, in a method that takes a position, the usual construction

    mask = None
    if seqlen > 1:
        mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device)
        mask = torch.triu(mask, diagonal=1)
        mask = torch.hstack([torch.zeros((seqlen, start_pos), device=tokens.device), mask])

(with or without the guard) and turns it into `mask = self.causal_mask[input_pos]`: the rows of a
(max_len, max_len) mask for the positions being computed. Columns past each position are hidden,
which also hides the not-yet-written slots of a static KV cache.
"""
from __future__ import annotations

import libcst as cst

from transforms.codemods._module import BufferCodemod, append_to_init, replace_method, self_attributes
from transforms.codemods.base import MAX_SEQ_LEN_CONSTANT
from transforms.cstutil import (
    POSITION_TENSOR,
    find_method,
    names_in,
    position_param,
    single_assignment,
    torch_call_name,
)

_FILL_NAMES = frozenset({"float", "torch", "math"})


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    found: list[cst.Call] = []

    class _Collector(cst.CSTVisitor):
        def visit_Call(self, n: cst.Call) -> None:
            found.append(n)

    node.visit(_Collector())
    return found


def _call_name(call: cst.Call) -> str | None:
    """"triu" for both `torch.triu(x, 1)` and `x.triu(1)`."""
    return torch_call_name(call) or (call.func.attr.value if isinstance(call.func, cst.Attribute) else None)


class _MaskBuild:
    """Statements [first, last] of a body that build one causal mask, and what the buffer needs."""

    def __init__(self, name: str, first: int, last: int, fill: cst.BaseExpression, diagonal: cst.BaseExpression,
                 dtype: cst.Arg | None) -> None:
        self.name, self.first, self.last, self.fill, self.diagonal, self.dtype = name, first, last, fill, diagonal, dtype


def _read_mask_statements(name: str, statements: list[cst.BaseStatement]) -> _MaskBuild | None:
    """Fill value, diagonal and dtype when every statement assigns `name` through full + triu."""
    if not statements or not all((a := single_assignment(s)) and a[0] == name for s in statements):
        return None
    calls = [c for s in statements for c in _calls(s)]
    full = next((c for c in calls if torch_call_name(c) == "full"), None)
    triu = next((c for c in calls if _call_name(c) == "triu"), None)
    if full is None or triu is None or len(full.args) < 2:
        return None
    fill = full.args[1].value
    if not names_in(fill) <= _FILL_NAMES:
        return None
    positional = [a for a in triu.args if a.keyword is None]
    keyword = {a.keyword.value: a.value for a in triu.args if a.keyword is not None}
    offset = 1 if torch_call_name(triu) else 0  # torch.triu(x, d) vs x.triu(d)
    diagonal = keyword.get("diagonal") or (positional[offset].value if len(positional) > offset else cst.Integer("0"))
    dtype = next((a for a in full.args if a.keyword is not None and a.keyword.value == "dtype"), None)
    return _MaskBuild(name, 0, 0, fill, diagonal, dtype)


def _find_mask(body: list[cst.BaseStatement]) -> _MaskBuild | None:
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.If) and stmt.orelse is None and isinstance(stmt.body, cst.IndentedBlock):
            inner = list(stmt.body.body)
            target = single_assignment(inner[0]) if inner else None
            build = _read_mask_statements(target[0], inner) if target else None
            if build:
                before = single_assignment(body[i - 1]) if i else None
                starts_with_none = before and before[0] == build.name and isinstance(before[1], cst.Name) \
                    and before[1].value == "None"
                build.first, build.last = (i - 1 if starts_with_none else i), i
                return build
        first = single_assignment(stmt)
        if first and torch_call_name(first[1]) == "full":
            last = i
            while last + 1 < len(body) and (a := single_assignment(body[last + 1])) and a[0] == first[0]:
                last += 1
            build = _read_mask_statements(first[0], body[i : last + 1])
            if build:
                build.first, build.last = i, last
                return build
    return None


class StaticMask(BufferCodemod):
    NAME = "static_mask"
    TITLE = "Pre-build the causal mask as a buffer"
    DESCRIPTION = (
        "Replaces the causal mask built on every call (`torch.full` + `triu`, often only when the input is "
        f"longer than one token) with a `({MAX_SEQ_LEN_CONSTANT}, {MAX_SEQ_LEN_CONSTANT})` buffer built once in "
        "`__init__`; each call selects the rows of its positions. Decode now gets a mask too, which hides the "
        "unwritten slots of the static KV cache. Scores are unchanged for every written position."
    )
    SKILL = "static-buffers"
    FIXES = frozenset({"GM201", "GM401"})
    REQUIRES = ("static_positions",)

    def rewrite_method(self, cls, updated_node, method, body):
        build = _find_mask(body)
        if build is None:
            return None
        if position_param(method) is None:
            self.record_manual(body[build.first], "a causal mask is built here, but the method takes no position")
            return None
        if find_method(cls, "__init__") is None:
            self.record_manual(body[build.first], "the class has no __init__ to build the mask buffer in")
            return None
        buffer = "causal_mask"
        while buffer in self_attributes(cls):
            buffer = f"graphmode_{buffer}"
        select = cst.parse_statement(f"{build.name} = self.{buffer}[{POSITION_TENSOR}]\n").with_changes(
            leading_lines=[
                *body[build.first].leading_lines,
                cst.EmptyLine(indent=True, comment=cst.Comment(
                    "# graphmode: rows of the prebuilt mask; later columns stay hidden, written or not.")),
            ]
        )
        for stmt in body[build.first : build.last + 1]:
            self.record_edit(stmt, f"`{build.name}` selected from the `{buffer}` buffer by position")
        new_body = [*body[: build.first], select, *body[build.last + 1 :]]
        updated_node = replace_method(updated_node, method.name.value, method.with_changes(
            body=method.body.with_changes(body=new_body)))
        dtype = f", dtype={cst.Module([]).code_for_node(build.dtype.value)}" if build.dtype else ""
        fill = cst.Module([]).code_for_node(build.fill)
        diagonal = cst.Module([]).code_for_node(build.diagonal)
        init_lines = list(cst.parse_module(
            f"{buffer} = torch.full(({MAX_SEQ_LEN_CONSTANT}, {MAX_SEQ_LEN_CONSTANT}), {fill}{dtype})\n"
            f'self.register_buffer("{buffer}", {buffer}.triu({diagonal}), persistent=False)\n'
        ).body)
        return append_to_init(updated_node, init_lines, "the causal mask for every position, built once.")
