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
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from graphmode.transforms.analysis.astutil import (ast_names_in, ast_torch_call_name, is_positional, method_call_name,
                                                   statements)

if TYPE_CHECKING:  # for a hint only: importing the rules here would be circular, as they import this module
    from graphmode.transforms.rules.base import SourceFile

# `torch.X(...)` calls that return Python values, not tensors. Every `torch.is_*` and `torch.are_*` does
# too (`is_tensor`, `is_autocast_enabled`, `is_grad_enabled`, `are_deterministic_algorithms_enabled`, ...):
# see `is_tensor_call`.
NON_TENSOR_TORCH = frozenset(
    {"numel", "get_default_dtype", "get_num_threads", "get_autocast_dtype", "get_autocast_gpu_dtype",
     "get_autocast_cpu_dtype", "get_device", "result_type", "promote_types", "can_cast", "finfo", "iinfo",
     "device", "dtype", "Size", "compile", "no_grad", "inference_mode", "manual_seed", "set_grad_enabled"}
)
_NON_TENSOR_PREFIXES = ("is_", "are_")
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
    name = ast_torch_call_name(node)
    if name is not None:
        return name not in NON_TENSOR_TORCH and not name.startswith(_NON_TENSOR_PREFIXES)
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


class Binding(NamedTuple):
    """One place a function's own body binds a name."""
    line: int
    value: ast.expr | None  # what the name holds after it; None when no expression says (a loop variable)
    augmented: bool = False  # `name += value`: the name's earlier value takes part


@per_function
def bindings(func: Function) -> dict[str, list[Binding]]:
    """Where func's own body binds each local name, in source order (nested functions and classes excluded).

    Unpacking (`a, b = value`) gives each name the whole value when that is a tensor call (`values,
    indices = x.max(-1)`), else no value: `bsz, seq_len, _ = x.size()` binds Python ints.
    """
    found: dict[str, list[Binding]] = {}

    def bind(target: ast.expr, line: int, value: ast.expr | None, augmented: bool = False) -> None:
        if target.__class__ is ast.Name:
            found.setdefault(target.id, []).append(Binding(line, value, augmented))
        elif target.__class__ in (ast.Tuple, ast.List):
            whole = value if value is not None and is_tensor_call(value) else None
            for element in target.elts:
                bind(element.value if element.__class__ is ast.Starred else element, line, whole)

    for stmt in statements(func.body, into_scopes=False):
        cls = stmt.__class__
        if cls is ast.Assign:
            for target in stmt.targets:
                bind(target, stmt.lineno, stmt.value)
        elif cls is ast.AnnAssign and stmt.value is not None:
            bind(stmt.target, stmt.lineno, stmt.value)
        elif cls is ast.AugAssign:
            bind(stmt.target, stmt.lineno, stmt.value, augmented=True)
        elif cls in (ast.For, ast.AsyncFor):
            bind(stmt.target, stmt.lineno, None)
        elif cls in (ast.With, ast.AsyncWith):
            for item in stmt.items:
                if item.optional_vars is not None:
                    bind(item.optional_vars, stmt.lineno, None)
    return found


def tensor_names_at(func: Function, line: int, candidates: Iterable[str]) -> frozenset[str]:
    """Those of `candidates` that hold a tensor at `line`: the latest binding before that line, in source
    order, is a tensor-producing value (judged the same way at its own line).

    `tensor_names` asks whether a name is EVER assigned a tensor; a condition needs what it holds where it
    is tested: `seq_len = x.shape[1]` right before `if seq_len > n:` is a Python int whatever the name
    held earlier. Parameters are never taken for tensors (their type is unknown). Branches are not
    followed: of `if a: n = x.sum()` / `else: n = x.shape[0]`, the later one in the file counts.
    """
    sites = bindings(func)
    # Shared by every condition of the function; each step looks strictly further back, so it ends.
    memo: dict[tuple[str, int], bool] = func.__dict__.setdefault("_graphmode_tensor_names_at", {})

    def holds_tensor(name: str, before: int) -> bool:
        key = (name, before)
        if key not in memo:
            earlier = [site for site in sites.get(name, ()) if site.line < before]
            site = earlier[-1] if earlier else None
            if site is None or site.value is None:
                memo[key] = False
            else:
                names = {n for n in ast_names_in(site.value) if n in sites and holds_tensor(n, site.line)}
                memo[key] = produces_tensor(site.value, names) or (site.augmented and holds_tensor(name, site.line))
        return memo[key]

    return frozenset(name for name in candidates if name in sites and holds_tensor(name, line))


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
