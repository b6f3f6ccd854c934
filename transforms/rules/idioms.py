"""Static guesses shared by rules: which expressions are tensors, and what a function assigns.

Types are unknown to a source scan, so these follow the idioms inference code uses: a `torch.X(...)`
call, a reduction method such as `.sum()` or `.max()`, a subscript or `.values` of those, arithmetic
on them, and local names assigned from any of them.

Facts about a function (`local_assignments`, `tensor_names`, ...) are computed once per function and
kept on its node (`per_function`), so every rule that asks shares them.
"""
from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from typing import TypeVar

from transforms.rules.astutil import is_positional, method_call_name, statements, torch_call_name
from transforms.rules.base import SourceFile

# `torch.X(...)` calls that return Python values, not tensors.
NON_TENSOR_TORCH = frozenset(
    {"is_tensor", "is_storage", "is_floating_point", "is_complex", "is_grad_enabled",
     "is_inference_mode_enabled", "numel", "get_default_dtype", "get_num_threads", "finfo", "iinfo",
     "device", "dtype", "Size", "compile", "no_grad", "inference_mode", "manual_seed", "set_grad_enabled"}
)
# Tensor methods that return a tensor (often a 0-d one, the kind code converts to a Python value).
REDUCTION_METHODS = frozenset(
    {"sum", "max", "min", "any", "all", "mean", "argmax", "argmin", "prod", "norm", "std", "var", "amax",
     "amin", "count_nonzero", "median", "logsumexp", "nonzero"}
)

T = TypeVar("T")
Function = ast.FunctionDef | ast.AsyncFunctionDef


def per_function(compute: Callable[[Function], T]) -> Callable[[Function], T]:
    """Memoise a fact about a function on the function's node: computed once per parsed file."""
    key = f"_graphmode_{compute.__module__}.{compute.__qualname__}"

    @functools.wraps(compute)
    def cached(func: Function) -> T:
        try:
            return func.__dict__[key]
        except KeyError:
            value = func.__dict__[key] = compute(func)
            return value

    return cached


def is_tensor_call(node: ast.AST) -> bool:
    """`torch.X(...)` (not one of NON_TENSOR_TORCH) or `x.sum()`-style reductions."""
    name = torch_call_name(node)
    if name is not None:
        return name not in NON_TENSOR_TORCH
    return method_call_name(node) in REDUCTION_METHODS


def produces_tensor(node: ast.AST, tensor_names: frozenset[str] | set[str] = frozenset()) -> bool:
    """True when `node` is, by the usual idioms, a tensor (see the module docstring)."""
    cls = node.__class__
    if cls is ast.Call:
        return is_tensor_call(node)
    if cls is ast.Subscript:
        return produces_tensor(node.value, tensor_names)
    if cls is ast.Attribute:
        return node.attr in {"values", "indices"} and produces_tensor(node.value, tensor_names)
    if cls is ast.BinOp:
        return produces_tensor(node.left, tensor_names) or produces_tensor(node.right, tensor_names)
    if cls is ast.UnaryOp and node.op.__class__ is not ast.Not:
        return produces_tensor(node.operand, tensor_names)
    if cls is ast.Name:
        return node.id in tensor_names
    return False


@per_function
def local_assignments(func: Function) -> dict[str, list[ast.expr]]:
    """`name = value` (and `name: T = value`) in func's own body, nested functions and classes excluded."""
    found: dict[str, list[ast.expr]] = {}
    for stmt in statements(func.body, into_scopes=False):
        cls = stmt.__class__
        if cls is ast.Assign:
            for target in stmt.targets:
                if target.__class__ is ast.Name:
                    found.setdefault(target.id, []).append(stmt.value)
        elif cls is ast.AnnAssign:
            if stmt.target.__class__ is ast.Name and stmt.value is not None:
                found.setdefault(stmt.target.id, []).append(stmt.value)
    return found


def names_assigned(func: Function, is_kind: Callable[[ast.expr, set[str]], bool], *, every: bool) -> frozenset[str]:
    """Local names whose assigned values are of a kind (`every`: all of them, else at least one), where a
    value may refer to names already found: grown to a fixed point, so `a = x.sum(); b = a * 2` finds both."""
    assigned = local_assignments(func)
    quantifier = all if every else any
    names: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, values in assigned.items():
            if name not in names and quantifier(is_kind(v, names) for v in values):
                names.add(name)
                changed = True
    return frozenset(names)


@per_function
def tensor_names(func: Function) -> frozenset[str]:
    """Local names of func assigned, at least once, from a tensor-producing expression."""
    return names_assigned(func, produces_tensor, every=False)


def keyword(call: ast.Call, name: str) -> ast.keyword | None:
    for arg in call.keywords:
        if arg.arg == name:
            return arg
    return None


def positional_args(call: ast.Call) -> list[ast.expr]:
    """Plain positional arguments (no `*a`), in order."""
    return [a for a in call.args if a.__class__ is not ast.Starred]


def has_positional(call: ast.Call) -> bool:
    """Any argument without a keyword: positional, `*a` or `**k` (libcst's `arg.keyword is None`)."""
    return bool(call.args) or any(is_positional(k) for k in call.keywords)


def is_true(node: ast.AST | None) -> bool:
    return node.__class__ is ast.Constant and node.value is True


def string_value(node: ast.AST | None, file: SourceFile) -> str | None:
    """The text of a plain string literal (no f-string, no concatenation); None otherwise."""
    if node.__class__ is ast.Constant and node.value.__class__ is str and _single_literal(file.segment(node)):
        return node.value
    return None


def _single_literal(text: str) -> bool:
    """True when text is one string literal, not `"a" "b"` (which `ast` joins into one constant)."""
    start = 0
    while start < len(text) and text[start] not in "'\"":
        start += 1
    quote = text[start] * 3 if text.startswith(text[start] * 3, start) else text[start]
    index = start + len(quote)
    while index < len(text):
        if text[index] == "\\":
            index += 2
        elif text.startswith(quote, index):
            return index + len(quote) == len(text)
        else:
            index += 1
    return False


def int_value(node: ast.AST | None) -> int | None:
    if node.__class__ is ast.Constant and node.value.__class__ is int:
        return node.value
    return None
