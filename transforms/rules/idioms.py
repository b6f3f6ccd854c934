"""Static guesses shared by rules: which expressions are tensors, and what a function assigns.

Types are unknown to a source scan, so these follow the idioms inference code uses: a `torch.X(...)`
call, a reduction method such as `.sum()` or `.max()`, a subscript or `.values` of those, arithmetic
on them, and local names assigned from any of them.
"""
from __future__ import annotations

import libcst as cst

from transforms.cstutil import method_call_name, torch_call_name

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


def is_tensor_call(node: cst.CSTNode) -> bool:
    """`torch.X(...)` (not one of NON_TENSOR_TORCH) or `x.sum()`-style reductions."""
    name = torch_call_name(node)
    if name is not None:
        return name not in NON_TENSOR_TORCH
    return method_call_name(node) in REDUCTION_METHODS


def produces_tensor(node: cst.CSTNode, tensor_names: frozenset[str] | set[str] = frozenset()) -> bool:
    """True when `node` is, by the usual idioms, a tensor (see the module docstring)."""
    if isinstance(node, cst.Call):
        return is_tensor_call(node)
    if isinstance(node, cst.Subscript):
        return produces_tensor(node.value, tensor_names)
    if isinstance(node, cst.Attribute):
        return node.attr.value in {"values", "indices"} and produces_tensor(node.value, tensor_names)
    if isinstance(node, cst.BinaryOperation):
        return produces_tensor(node.left, tensor_names) or produces_tensor(node.right, tensor_names)
    if isinstance(node, cst.UnaryOperation) and not isinstance(node.operator, cst.Not):
        return produces_tensor(node.expression, tensor_names)
    if isinstance(node, cst.Name):
        return node.value in tensor_names
    return False


def local_assignments(func: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
    """`name = value` (and `name: T = value`) in func's own body, nested functions and classes excluded."""
    found: dict[str, list[cst.BaseExpression]] = {}

    class _Collector(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is func

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    found.setdefault(target.target.value, []).append(node.value)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            if isinstance(node.target, cst.Name) and node.value is not None:
                found.setdefault(node.target.value, []).append(node.value)

    func.visit(_Collector())
    return found


def tensor_names(func: cst.FunctionDef) -> frozenset[str]:
    """Local names of func assigned, at least once, from a tensor-producing expression."""
    assigned = local_assignments(func)
    names: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, values in assigned.items():
            if name not in names and any(produces_tensor(v, names) for v in values):
                names.add(name)
                changed = True
    return frozenset(names)


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def is_true(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def string_value(node: cst.CSTNode | None) -> str | None:
    """The text of a plain string literal (no f-string, no concatenation); None otherwise."""
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def int_value(node: cst.CSTNode | None) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value)
    return None
