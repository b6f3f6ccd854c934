"""Recognising a hand-written RMSNorm (`x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`, its weight and its
casts): what fused_rms_norm and fused_add_rms_norm both read."""
from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from graphmode.transforms.codemods.lib.fusion import bare, same_code
from graphmode.transforms.cstutil import dotted_name, integer_value, names_in, nodes_of_type, self_attribute_name, \
    single_assignment


CASTS = frozenset({"to", "type_as", "type", "float", "half", "bfloat16"})


def _last_dim_mean(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`<squares>.mean(-1, keepdim=True)` or `torch.mean(<squares>, dim=-1, keepdim=True)` -> the squared tensor."""
    if not isinstance(node, cst.Call):
        return None
    name = dotted_name(node.func)
    if name == "torch.mean" and node.args:
        operand, rest = node.args[0].value, node.args[1:]
    elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "mean":
        operand, rest = node.func.value, node.args
    else:
        return None
    dims = [a.value for a in rest if a.keyword is None or a.keyword.value == "dim"]
    keepdim = [a.value for a in rest if a.keyword is not None and a.keyword.value == "keepdim"]
    if len(dims) != 1 or not _is_minus_one(dims[0]) or not (keepdim and m.matches(keepdim[0], m.Name("True"))):
        return None
    return _squared(operand)


def _is_minus_one(node: cst.BaseExpression) -> bool:
    return (isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus)
            and integer_value(node.expression) == 1)


def _squared(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """`t.pow(2)`, `t ** 2`, `t * t`, `t.square()`, `torch.square(t)` -> t."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        if node.func.attr.value == "pow" and len(node.args) == 1 and integer_value(node.args[0].value) == 2:
            return node.func.value
        if node.func.attr.value == "square" and not node.args:
            return node.func.value
    if isinstance(node, cst.Call) and dotted_name(node.func) == "torch.square" and len(node.args) == 1:
        return node.args[0].value
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.operator, cst.Power) and integer_value(node.right) == 2:
            return node.left
        if isinstance(node.operator, cst.Multiply) and same_code(node.left, node.right):
            return node.left
    return None


def norm_in(stmt: cst.BaseStatement, earlier: list[cst.BaseStatement | None]):
    """(the `x * rsqrt(...)` node, x, eps, (name, index) of the mean's own line or None) in `stmt`, if any."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return None
    for node in _binary_operations(stmt):
        parts = _scaled_and_rsqrt(node)
        if parts is None:
            continue
        scaled, denominator = parts
        if not (isinstance(denominator, cst.BinaryOperation) and isinstance(denominator.operator, cst.Add)):
            continue
        means, eps = denominator.left, denominator.right
        squared, means_line = _last_dim_mean(means), None
        if squared is None and isinstance(means, cst.Name):
            squared, means_line = _bound_mean(means.value, earlier)
        if squared is not None and same_code(squared, scaled):
            return node, scaled, eps, means_line
    return None


def norm_parts(body: list[cst.BaseStatement]) -> tuple[str, str] | None:
    """(weight, epsilon) attribute names of a `forward` body that is an RMSNorm returning `self.weight * <cast of
    the normalised input>` with `self.eps` as its epsilon (`name = <norm>`, then `return`); None otherwise."""
    for index, stmt in enumerate(body):
        found = norm_in(stmt, body[:index])
        if found is None:
            continue
        norm, _, eps, _ = found
        assigned, rest = single_assignment(stmt), body[index + 1:]
        if assigned is None or assigned[1] is not norm or self_attribute_name(eps) is None or len(rest) != 1 \
                or not m.matches(rest[0], m.SimpleStatementLine(body=[m.Return()])):
            return None
        parts = weight_times(rest[0].body[0].value, assigned[0])
        return (self_attribute_name(parts[0]), self_attribute_name(eps)) if parts is not None else None
    return None


def _binary_operations(node: cst.CSTNode) -> list[cst.BinaryOperation]:
    return nodes_of_type(node, cst.BinaryOperation)


def _scaled_and_rsqrt(node: cst.BinaryOperation) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """`x * torch.rsqrt(d)` / `torch.rsqrt(d) * x` / `x / torch.sqrt(d)` -> (x, d)."""
    def root(call: cst.BaseExpression, name: str) -> cst.BaseExpression | None:
        if isinstance(call, cst.Call) and dotted_name(call.func) == f"torch.{name}" and len(call.args) == 1:
            return bare(call.args[0].value)
        return None

    if isinstance(node.operator, cst.Multiply):
        for scaled, other in ((node.left, node.right), (node.right, node.left)):
            denominator = root(other, "rsqrt")
            if denominator is not None:
                return scaled, denominator
    if isinstance(node.operator, cst.Divide):
        denominator = root(node.right, "sqrt")
        if denominator is not None:
            return node.left, denominator
    return None


def _bound_mean(name: str, earlier: list[cst.BaseStatement | None]) -> tuple[cst.BaseExpression | None, tuple]:
    """The squared tensor of `name = <mean of squares>`, the last assignment to `name` before this line."""
    for index in range(len(earlier) - 1, -1, -1):
        assigned = single_assignment(earlier[index]) if earlier[index] is not None else None
        if assigned is not None and assigned[0] == name:
            squared = _last_dim_mean(assigned[1])
            return (squared, (name, index)) if squared is not None else (None, None)
        if earlier[index] is not None and name in names_in(earlier[index]):
            return None, None
    return None, None


def weight_times(returned: cst.BaseExpression | None, name: str):
    """`self.w * cast(name)` or `cast(name) * self.w` (cast: none, or one `.to(...)`/`.type_as(...)`) ->
    (self.w, cast(name))."""
    if not (isinstance(returned, cst.BinaryOperation) and isinstance(returned.operator, cst.Multiply)):
        return None
    for weight, result in ((returned.left, returned.right), (returned.right, returned.left)):
        if self_attribute_name(weight) is None:
            continue
        inner = result
        if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and inner.func.attr.value in CASTS:
            inner = inner.func.value
        if m.matches(inner, m.Name(name)):
            return weight, bare(result)
    return None
