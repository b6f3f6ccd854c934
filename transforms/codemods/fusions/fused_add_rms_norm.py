"""Under the NPU backends, folds a residual add and the RMSNorm after it into torch_npu's one kernel.

Recognises, in a step method of a class whose `__init__` makes `self.norm = SomeNorm(...)`, where `SomeNorm` is a
class of the same file whose `forward(self, x)` is a hand-written RMSNorm that returns `self.<weight> * <the
normalised x>` with `self.<eps>` as its epsilon (fused_rms_norm's idiom), the statements

    h = a + b                       # the residual add
    ...                             # h read, not assigned
    ... self.norm(h) ...            # the norm of the sum

and writes

    norm_out, _, h = torch_npu.npu_add_rms_norm(a, b, self.norm.<weight>, self.norm.<eps>)
    ... norm_out ...

`npu_add_rms_norm` returns the normalised sum, its reciprocal RMS and the sum itself, so `h` keeps its value for
the residual path. This is the call npugraph_ex's own FX passes build on (they fuse further only graphs that
already call it). It runs before fused_rms_norm in the chain, which rewrites the norm's own `forward`.

Accumulation order: the kernel adds and normalises in its own precision, and applies the weight before the cast
the hand-written norm applies after it; logits move by float rounding.
"""
from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from graphmode.transforms.codemods.base import StepCodemod
from graphmode.transforms.codemods.lib.fusion import NPU, assigned_names, replaced, wants_torch_npu
from graphmode.transforms.codemods.lib.rms_norm import norm_parts
from graphmode.transforms.cstutil import code_of, dotted_name, find_method, nodes_of_type, self_attribute_name, \
    single_assignment


def _rms_norm_classes(module: cst.Module) -> dict[str, tuple[str, str]]:
    """Classes of the file that are RMSNorms by fused_rms_norm's idiom, returning `self.W * x_normed`:
    {class name: (W, the epsilon's attribute)}."""
    found = {}
    for cls in module.body:
        if not isinstance(cls, cst.ClassDef):
            continue
        forward = find_method(cls, "forward")
        if forward is None or len(forward.params.params) != 2 or not isinstance(forward.body, cst.IndentedBlock):
            continue
        parts = norm_parts(list(forward.body.body))
        if parts is not None:
            found[cls.name.value] = parts
    return found


def _norms_of(cls: cst.ClassDef, norm_classes: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """`self.a = SomeNorm(...)` in `__init__`, SomeNorm one of `norm_classes` -> {"a": (weight, eps)}."""
    init = find_method(cls, "__init__")
    found: dict[str, tuple[str, str]] = {}
    for node in nodes_of_type(init, cst.Assign) if init is not None else []:
        if len(node.targets) == 1 and isinstance(node.value, cst.Call):
            name = self_attribute_name(node.targets[0].target)
            made = dotted_name(node.value.func)
            if name is not None and made is not None and made.split(".")[-1] in norm_classes:
                found[name] = norm_classes[made.split(".")[-1]]
    return found


class FusedAddRMSNorm(StepCodemod):
    NAME = "fused_add_rms_norm"
    TITLE = "Fold a residual add and the RMSNorm after it into one kernel (NPU backends)"
    DESCRIPTION = (
        "Under npugraph_ex and GE, `h = a + b` followed by `self.norm(h)` (an RMSNorm of the same file) becomes "
        "`out, _, h = torch_npu.npu_add_rms_norm(a, b, self.norm.weight, self.norm.eps)` on the static path: one "
        "kernel for the add and the norm, the sum still there for the residual, and the call npugraph_ex's own "
        "fusion passes start from. The add and the norm are accumulated in the kernel's precision: logits move by "
        "float rounding."
    )
    SKILL = "fusion"
    FIXES = frozenset()
    FUSION = True

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return options.fused_ops == NPU and ("rsqrt" in words or "sqrt" in words)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self._norm_classes = _rms_norm_classes(tree) if self.options.fused_ops == NPU else {}
        if not self._norm_classes:
            return tree
        return super().transform_module_impl(tree)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef):
        norms = _norms_of(original_node, self._norm_classes)
        if not norms:
            return updated_node
        methods = {stmt: self._folded(stmt, norms) for stmt in original_node.body.body
                   if isinstance(stmt, cst.FunctionDef) and stmt.name.value != "__init__" and self.in_step_code(stmt)}
        if not any(methods.values()):
            return updated_node
        body = [methods.get(stmt) or updated for stmt, updated in zip(original_node.body.body, updated_node.body.body)]
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    def _folded(self, method: cst.FunctionDef, norms: dict[str, tuple[str, str]]) -> cst.FunctionDef | None:
        if not isinstance(method.body, cst.IndentedBlock):
            return None
        body, changed = list(method.body.body), False
        for index, stmt in enumerate(body):
            assigned = single_assignment(stmt)
            if assigned is None or not (isinstance(assigned[1], cst.BinaryOperation)
                                        and isinstance(assigned[1].operator, cst.Add)):
                continue
            total = assigned[0]
            use = self._norm_call_after(body, index, total, norms)
            if use is None:
                continue
            at, call, norm = use
            weight, eps = norms[norm]
            out = f"{norm}_out"
            add = assigned[1]
            wants_torch_npu(self.context)
            self.record_edit(method.body.body[index], f"the add and `self.{norm}` in one torch_npu kernel")
            self.record_edit(method.body.body[at], f"`self.{norm}` of the sum from the fused kernel")
            left, right = code_of(add.left).strip(), code_of(add.right).strip()
            fused = cst.parse_statement(f"{out}, _, {total} = torch_npu.npu_add_rms_norm({left}, {right}, "
                                        f"self.{norm}.{weight}, self.{norm}.{eps})\n")
            comment = cst.EmptyLine(indent=True, comment=cst.Comment(
                f"# graphmode: the residual add and `{norm}` in one kernel (fused)."))
            body[index] = fused.with_changes(leading_lines=[*stmt.leading_lines, comment])
            body[at] = replaced(body[at], {call: cst.Name(out)})
            changed = True
        if not changed:
            return None
        return method.with_changes(body=method.body.with_changes(body=body))

    def _norm_call_after(self, body, index: int, total: str, norms: dict[str, tuple[str, str]]):
        """(index, the `self.norm(total)` call, "norm") of the first statement after `index` that normalises the
        sum, with `total` assigned nowhere in between (and not by an augmented assignment)."""
        for at in range(index + 1, len(body)):
            stmt = body[at]
            for call in nodes_of_type(stmt, cst.Call):
                norm = self_attribute_name(call.func)
                if norm in norms and len(call.args) == 1 and m.matches(call.args[0].value, m.Name(total)):
                    return at, call, norm
            if not isinstance(stmt, cst.SimpleStatementLine) or total in assigned_names(stmt):
                return None
        return None
