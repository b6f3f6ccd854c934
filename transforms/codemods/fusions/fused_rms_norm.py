"""Turns a hand-written RMSNorm into one fused normalisation.

Recognises, in step code, the normalisation written out of elementwise ops

    x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)          # or rsqrt(...) * x, x / torch.sqrt(...)

with the mean of squares inline or bound to a name on an earlier line of the same body (`variance = ...`), and
spelled `x.pow(2)`, `x ** 2`, `x * x`, `x.square()` or `torch.mean(x.pow(2), dim=-1, keepdim=True)`. The `x` of the
squares must be the `x` that is scaled (the same code, `x.float()` both times).

- Portable form (CPU and CUDA backends): `F.rms_norm(x, (x.shape[-1],), eps=eps)`, the same formula as one op.
  The surrounding casts and the weight stay as they were. An unused mean-of-squares line goes.
- NPU form (npugraph_ex, GE): `torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]`, which also applies the weight,
  when the function then returns `self.weight * <the result, cast or not>` (either order) and that is the result's
  only use; the weight is cast to `x`'s dtype, as the kernel wants gamma in its input's dtype. Otherwise the
  portable form (torch_npu runs `rms_norm` too).

Accumulation order: the fused kernel sums the squares in its own order, and the NPU form multiplies by the weight
before the cast instead of after it; logits move by float rounding, which verification measures.
"""
from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from graphmode.transforms.codemods.base import StepCodemod
from graphmode.transforms.codemods.lib.fusion import NPU, bare, functional_prefix, replaced, same_code, wants_torch_npu
from graphmode.transforms.codemods.lib.rms_norm import CASTS, norm_in, weight_times
from graphmode.transforms.cstutil import code_of, names_in, single_assignment


class FusedRMSNorm(StepCodemod):
    NAME = "fused_rms_norm"
    TITLE = "Compute a hand-written RMSNorm with one fused operator"
    DESCRIPTION = (
        "Replaces `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)` (and its spellings) on the static path "
        "with `F.rms_norm(x, (x.shape[-1],), eps=eps)` under the CPU and CUDA backends, or with "
        "`torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]` (the weight folded in) under npugraph_ex and GE: "
        "one kernel where there were five (square, mean, add, rsqrt, multiply) and their intermediates. The sum of "
        "squares is accumulated in the kernel's order: logits move by float rounding."
    )
    SKILL = "fusion"
    FIXES = frozenset()
    FUSION = True
    IDIOM_IN_ONE_FUNCTION = True

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return "mean" in words and ("rsqrt" in words or "sqrt" in words)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef):
        if not isinstance(updated_node.body, cst.IndentedBlock) or not self.in_step_code(original_node):
            return updated_node
        body = list(updated_node.body.body)
        originals = list(original_node.body.body) if isinstance(original_node.body, cst.IndentedBlock) else []
        if len(originals) != len(body):
            return updated_node
        changed = False
        for index, stmt in enumerate(body):
            found = norm_in(stmt, body[:index])
            if found is None:
                continue
            norm, scaled, eps, means_line = found
            new_stmt, tail = self._fused(stmt, norm, scaled, eps, body[index + 1:])
            self.record_edit(originals[index], "one fused RMSNorm operator")
            for offset, (old, new) in enumerate(zip(body[index + 1:], tail), start=index + 1):
                if new is not old:  # the NPU form's return, which no longer applies the weight
                    self.record_edit(originals[offset], "the weight is applied inside the operator")
            body[index] = new_stmt
            body[index + 1:] = tail
            if means_line is not None and not any(means_line[0] in names_in(s) for s in body[index:]):
                self.record_edit(originals[means_line[1]], "the mean of squares is computed inside the operator")
                body[means_line[1]] = None
            changed = True
        if not changed:
            return updated_node
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[s for s in body if s is not None]))

    def _fused(self, stmt: cst.SimpleStatementLine, norm: cst.BinaryOperation, scaled: cst.BaseExpression,
               eps: cst.BaseExpression, after: list[cst.BaseStatement | None]):
        """The statement with the fused call in place of `norm`, and the statements after it (the NPU form may
        rewrite the return that applies the weight)."""
        if self.options.fused_ops == NPU:
            folded = self._npu_with_weight(stmt, norm, scaled, eps, after)
            if folded is not None:
                return folded
        prefix = functional_prefix(self.source.unnumbered_tree, self.context)
        x = code_of(bare(scaled))
        call = cst.parse_expression(f"{prefix}.rms_norm({x}, ({_uncast(scaled)}.shape[-1],), "
                                    f"eps={code_of(eps).strip()})")
        return _commented(replaced(stmt, {norm: call}), "one RMSNorm operator"), after

    def _npu_with_weight(self, stmt, norm, scaled, eps, after):
        """`name = <norm>` followed by `return self.weight * cast(name)` -> one npu_rms_norm call with the weight."""
        assigned = single_assignment(stmt)
        if assigned is None or assigned[1] is not norm and not same_code(assigned[1], norm):
            return None
        name = assigned[0]
        rest = [s for s in after if s is not None]
        if len(rest) != 1 or not m.matches(rest[0], m.SimpleStatementLine(body=[m.Return()])):
            return None
        returned = rest[0].body[0].value
        parts = weight_times(returned, name)
        if parts is None:
            return None
        weight, result = parts
        wants_torch_npu(self.context)
        x = code_of(bare(scaled))
        dtype = "torch.float32" if _cast_name(scaled) == "float" else f"{x}.dtype"
        call = cst.parse_expression(f"torch_npu.npu_rms_norm({x}, {code_of(weight).strip()}.to({dtype}), "
                                    f"epsilon={code_of(eps).strip()})[0]")
        new_return = rest[0].with_changes(body=[rest[0].body[0].with_changes(value=result)])
        return (_commented(replaced(stmt, {norm: call}), "one RMSNorm kernel, the weight applied in it"),
                [new_return if s is rest[0] else s for s in after])


def _cast_name(node: cst.BaseExpression) -> str | None:
    """`x.float()` -> "float", `x.to(torch.float32)` -> "to": the cast a tensor expression ends in, if any."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in CASTS:
        return node.func.attr.value
    return None


def _uncast(node: cst.BaseExpression) -> str:
    """The code of the tensor a cast is applied to (same shape), or of the expression itself."""
    node = bare(node)
    return code_of(node.func.value) if _cast_name(node) is not None else code_of(node)


def _commented(stmt: cst.SimpleStatementLine, why: str) -> cst.SimpleStatementLine:
    comment = cst.EmptyLine(indent=True, comment=cst.Comment(f"# graphmode: {why}, fused (was five ops)."))
    return stmt.with_changes(leading_lines=[*stmt.leading_lines, comment])
