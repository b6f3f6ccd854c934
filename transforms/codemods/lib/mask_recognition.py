"""Recognising a causal mask built inside a method, and what a buffer built once in `__init__` needs instead.

Three forms are read (the rewrite is `static_mask`):

    mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device)    # full + triu, maybe guarded
    mask = torch.triu(mask, diagonal=1)                                         # and with the past prepended
    mask = torch.tril(torch.ones(seqlen, seqlen, dtype=torch.bool))             # tril of ones
    mask = _make_causal_mask(seqlen, start_pos)                                 # a helper of the same file

Each gives a `MaskBuild`: the statements that build the mask, its fill, diagonal (relative to the past length,
so it holds in the absolute (max, max) buffer) and dtype; or a reason when a form is recognised only in part.
"""
from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst

from graphmode.transforms.cstutil import (
    calls_in,
    code_of,
    dotted_name,
    find_method,
    is_docstring,
    names_in,
    position_param,
    self_attribute_name,
    single_assignment,
    torch_call_name,
)
from graphmode.transforms.dispatch import Transformer
from graphmode.transforms.vocabulary import KEYWORD_MASK_HELPERS, LIBRARY_MASK_HELPERS, SAME_FILE_MASK_HELPERS, \
    SLIDING_KEYWORD_MASK_HELPERS, is_position_name

_FILL_NAMES = frozenset({"float", "torch", "math"})


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    return calls_in(node)


def _call_name(call: cst.Call) -> str | None:
    """"triu" for both `torch.triu(x, 1)` and `x.triu(1)`."""
    return torch_call_name(call) or (call.func.attr.value if isinstance(call.func, cst.Attribute) else None)


class MaskBuild:
    """Statements [first, last] of a body that build one causal mask, and what the buffer needs.

    `kind` is "full" (a float mask: full + triu) or "ones" (a boolean one: tril of ones). `cast` is code
    appended to the row selection; `checked_uses` asks that later uses tolerate the new shape."""

    def __init__(self, name: str, first: int, last: int, fill: cst.BaseExpression | None,
                 diagonal: cst.BaseExpression | str, dtype: cst.Arg | str | None, kind: str = "full",
                 cast: str = "", checked_uses: bool = False) -> None:
        self.name, self.first, self.last = name, first, last
        self.fill, self.diagonal, self.dtype = fill, diagonal, dtype
        self.kind, self.cast, self.checked_uses = kind, cast, checked_uses


# How `find_mask` reads the forms other than full + triu: (mask name, statements) -> a build, a reason, or None.
MaskReader = Callable[[str, list[cst.BaseStatement]], MaskBuild | str | None]


def _read_mask_statements(name: str, statements: list[cst.BaseStatement]) -> MaskBuild | None:
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
    return MaskBuild(name, 0, 0, fill, diagonal, dtype)


def find_mask(body: list[cst.BaseStatement], read_other: MaskReader | None = None) -> MaskBuild | str | None:
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
HELPER_NAME = re.compile(r"^_?(make|build|create|get)_causal_mask$")
# Every form `find_mask` reads calls one of these or a helper named like HELPER_NAME.
MASK_WORDS = frozenset({"triu", "tril", "ones"})
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


def _read_bool_statements(name: str, statements: list[cst.BaseStatement], past: set[str]) -> MaskBuild | str | None:
    if not statements or not all((a := single_assignment(s)) and a[0] == name for s in statements):
        return None
    calls = [c for s in statements for c in _calls(s)]
    if any(_call_name(c) not in ({"ones", "tril", "bool"} | _SHAPE_ONLY) for c in calls):
        return None
    read = _read_ones_tril(calls, past)
    if read is None or isinstance(read, str):
        return read
    diagonal, dtype = read
    return MaskBuild(name, 0, 0, None, diagonal, dtype, kind="ones", checked_uses=True)


# -- helper calls: mask = _make_causal_mask(...) ---------------------------------------------------
def _helper_call(statements: list[cst.BaseStatement]) -> tuple[str, cst.Call] | None:
    """`name = [self.]make_causal_mask(...)` alone -> (name, the call)."""
    if len(statements) != 1 or (a := single_assignment(statements[0])) is None or not isinstance(a[1], cst.Call):
        return None
    func = a[1].func
    helper = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
    return (a[0], a[1]) if helper and HELPER_NAME.match(helper) else None


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


class _Substitute(Transformer):
    def __init__(self, bound: dict[str, cst.BaseExpression]) -> None:
        self.bound = bound

    def leave_Name(self, original_node, updated_node):
        return self.bound.get(original_node.value, updated_node)

    def leave_Attribute(self, original_node, updated_node):
        return updated_node.with_changes(attr=original_node.attr)  # `x.dtype`: only `x` is a reference

    def leave_Arg(self, original_node, updated_node):
        return updated_node.with_changes(keyword=original_node.keyword)  # a keyword's name stays


