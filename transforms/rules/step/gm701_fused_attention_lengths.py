"""GM701: the lengths passed to Ascend fused attention, and whether their form suits the backend."""
from __future__ import annotations

import ast

from graphmode.transforms.analysis.astutil import method_call_name, name_of
from graphmode.transforms.analysis.idioms import names_assigned, per_function
from graphmode.transforms.rules.base import Rule

FUSED_ATTENTION_OPS = ("npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2")
LENGTH_KEYWORDS = frozenset({"actual_seq_lengths", "actual_seq_lengths_kv", "actual_seq_qlen", "actual_seq_kvlen"})
_AS_LIST = ("list[int]: needs dynamic=True under npugraph_ex (updated at replay); GE needs the torchair.ops variant "
            "with a tensor")
_AS_TENSOR = "a tensor: fine for GE's torchair.ops variant; npugraph_ex expects list[int]"


def _op_name(func: ast.expr) -> str | None:
    """The last name of the callee, skipping an op overload's `.default`."""
    if func.__class__ is ast.Attribute and func.attr == "default":
        func = func.value
    if func.__class__ is ast.Attribute:
        return func.attr
    return name_of(func)


def _length_arguments(call: ast.Call) -> list[ast.keyword]:
    """The length keywords of a call to Ascend fused attention; none for any other call."""
    op = _op_name(call.func)
    if op is None or not op.endswith(FUSED_ATTENTION_OPS):
        return []
    return [a for a in call.keywords if a.arg in LENGTH_KEYWORDS]


def _is_list(node: ast.expr, lists: set[str]) -> bool:
    cls = node.__class__
    if cls is ast.List or cls is ast.ListComp:
        return True
    if cls is ast.BinOp and node.op.__class__ in (ast.Mult, ast.Add):
        return _is_list(node.left, lists) or _is_list(node.right, lists)  # `[1] * bsz`, `a + [n]`
    if cls is ast.Call:
        if method_call_name(node) == "tolist":
            return True
        return node.func.__class__ is ast.Name and node.func.id == "list"
    return name_of(node) in lists


@per_function
def list_names(func: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    """Local names assigned only lists (so `lens = x.tolist(); ...(actual_seq_lengths=lens)` is a list)."""
    return names_assigned(func, _is_list, every=True)


class FusedAttentionLengths(Rule):
    CODE = "GM701"
    MESSAGE = "`{name}` passed to fused attention is {kind}"
    SKILL = "fused-attention"
    STEP_ONLY = True
    VALID = (
        # No lengths passed.
        """
        import torch
        import torch_npu


        class Attention(torch.nn.Module):
            def forward(self, q, k, v):
                out, _ = torch_npu.npu_fused_infer_attention_score(
                    q, k, v, num_heads=self.num_heads, input_layout="BSH"
                )
                return out
        """,
        # Lengths passed as None say nothing about their form.
        """
        import torch
        import torch_npu


        class Attention(torch.nn.Module):
            def forward(self, q, k, v):
                out, _ = torch_npu.npu_fused_infer_attention_score(
                    q, k, v, num_heads=self.num_heads, actual_seq_lengths=None, actual_seq_lengths_kv=None
                )
                return out
        """,
    )
    INVALID = (
        # A list: fine for npugraph_ex with dynamic=True, not for GE.
        """
        import torch
        import torch_npu


        class Attention(torch.nn.Module):
            def forward(self, q, k, v):
                bsz = q.shape[0]
                out, _ = torch_npu.npu_fused_infer_attention_score(
                    q, k, v, num_heads=self.num_heads, actual_seq_lengths=[1] * bsz
                )
                return out
        """,
        # A tensor: fine for GE's torchair.ops variant, not for npugraph_ex.
        """
        import torch
        import torch_npu


        class Attention(torch.nn.Module):
            def forward(self, q, k, v, kv_lens):
                out, _ = torch.ops.npu.npu_fused_infer_attention_score.default(
                    q, k, v, num_heads=self.num_heads, actual_seq_lengths_kv=kv_lens
                )
                return out
        """,
    )

    def visit_Call(self, node: ast.Call) -> None:
        lengths = _length_arguments(node)
        if not lengths or not self.in_step_code(node):
            return
        scope = self.enclosing_function(node)
        lists = list_names(scope) if scope is not None else set()
        for arg in lengths:
            if name_of(arg.value) == "None":
                continue
            kind = _AS_LIST if _is_list(arg.value, lists) else _AS_TENSOR
            self.report(arg, self.MESSAGE.format(name=arg.arg, kind=kind))
