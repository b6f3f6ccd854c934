"""Under the NPU backends, applies rotary position embeddings with torch_npu's one kernel.

Recognises, in step code, `x * cos + rotate_half(x) * sin` (either order of each product and of the sum), where
`rotate_half` is a function of the same file whose return is `torch.cat((-x2, x1), dim=-1)`: the "half" layout,
the first half of the head dim rotated against the second. It becomes

    torch_npu.npu_rotary_mul(x, cos[(None,) * (x.dim() - cos.dim())], sin[(None,) * (x.dim() - sin.dim())])

one kernel for the four elementwise ops, the cat and the negation. The kernel wants 4-D tables that broadcast over
the heads (`(1, 1, seq, dim)` or `(batch, 1, seq, dim)` for a `(batch, heads, seq, dim)` input); the indexing puts
the missing leading dims in front of a `(seq, dim)` table and leaves a 4-D one as it is. Only the arguments every
documentation of the operator agrees on are passed, by position (its fourth parameter's name differs between them).

Nothing changes under the CPU and CUDA backends, whose compilers fuse these elementwise ops themselves.

Accumulation order: the kernel computes the same products and sum per element, in its own precision.
"""
from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from graphmode.transforms.codemods.base import StepCodemod
from graphmode.transforms.codemods.lib.fusion import NPU, bare, same_code, wants_torch_npu
from graphmode.transforms.cstutil import code_of, nodes_of_type


def _half_rotations(module: cst.Module) -> frozenset[str]:
    """Top-level functions of one parameter whose last statement returns `torch.cat((-b, a), dim=-1)` (or `[...]`,
    or `dim` positional): rotate_half in the "half" layout."""
    found = set()
    for stmt in module.body:
        if not (isinstance(stmt, cst.FunctionDef) and len(stmt.params.params) == 1
                and isinstance(stmt.body, cst.IndentedBlock) and stmt.body.body):
            continue
        last = stmt.body.body[-1]
        if not m.matches(last, m.SimpleStatementLine(body=[m.Return()])):
            continue
        value = last.body[0].value
        if not (isinstance(value, cst.Call) and code_of(value.func).strip() == "torch.cat" and len(value.args) == 2):
            continue
        pieces, dim = value.args[0].value, value.args[1]
        if not (isinstance(pieces, (cst.Tuple, cst.List)) and len(pieces.elements) == 2):
            continue
        first, second = (e.value for e in pieces.elements)
        negated = isinstance(first, cst.UnaryOperation) and isinstance(first.operator, cst.Minus)
        if negated and isinstance(first.expression, cst.Name) and isinstance(second, cst.Name) \
                and code_of(dim.value).strip() == "-1" and (dim.keyword is None or dim.keyword.value == "dim"):
            found.add(stmt.name.value)
    return frozenset(found)


def _product(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    node = bare(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return node.left, node.right
    return None


class FusedRotary(StepCodemod):
    NAME = "fused_rotary"
    TITLE = "Apply rotary embeddings with torch_npu's one kernel (NPU backends)"
    DESCRIPTION = (
        "Under npugraph_ex and GE, replaces `x * cos + rotate_half(x) * sin` on the static path with "
        "`torch_npu.npu_rotary_mul(x, cos, sin)` (the tables given the 4-D shape the kernel wants): one kernel for "
        "the multiplies, the add, the negation and the cat, per query and per key. Not under the CPU and CUDA "
        "backends, whose compilers fuse these elementwise ops themselves."
    )
    SKILL = "fusion"
    FIXES = frozenset()
    FUSION = True

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return options.fused_ops == NPU and "cat" in words

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self._rotations = _half_rotations(tree) if self.options.fused_ops == NPU else frozenset()
        if not self._rotations:
            return tree
        return super().transform_module_impl(tree)

    def leave_BinaryOperation(self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation):
        if not isinstance(original_node.operator, cst.Add) or not self.in_step_code(original_node):
            return updated_node
        found = self._rotary(original_node)
        if found is None:
            return updated_node
        x, cos, sin = (code_of(part).strip() for part in found)
        wants_torch_npu(self.context)
        self.record_edit(original_node, "rotary embedding in one torch_npu kernel")
        call = cst.parse_expression(
            f"torch_npu.npu_rotary_mul({x}, {_as_4d(cos, x)}, {_as_4d(sin, x)})")
        return call.with_changes(lpar=original_node.lpar, rpar=original_node.rpar)

    def _rotary(self, node: cst.BinaryOperation):
        """(x, cos, sin) of `x * cos + rotate_half(x) * sin`, any order."""
        products = [_product(node.left), _product(node.right)]
        if None in products:
            return None
        for plain, rotated in (products, products[::-1]):
            for x, cos in (plain, plain[::-1]):
                for turned, sin in (rotated, rotated[::-1]):
                    if isinstance(turned, cst.Call) and code_of(turned.func).strip() in self._rotations \
                            and len(turned.args) == 1 and same_code(turned.args[0].value, x) \
                            and not nodes_of_type(x, cst.Call) and not nodes_of_type(cos, cst.Call) \
                            and not nodes_of_type(sin, cst.Call):
                        return x, cos, sin
        return None


def _as_4d(table: str, x: str) -> str:
    """The table with leading dims put in front until it has as many as `x` (no copy; a 4-D table unchanged)."""
    wrapped = table if table.isidentifier() else f"({table})"
    return f"{wrapped}[(None,) * ({x}.dim() - {wrapped}.dim())]"
