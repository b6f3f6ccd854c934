"""Replaces a causal mask built inside forward with one buffer built once.

Recognises, in a method that takes a position, the usual construction

    mask = None
    if seqlen > 1:
        mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device)
        mask = torch.triu(mask, diagonal=1)
        mask = torch.hstack([torch.zeros((seqlen, start_pos), device=tokens.device), mask])

(with or without the guard; a fix-up for one kind of device inside it, `if mask.device.type == "mps": ...`,
goes with it) and turns it into `mask = self.causal_mask[input_pos]`: the rows of a
(max_len, max_len) mask for the positions being computed. Columns past each position are hidden,
which also hides the not-yet-written slots of a static KV cache.

Two more forms get the same treatment:

    mask = torch.tril(torch.ones(seqlen, seqlen, dtype=torch.bool))    # or torch.ones(...).tril(), .view(...)
    mask = _make_causal_mask(seqlen, start_pos)                        # or self._make_causal_mask(...)

The boolean form becomes a `torch.ones(max_len, max_len, dtype=torch.bool).tril()` buffer. A helper call
is rewritten only when the helper is defined in the same file and builds one of the two masks (full +
triu or tril of ones, with the past columns prepended); the helper itself stays.

An additive `-inf` mask (full + triu) whose every use in the file is seen becomes boolean too, the form
hand-written graph-mode code uses (gpt-fast): a `tril` buffer of booleans, True where a column is
visible, and each `scores + mask` becomes `scores.masked_fill(~mask, float("-inf"))`. Adding 0 or -inf
and filling with -inf give the same scores, bit for bit. The uses are followed by name: through the
functions of the file that take a parameter of that name, where the mask may only be added, tested
against None, or passed on to a call defined in the file (or to `scaled_dot_product_attention`, whose
boolean masks mean the same). Any other use, a mask that leaves the file (returned, stored), a
parameter of another `*mask*` name, or a finite fill (`finfo.min`) keeps the additive float mask.
Why it matters: Inductor rewrites matmul + additive mask + softmax + matmul into its CPU flash
attention kernel, which at Decode sizes (one query row) is slower than the fused softmax it generates
for `masked_fill` (bench/three_way.py).
"""
from __future__ import annotations

import builtins
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from graphmode.transforms.codemods._module import BufferCodemod, append_to_init, replace_method, self_attributes
from graphmode.transforms.codemods.base import MAX_SEQ_LEN_CONSTANT
from graphmode.transforms.cstutil import (
    POSITION_TENSOR,
    code_of,
    find_method,
    is_docstring,
    names_in,
    position_param,
    self_attribute_name,
    single_assignment,
    torch_call_name,
)
from graphmode.transforms.vocabulary import SAME_FILE_MASK_HELPERS, is_position_name

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
    """Statements [first, last] of a body that build one causal mask, and what the buffer needs.

    `kind` is "full" (a float mask: full + triu) or "ones" (a boolean one: tril of ones). `cast` is code
    appended to the row selection; `checked_uses` asks that later uses tolerate the new shape."""

    def __init__(self, name: str, first: int, last: int, fill: cst.BaseExpression | None,
                 diagonal: cst.BaseExpression | str, dtype: cst.Arg | str | None, kind: str = "full",
                 cast: str = "", checked_uses: bool = False) -> None:
        self.name, self.first, self.last, self.fill, self.diagonal, self.dtype = name, first, last, fill, diagonal, dtype
        self.kind, self.cast, self.checked_uses = kind, cast, checked_uses


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
    written = keyword.get("diagonal") or (positional[offset].value if len(positional) > offset else None)
    # `diagonal=start_pos + 1` counts from the cache's first column: in the absolute buffer it is 1.
    past = {n for n in (names_in(written) if written else ()) if is_position_name(n, None) or n.startswith("past")}
    diagonal = _relative_diagonal(written, past)
    if diagonal is None:
        return None
    dtype = next((a for a in full.args if a.keyword is not None and a.keyword.value == "dtype"), None)
    return _MaskBuild(name, 0, 0, fill, diagonal, dtype)


