"""GM701: the lengths passed to Ascend fused attention, and whether their form suits the backend."""
from __future__ import annotations

import libcst as cst

from transforms.cstutil import method_call_name
from transforms.rules.base import Rule
from transforms.rules.idioms import local_assignments

FUSED_ATTENTION_OPS = ("npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2")
LENGTH_KEYWORDS = frozenset({"actual_seq_lengths", "actual_seq_lengths_kv", "actual_seq_qlen", "actual_seq_kvlen"})
_AS_LIST = "list[int]: needs dynamic=True under npugraph_ex (updated at replay); GE needs the torchair.ops variant with a tensor"
_AS_TENSOR = "a tensor: fine for GE's torchair.ops variant; npugraph_ex expects list[int]"


def _op_name(func: cst.BaseExpression) -> str | None:
    """The last name of the callee, skipping an op overload's `.default`."""
    if isinstance(func, cst.Attribute) and func.attr.value == "default":
        func = func.value
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def _is_list(node: cst.BaseExpression, lists: set[str]) -> bool:
    if isinstance(node, (cst.List, cst.ListComp)):
        return True
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Multiply, cst.Add)):
        return _is_list(node.left, lists) or _is_list(node.right, lists)  # `[1] * bsz`, `a + [n]`
    if isinstance(node, cst.Call):
        if method_call_name(node) == "tolist":
            return True
        return isinstance(node.func, cst.Name) and node.func.value == "list"
    return isinstance(node, cst.Name) and node.value in lists


def _list_names(func: cst.FunctionDef | None) -> set[str]:
    """Local names assigned only lists (so `lens = x.tolist(); ...(actual_seq_lengths=lens)` is a list)."""
    if func is None:
        return set()
    names: set[str] = set()
    assigned = local_assignments(func)
    changed = True
    while changed:
        changed = False
        for name, values in assigned.items():
            if name not in names and all(_is_list(v, names) for v in values):
                names.add(name)
                changed = True
    return names


class FusedAttentionLengths(Rule):
    CODE = "GM701"
    MESSAGE = "`{name}` passed to fused attention is {kind}"
    SKILL = "fused-attention"

    def visit_Call(self, node: cst.Call) -> None:
        op = _op_name(node.func)
        if op is None or not op.endswith(FUSED_ATTENTION_OPS):
            return
        lengths = [a for a in node.args if a.keyword is not None and a.keyword.value in LENGTH_KEYWORDS]
        if not lengths or not self.in_step_code(node):
            return
        lists = _list_names(self.enclosing_function(node))
        for arg in lengths:
            if isinstance(arg.value, cst.Name) and arg.value.value == "None":
                continue
            kind = _AS_LIST if _is_list(arg.value, lists) else _AS_TENSOR
            self.report(arg, self.MESSAGE.format(name=arg.keyword.value, kind=kind))