def _read_helper(helper: cst.FunctionDef, call: cst.Call, skip_self: bool, position: str | None,
                 name: str) -> MaskBuild | str:
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
    build = _helper_build(calls, past, name)
    if isinstance(build, str):
        return f"`{helper_name}`{build}"
    bound = _bind(helper, call, skip_self)
    if bound is None:
        return f"the call's arguments cannot be matched to `{helper_name}`'s parameters"
    for p in past if position is not None else ():
        if not (isinstance(bound.get(p), cst.Name) and bound[p].value == position):
            return f"`{helper_name}` is not given this method's position as `{p}`"
    cast = _helper_cast(calls, bound)
    if cast.startswith(" "):
        return f"`{helper_name}`{cast}"
    build.cast = cast
    return build


def _helper_build(calls: list[cst.Call], past: set[str], name: str) -> MaskBuild | str:
    """The mask a helper's calls build (full + triu, or tril of ones), as a buffer of `name`; else the end of a
    sentence that starts with the helper's name, saying why not."""
    full = [c for c in calls if torch_call_name(c) == "full"]
    triu = [c for c in calls if _call_name(c) == "triu"]
    if len(full) == 1 and len(triu) == 1 and not any(_call_name(c) in ("ones", "tril") for c in calls):
        if len(full[0].args) < 2 or not names_in(full[0].args[1].value) <= _FILL_NAMES:
            return "'s fill value depends on its arguments; it cannot be built in `__init__`"
        diagonal = _relative_diagonal(_diagonal_arg(triu[0]), past)
        dtype = next((a for a in full[0].args if a.keyword is not None and a.keyword.value == "dtype"), None)
        if diagonal is None or (dtype is not None and not names_in(dtype.value) <= {"torch"}):
            return "'s diagonal or dtype depends on its arguments"
        return MaskBuild(name, 0, 0, full[0].args[1].value, diagonal, dtype, checked_uses=True)
    read = _read_ones_tril(calls, past)
    if read is None:
        return " does not build one causal mask from full + triu or tril of ones"
    if isinstance(read, str):
        return f": {read}"
    return MaskBuild(name, 0, 0, None, read[0], read[1], kind="ones", checked_uses=True)


def _helper_cast(calls: list[cst.Call], bound: dict[str, cst.BaseExpression]) -> str:
    """The one cast a helper applies to its mask, in the caller's names (`.to(dtype)`); "" without one; or, starting
    with a space, the end of a sentence that starts with the helper's name, saying why it cannot be kept."""
    casts = [c for c in calls if _call_name(c) in _CASTS and isinstance(c.func, cst.Attribute)]
    if len(casts) > 1:
        return " casts its mask more than once"
    if not casts:
        return ""
    cast = casts[0].with_changes(func=casts[0].func.with_changes(value=cst.Name("_")))
    if not names_in(cast) - {"_"} <= set(bound) | {"torch"}:
        return " casts its mask to a value computed inside it"
    return code_of(cast.visit(_Substitute(bound)))[1:]


def mask_reader(cls: cst.ClassDef, method: cst.FunctionDef, functions: dict[str, cst.FunctionDef]) -> MaskReader:
    """Reads the boolean tril(ones) form and helper calls in `method`, for `find_mask`; `functions` are the
    file's top-level functions, where a bare helper call is looked up."""
    param = position_param(method)
    position = param.name.value if param is not None else None

    def read(name: str, statements: list[cst.BaseStatement]) -> MaskBuild | str | None:
        found = _helper_call(statements)
        if found is None:
            return _read_bool_statements(name, statements, {position} if position else set())
        name, call = found
        if code_of(call.func).rsplit(".", 1)[-1] in KEYWORD_MASK_HELPERS | SLIDING_KEYWORD_MASK_HELPERS:
            return None  # masking_utils' helpers (4.53+, 5.x): cache_object replaces their call sites instead
        on_self = self_attribute_name(call.func)
        helper = find_method(cls, on_self) if on_self else (
            functions.get(call.func.value) if isinstance(call.func, cst.Name) else None)
        if helper is None:
            return f"`{code_of(call.func)}` is not defined in this file; check what it builds and rewrite by hand"
        is_static = any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod"
                        for d in helper.decorators)
        return _read_helper(helper, call, bool(on_self) and not is_static, position, name)

    return read


def mentions_helper(stmt: cst.CSTNode) -> bool:
    """Whether a statement calls a make_causal_mask helper or builds a mask (where a partial match is reported)."""
    return any(HELPER_NAME.match(_call_name(c) or code_of(c.func)) or _call_name(c) in ("tril", "triu", "ones")
               for c in _calls(stmt))


def shape_dependent_use(name: str, statements: list[cst.BaseStatement]) -> str | None:
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


MASK_HELPERS = LIBRARY_MASK_HELPERS | SAME_FILE_MASK_HELPERS  # helpers called as `mask = helper(...)`


def mask_helper_call(stmt: cst.CSTNode, helpers: frozenset[str] = MASK_HELPERS
                     ) -> tuple[str, cst.Call] | None:
    """`X = _prepare_4d_causal_attention_mask(...)` (or another of `helpers`) -> ("X", the call)."""
    assigned = single_assignment(stmt)
    if assigned and isinstance(assigned[1], cst.Call):
        name = dotted_name(assigned[1].func)
        if name and name.rsplit(".", 1)[-1] in helpers:
            return assigned[0], assigned[1]
    return None