def _find_mask(body: list[cst.BaseStatement], read_other=None) -> _MaskBuild | str | None:
    """The first mask built in body, a reason when one is recognised only in part, or None.
    `read_other(name, statements)` reads the forms other than full + triu, with the same result type."""
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.If) and stmt.orelse is None and isinstance(stmt.body, cst.IndentedBlock):
            target = single_assignment(stmt.body.body[0]) if stmt.body.body else None
            inner = [s for s in stmt.body.body if not (target and _device_fixup(s, target[0]))]
            build = _read_mask_statements(target[0], inner) if target else None
            if build is None and target and read_other is not None:
                build = read_other(target[0], inner)
                if isinstance(build, str):
                    return build
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
        if first and read_other is not None:
            last = i
            while last + 1 < len(body) and (a := single_assignment(body[last + 1])) and a[0] == first[0]:
                last += 1
            while last >= i:  # the longest run of assignments that builds the mask; later ones stay
                build = read_other(first[0], body[i : last + 1])
                if isinstance(build, str):
                    return build
                if build:
                    build.first, build.last = i, last
                    return build
                last -= 1
    return None


def _device_fixup(stmt: cst.BaseStatement, name: str) -> bool:
    """`if mask.device.type == "mps": mask = torch.nan_to_num(mask, ...)`: a fix-up of the mask for one kind of
    device (Meta's reference code works around `triu` on mps); a buffer built once needs none."""
    return isinstance(stmt, cst.If) and stmt.orelse is None and ".device.type" in code_of(stmt.test) \
        and isinstance(stmt.body, cst.IndentedBlock) \
        and all((a := single_assignment(s)) and a[0] == name for s in stmt.body.body)


# -- boolean masks: tril of ones -------------------------------------------------------------------
_SHAPE_ONLY = frozenset({"view", "reshape", "unsqueeze", "expand"})  # rows by position broadcast instead
_HELPER_NAME = re.compile(r"^_?(make|build|create|get)_causal_mask$")
_HELPER_CALLS = frozenset({"full", "triu", "ones", "tril", "zeros", "cat", "concat", "hstack", "to", "type_as",
                           "bool", "view", "reshape", "unsqueeze", "expand", "finfo", "float", "size"})
_CASTS = frozenset({"to", "type_as", "bool"})


def _relative_diagonal(diagonal: cst.BaseExpression | None, past: set[str]) -> str | None:
    """The diagonal of the (max, max) buffer: a literal stays; `P` or `P + k` (P a past length, so the
    columns include the cache) becomes 0 or k. None for anything else."""
    if diagonal is None:
        return "0"
    if isinstance(diagonal, cst.Integer) or (
            isinstance(diagonal, cst.UnaryOperation) and isinstance(diagonal.expression, cst.Integer)):
        return code_of(diagonal)
    if isinstance(diagonal, cst.Name) and diagonal.value in past:
        return "0"
    if isinstance(diagonal, cst.BinaryOperation) and isinstance(diagonal.operator, cst.Add):
        for side, other in ((diagonal.left, diagonal.right), (diagonal.right, diagonal.left)):
            if isinstance(side, cst.Name) and side.value in past and isinstance(other, cst.Integer):
                return other.value
    return None


def _diagonal_arg(call: cst.Call) -> cst.BaseExpression | None:
    keyword = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    positional = [a for a in call.args if a.keyword is None]
    offset = 1 if torch_call_name(call) else 0  # torch.tril(x, d) vs x.tril(d)
    return keyword.get("diagonal") or (positional[offset].value if len(positional) > offset else None)


def _read_ones_tril(calls: list[cst.Call], past: set[str]) -> tuple[str, str | None] | str | None:
    """(diagonal, dtype code) for calls that build `tril(ones(...))`; a reason when the diagonal or the
    dtype cannot be carried to `__init__`; None when they do not build one."""
    ones = [c for c in calls if torch_call_name(c) == "ones"]
    tril = [c for c in calls if _call_name(c) == "tril"]
    if len(ones) != 1 or len(tril) != 1 or any(_call_name(c) in ("triu", "full") for c in calls):
        return None
    sizes = [a for a in ones[0].args if a.keyword is None]
    if not (len(sizes) == 2 or (len(sizes) == 1 and isinstance(sizes[0].value, (cst.Tuple, cst.List))
                                and len(sizes[0].value.elements) == 2)):
        return None
    diagonal = _relative_diagonal(_diagonal_arg(tril[0]), past)
    if diagonal is None:
        return f"the mask's diagonal `{code_of(_diagonal_arg(tril[0]))}` is not a constant or the past length"
    dtype_arg = next((a.value for a in ones[0].args if a.keyword is not None and a.keyword.value == "dtype"), None)
    if dtype_arg is not None and not names_in(dtype_arg) <= {"torch"}:
        return f"the mask's dtype `{code_of(dtype_arg)}` is only known at call time"
    dtype = code_of(dtype_arg) if dtype_arg is not None else (
        "torch.bool" if any(_call_name(c) == "bool" for c in calls) else None)
    return diagonal, dtype


def _read_bool_statements(name: str, statements: list[cst.BaseStatement], past: set[str]) -> _MaskBuild | str | None:
    if not statements or not all((a := single_assignment(s)) and a[0] == name for s in statements):
        return None
    calls = [c for s in statements for c in _calls(s)]
    if any(_call_name(c) not in ({"ones", "tril", "bool"} | _SHAPE_ONLY) for c in calls):
        return None
    read = _read_ones_tril(calls, past)
    if read is None or isinstance(read, str):
        return read
    diagonal, dtype = read
    return _MaskBuild(name, 0, 0, None, diagonal, dtype, kind="ones", checked_uses=True)


# -- helper calls: mask = _make_causal_mask(...) ---------------------------------------------------
def _helper_call(statements: list[cst.BaseStatement]) -> tuple[str, cst.Call] | None:
    """`name = [self.]make_causal_mask(...)` alone -> (name, the call)."""
    if len(statements) != 1 or (a := single_assignment(statements[0])) is None or not isinstance(a[1], cst.Call):
        return None
    func = a[1].func
    helper = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
    return (a[0], a[1]) if helper and _HELPER_NAME.match(helper) else None


def _bind(helper: cst.FunctionDef, call: cst.Call, skip_self: bool) -> dict[str, cst.BaseExpression] | None:
    """Helper parameter -> the expression the call passes (or its default); None when that is not plain."""
    params = list(helper.params.params)
    if skip_self:
        params = params[1:]
    if helper.params.star_arg not in (None, cst.MaybeSentinel.DEFAULT) or any(a.star for a in call.args):
        return None
    bound: dict[str, cst.BaseExpression] = {}
    positional = [a for a in call.args if a.keyword is None]
    if len(positional) > len(params):
        return None
    for param, arg in zip(params, positional):
        bound[param.name.value] = arg.value
    names = {p.name.value for p in [*params, *helper.params.kwonly_params]}
    for arg in call.args:
        if arg.keyword is not None:
            if arg.keyword.value not in names:
                return None
            bound[arg.keyword.value] = arg.value
    for param in [*params, *helper.params.kwonly_params]:
        if param.name.value not in bound and param.default is not None:
            bound[param.name.value] = param.default
    return bound


class _Substitute(cst.CSTTransformer):
    def __init__(self, bound: dict[str, cst.BaseExpression]) -> None:
        self.bound = bound

    def leave_Name(self, original_node, updated_node):
        return self.bound.get(original_node.value, updated_node)

    def leave_Attribute(self, original_node, updated_node):
        return updated_node.with_changes(attr=original_node.attr)  # `x.dtype`: only `x` is a reference

    def leave_Arg(self, original_node, updated_node):
        return updated_node.with_changes(keyword=original_node.keyword)  # a keyword's name stays


def _read_helper(helper: cst.FunctionDef, call: cst.Call, skip_self: bool, position: str | None,
                 name: str) -> _MaskBuild | str:
    """What the helper builds, as a buffer and a cast on the selected rows; a reason when it is not a
    plain causal mask of a length and a past length."""
    helper_name = helper.name.value
    body = list(helper.body.body) if isinstance(helper.body, cst.IndentedBlock) else []
    body = body[1:] if body and is_docstring(body[0]) else body
    calls = [c for s in body for c in _calls(s)]
    unknown = sorted({_call_name(c) or code_of(c.func) for c in calls} - _HELPER_CALLS)
    if unknown:
        return (f"`{helper_name}` builds something other than a plain causal mask (it calls "
                f"{', '.join(f'`{u}`' for u in unknown)})")
    params = [p.name.value for p in helper.params.params][1 if skip_self else 0:]
    past = {p for p in params if is_position_name(p, "int") or p.startswith("past")}
    full = [c for c in calls if torch_call_name(c) == "full"]
    triu = [c for c in calls if _call_name(c) == "triu"]
    if len(full) == 1 and len(triu) == 1 and not any(_call_name(c) in ("ones", "tril") for c in calls):
        if len(full[0].args) < 2 or not names_in(full[0].args[1].value) <= _FILL_NAMES:
            return f"`{helper_name}`'s fill value depends on its arguments; it cannot be built in `__init__`"
        diagonal = _relative_diagonal(_diagonal_arg(triu[0]), past)
        dtype = next((a for a in full[0].args if a.keyword is not None and a.keyword.value == "dtype"), None)
        if diagonal is None or (dtype is not None and not names_in(dtype.value) <= {"torch"}):
            return f"`{helper_name}`'s diagonal or dtype depends on its arguments"
        build = _MaskBuild(name, 0, 0, full[0].args[1].value, diagonal, dtype, checked_uses=True)
    else:
        read = _read_ones_tril(calls, past)
        if read is None:
            return f"`{helper_name}` does not build one causal mask from full + triu or tril of ones"
        if isinstance(read, str):
            return f"`{helper_name}`: {read}"
        build = _MaskBuild(name, 0, 0, None, read[0], read[1], kind="ones", checked_uses=True)
    bound = _bind(helper, call, skip_self)
    if bound is None:
        return f"the call's arguments cannot be matched to `{helper_name}`'s parameters"
    for p in past if position is not None else ():
        if not (isinstance(bound.get(p), cst.Name) and bound[p].value == position):
            return f"`{helper_name}` is not given this method's position as `{p}`"
    casts = [c for c in calls if _call_name(c) in _CASTS and isinstance(c.func, cst.Attribute)]
    if len(casts) > 1:
        return f"`{helper_name}` casts its mask more than once"
    if casts:
        cast = casts[0].with_changes(func=casts[0].func.with_changes(value=cst.Name("_")))
        if not names_in(cast) - {"_"} <= set(bound) | {"torch"}:
            return f"`{helper_name}` casts its mask to a value computed inside it"
        build.cast = code_of(cast.visit(_Substitute(bound)))[1:]
    return build


class StaticMask(BufferCodemod):
    NAME = "static_mask"
    TITLE = "Pre-build the causal mask as a buffer"
    DESCRIPTION = (
        "Replaces the causal mask built on every call (`torch.full` + `triu`, often only when the input is "
        f"longer than one token) with a `({MAX_SEQ_LEN_CONSTANT}, {MAX_SEQ_LEN_CONSTANT})` buffer built once in "
        "`__init__`; each call selects the rows of its positions. Decode now gets a mask too, which hides the "
        "unwritten slots of the static KV cache. Scores are unchanged for every written position. "
        "An additive `-inf` mask whose every use in the file is an addition (`scores + mask`) becomes a boolean "
        "buffer (True: visible) and each addition `scores.masked_fill(~mask, float(\"-inf\"))`: the same scores, "
        "and the form Inductor compiles to its own fused softmax instead of its slower CPU flash-attention "
        "kernel at Decode sizes."
    )
    SKILL = "static-buffers"
    FIXES = frozenset({"GM201", "GM401"})
    REQUIRES = ("static_positions",)

    def __init__(self, context, options) -> None:
        super().__init__(context, options)
        self._functions: dict[str, cst.FunctionDef] = {}
        self._boolean: _BooleanPlan | None = None  # an additive mask that becomes boolean, with its uses

    def visit_Module(self, node: cst.Module) -> None:
        self._functions = {s.name.value: s for s in node.body if isinstance(s, cst.FunctionDef)}
        self._boolean = self._plan_boolean(node)

    # -- an additive -inf mask turned boolean ------------------------------------------------------
    def _plan_boolean(self, module: cst.Module) -> _BooleanPlan | None:
        """The one additive -inf mask of the file that can become boolean, with the rewrite of every use;
        None when there is none, more than one, or a use that is not understood."""
        found = []
        for cls in (s for s in module.body if isinstance(s, cst.ClassDef)):
            for method in cls.body.body:
                if isinstance(method, cst.FunctionDef) and isinstance(method.body, cst.IndentedBlock):
                    body = list(method.body.body)
                    build = _find_mask(body, self._read_other(cls, method))
                    if isinstance(build, _MaskBuild):
                        found.append((cls, method, body, build))
        if len(found) != 1:
            return None
        cls, method, body, build = found[0]
        if (build.kind != "full" or build.cast or not _is_negative_infinity(build.fill)
                or position_param(method) is None or find_method(cls, "__init__") is None
                or _shape_dependent_use(build.name, body[build.last + 1 :]) is not None):
            return None
        return _plan_uses(module, method, body[build.last + 1 :], build.name, code_of(build.fill))

    def leave_BinaryOperation(self, original_node, updated_node):
        if self._boolean is not None and original_node in self._boolean.expressions:
            return self._boolean.expressions[original_node]
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        plan = self._boolean
        if plan is None or original_node not in plan.statements:
            return updated_node
        self.record_edit(original_node, f"`{plan.name}` is boolean now: hidden scores are filled with -inf "
                                        "instead of adding an -inf mask")
        return plan.statements[original_node](updated_node)

    def _read_other(self, cls: cst.ClassDef, method: cst.FunctionDef):
        """Reads the boolean tril(ones) form and helper calls, for `_find_mask`."""
        param = position_param(method)
        position = param.name.value if param is not None else None

        def read(name: str, statements: list[cst.BaseStatement]) -> _MaskBuild | str | None:
            found = _helper_call(statements)
            if found is None:
                return _read_bool_statements(name, statements, {position} if position else set())
            name, call = found
            on_self = self_attribute_name(call.func)
            helper = find_method(cls, on_self) if on_self else (
                self._functions.get(call.func.value) if isinstance(call.func, cst.Name) else None)
            if helper is None:
                return f"`{code_of(call.func)}` is not defined in this file; check what it builds and rewrite by hand"
            is_static = any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod"
                            for d in helper.decorators)
            return _read_helper(helper, call, bool(on_self) and not is_static, position, name)

        return read

    def rewrite_method(self, cls, updated_node, method, body):
        if method.name.value in SAME_FILE_MASK_HELPERS:
            return None  # transformers' mask method: cache_object replaces its call sites instead
        build = _find_mask(body, self._read_other(cls, method))
        if isinstance(build, str):
            self.record_manual(next((s for s in body if _mentions_helper(s)), body[0]), build)
            return None
        if build is None:
            return None
        if position_param(method) is None:
            self.record_manual(body[build.first], "a causal mask is built here, but the method takes no position")
            return None
        if find_method(cls, "__init__") is None:
            self.record_manual(body[build.first], "the class has no __init__ to build the mask buffer in")
            return None
        if build.checked_uses and (use := _shape_dependent_use(build.name, body[build.last + 1 :])) is not None:
            self.record_manual(body[build.first], f"`{build.name}` is used as `{use}` later; rows by position "
                                                  f"have {MAX_SEQ_LEN_CONSTANT} columns, so that use needs a look")
            return None
        buffer = "causal_mask"
        while buffer in self_attributes(cls):
            buffer = f"graphmode_{buffer}"
        select = cst.parse_statement(f"{build.name} = self.{buffer}[{POSITION_TENSOR}]{build.cast}\n").with_changes(
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
        if self._boolean is not None and self._boolean.method is method:
            # Uses in this method, rewritten on the original statements (the traversal's are discarded).
            rest = [s.visit(_ApplyPlan(self._boolean)) for s in body[build.last + 1 :]]
            updated_node = replace_method(updated_node, method.name.value, method.with_changes(
                body=method.body.with_changes(body=[*body[: build.first], select, *rest])))
            diagonal = _boolean_diagonal(build.diagonal)
            init_lines = list(cst.parse_module(
                f"{buffer} = torch.ones({MAX_SEQ_LEN_CONSTANT}, {MAX_SEQ_LEN_CONSTANT}, dtype=torch.bool)\n"
                f'self.register_buffer("{buffer}", {buffer}.tril({diagonal}), persistent=False)\n'
            ).body)
            return append_to_init(updated_node, init_lines, "the causal mask for every position, built once "
                                                            "(True: visible).")
        if build.kind == "ones":
            dtype = f", dtype={build.dtype}" if build.dtype else ""
            diagonal = "" if build.diagonal == "0" else build.diagonal
            init_lines = list(cst.parse_module(
                f"{buffer} = torch.ones({MAX_SEQ_LEN_CONSTANT}, {MAX_SEQ_LEN_CONSTANT}{dtype})\n"
                f'self.register_buffer("{buffer}", {buffer}.tril({diagonal}), persistent=False)\n'
            ).body)
            return append_to_init(updated_node, init_lines, "the causal mask for every position, built once.")
        dtype = f", dtype={cst.Module([]).code_for_node(build.dtype.value)}" if build.dtype else ""
        fill = cst.Module([]).code_for_node(build.fill)
        diagonal = build.diagonal if isinstance(build.diagonal, str) else cst.Module([]).code_for_node(build.diagonal)
        init_lines = list(cst.parse_module(
            f"{buffer} = torch.full(({MAX_SEQ_LEN_CONSTANT}, {MAX_SEQ_LEN_CONSTANT}), {fill}{dtype})\n"
            f'self.register_buffer("{buffer}", {buffer}.triu({diagonal}), persistent=False)\n'
        ).body)
        return append_to_init(updated_node, init_lines, "the causal mask for every position, built once.")


def _mentions_helper(stmt: cst.CSTNode) -> bool:
    """Whether a statement calls a make_causal_mask helper or builds a mask (where a partial match is reported)."""
    return any(_HELPER_NAME.match(_call_name(c) or code_of(c.func)) or _call_name(c) in ("tril", "triu", "ones")
               for c in _calls(stmt))


def _shape_dependent_use(name: str, statements: list[cst.BaseStatement]) -> str | None:
    """A later use of the mask that depends on its shape (indexing, reshaping), as code; None when every use
    broadcasts (`masked_fill(~mask, ...)`, `torch.where(mask, ...)`, `scores + mask`)."""
    found: list[str] = []

    class _Finder(cst.CSTVisitor):
        def visit_Subscript(self, node: cst.Subscript) -> None:
            if isinstance(node.value, cst.Name) and node.value.value == name:
                found.append(code_of(node))

        def visit_Attribute(self, node: cst.Attribute) -> None:
            if (isinstance(node.value, cst.Name) and node.value.value == name
                    and node.attr.value not in ("logical_not", "to", "bool", "dtype", "device")):
                found.append(code_of(node))

    for stmt in statements:
        stmt.visit(_Finder())
    return found[0] if found else None


# -- an additive -inf mask turned boolean: its uses ------------------------------------------------
_NEGATIVE_INFINITY = frozenset({'float("-inf")', '-float("inf")', "-math.inf", "-torch.inf", "-float(math.inf)"})
_SDPA = frozenset({"scaled_dot_product_attention"})
_FILLED = "# graphmode: the mask is boolean now (True: visible); filled with -inf, the scores are unchanged."


def _is_negative_infinity(fill: cst.BaseExpression | None) -> bool:
    return fill is not None and code_of(fill).replace("'", '"').replace(" ", "").lower() in _NEGATIVE_INFINITY


def _boolean_diagonal(diagonal: cst.BaseExpression | str) -> str:
    """`triu(d)` hides the columns from d on; the visible ones are `tril(d - 1)` (written bare when 0)."""
    text = diagonal if isinstance(diagonal, str) else code_of(diagonal)
    try:
        value = int(text) - 1
    except ValueError:
        return f"({text}) - 1"
    return "" if value == 0 else str(value)


@dataclass
class _BooleanPlan:
    """The method that builds the mask, its name, and each use rewritten: expressions (`a + mask`) by
    their original node, statements (`a += mask`, or any holding a rewritten expression) as a function of
    the updated statement."""

    method: cst.FunctionDef
    name: str
    expressions: dict[cst.CSTNode, cst.BaseExpression] = field(default_factory=dict)
    statements: dict[cst.CSTNode, Callable[[cst.SimpleStatementLine], cst.SimpleStatementLine]] = \
        field(default_factory=dict)


class _ApplyPlan(cst.CSTTransformer):
    """The plan's rewrites, applied to original statements outside the main traversal."""

    def __init__(self, plan: _BooleanPlan) -> None:
        self.plan = plan

    def leave_BinaryOperation(self, original_node, updated_node):
        return self.plan.expressions.get(original_node, updated_node)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        rewrite = self.plan.statements.get(original_node)
        return rewrite(updated_node) if rewrite else updated_node


def _filled(other: cst.BaseExpression, name: str, fill: str) -> cst.BaseExpression:
    """`other.masked_fill(~name, fill)`, `other` in parentheses unless it is a primary expression."""
    primary = isinstance(other, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or other.lpar
    text = code_of(other) if primary else f"({code_of(other)})"
    return cst.parse_expression(f"{text}.masked_fill(~{name}, {fill})")


def _with_comment(statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    return statement.with_changes(leading_lines=[
        *statement.leading_lines, cst.EmptyLine(indent=True, comment=cst.Comment(_FILLED))])


def _plan_uses(module: cst.Module, method: cst.FunctionDef, after: list[cst.BaseStatement], name: str,
               fill: str) -> _BooleanPlan | None:
    """Every use of the mask `name` in the file, rewritten for a boolean mask; None when one is not understood."""
    plan = _BooleanPlan(method, name)
    top_level = _top_level_names(module)
    functions: list[cst.FunctionDef] = []

    class _Functions(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            functions.append(node)

    module.visit(_Functions())
    carriers = []
    for func in functions:
        params = [p.name.value for p in (*func.params.params, *func.params.kwonly_params, *func.params.posonly_params)]
        if any("mask" in p.lower() and p != name for p in params):
            return None  # a mask under another name: where this one goes cannot be followed by name
        if name in params and func is not method:
            carriers.append(func.body)
    checker = _UseChecker(plan, name, fill, top_level)
    for node in [*after, *carriers]:
        node.visit(checker)
        if checker.unknown:
            return None
    return plan if plan.expressions or any(s for s in checker.augmented) else None


def _top_level_names(module: cst.Module) -> tuple[set[str], set[str]]:
    """(functions and classes defined in the file, every other top-level name: imports, assignments)."""
    defined, other = set(), set(dir(builtins))
    for stmt in module.body:
        if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)):
            defined.add(stmt.name.value)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    if isinstance(small.names, cst.ImportStar):
                        other.add("*")
                        continue
                    for alias in small.names:
                        bound = alias.asname.name if alias.asname else alias.name
                        other.add(code_of(bound).split(".")[0])
                else:
                    other |= names_in(small)
        else:
            other |= names_in(stmt)
    return defined, other - defined


class _UseChecker(cst.CSTVisitor):
    """Walks code after the mask is built, and the bodies of functions that receive it, accepting only
    `x + mask` / `mask + x`, `x += mask`, `mask is [not] None`, and passing it on to a call defined here
    (or to scaled_dot_product_attention); records the rewrite of the first two in the plan."""

    def __init__(self, plan: _BooleanPlan, name: str, fill: str, top_level: tuple[set[str], set[str]]) -> None:
        self.plan, self.name, self.fill = plan, name, fill
        self.defined, self.outside = top_level
        self.unknown = False
        self.accepted: set[int] = set()  # ids of Name nodes whose use is understood
        self.augmented: list[cst.CSTNode] = []
        self._statements: list[cst.SimpleStatementLine] = []

    def _is_mask(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Name) and node.value == self.name

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statements.append(node)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._statements.pop()

    def _rewrites_statement(self) -> None:
        if self._statements:
            self.plan.statements.setdefault(self._statements[-1], _with_comment)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if not isinstance(node.operator, cst.Add):
            return
        for side, other in ((node.right, node.left), (node.left, node.right)):
            if self._is_mask(side) and self.name not in names_in(other) and self._statements:
                self.accepted.add(id(side))
                filled = _filled(other, self.name, self.fill)
                self.plan.expressions[node] = filled.with_changes(lpar=node.lpar, rpar=node.rpar)
                self._rewrites_statement()
                return

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if (isinstance(node.operator, cst.AddAssign) and self._is_mask(node.value)
                and isinstance(node.target, cst.Name) and node.target.value != self.name
                and self._statements and len(self._statements[-1].body) == 1):
            self.accepted.add(id(node.value))
            target, filled = node.target.value, _filled(node.target, self.name, self.fill)

            def rewrite(statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
                assign = cst.Assign([cst.AssignTarget(cst.Name(target))], filled)
                return _with_comment(statement.with_changes(body=[assign]))

            self.plan.statements[self._statements[-1]] = rewrite
            self.augmented.append(node)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if (self._is_mask(node.left) and len(node.comparisons) == 1
                and isinstance(node.comparisons[0].operator, (cst.Is, cst.IsNot))
                and isinstance(node.comparisons[0].comparator, cst.Name)
                and node.comparisons[0].comparator.value == "None"):
            self.accepted.add(id(node.left))

    def visit_Call(self, node: cst.Call) -> None:
        func, root = node.func, node.func
        while isinstance(root, (cst.Attribute, cst.Subscript, cst.Call)):
            root = root.func if isinstance(root, cst.Call) else root.value
        sdpa = (func.attr.value if isinstance(func, cst.Attribute) else
                func.value if isinstance(func, cst.Name) else None) in _SDPA
        # Code of this file: a method (`self.attention(...)`), a module held in a local (`layer(...)`), or a
        # function defined here; never something imported or built in, whose idea of a mask is unknown.
        here = isinstance(root, cst.Name) and "*" not in self.outside and (
            root.value == "self" or root.value in self.defined or root.value not in self.outside)
        for position, arg in enumerate(node.args):
            if not self._is_mask(arg.value) or arg.star:
                continue
            to_sdpa = sdpa and (arg.keyword.value == "attn_mask" if arg.keyword is not None else position == 3)
            if to_sdpa or (here and not sdpa):
                self.accepted.add(id(arg.value))

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.name and id(node) not in self.accepted:
            self.unknown = True

    def visit_Param(self, node: cst.Param) -> bool:
        return False  # a parameter's own name is not a use

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # `x.mask` is not the mask: only the object is looked at
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # `f(mask=...)`: the keyword is not a use
        return False
