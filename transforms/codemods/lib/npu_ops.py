"""The torch_npu fused operators the fusions write under the NPU backends, with the signatures they are written for.

Each signature is the one the torch_npu 2.13.0 wheel registers for the operator's meta function
(`torch_npu/op_plugin/meta/_meta_registrations.py`): the `npu_api` tests hold this table to the wheel, and every
fixture's NPU output is bound against it on CPU (tests/test_npu_fused_ops.py, with `bind_problems`). A call graphmode
writes passes only the arguments it needs, and passes positionally only the leading ones every documentation of the
operator agrees on. Where the meta function and the operator's documented schema (`torch_npu/_op_plugin_docs.py`)
name a leading parameter differently, a keyword for it may not bind on the NPU: `by_position` counts those leading
parameters, and a call passes them by position only (npu_rotary_mul's fourth is `mode` in the meta function and
`rotary_mode` in its documentation; npu_swiglu's first is `x` and `self`).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class NpuOp:
    name: str
    positional: tuple[str, ...]  # parameters in order; those before `required` have no default
    required: int
    keyword_only: tuple[str, ...] = ()
    returns: str = "Tensor"  # what the call gives back, as the wheel's meta function builds it
    computes: str = ""  # what it fuses, for the design document
    by_position: int = 0  # leading parameters named differently by the meta function and the documentation

    def signature(self) -> str:
        """The signature graphmode writes calls for, as Python spells it: `npu_swiglu(x, /, dim=...)`."""
        params = [name if i < self.required else f"{name}=..." for i, name in enumerate(self.positional)]
        if self.by_position:
            params.insert(self.by_position, "/")
        if self.keyword_only:
            params += ["*", *(f"{name}=..." for name in self.keyword_only)]
        return f"{self.name}({', '.join(params)})"


NPU_OPS: dict[str, NpuOp] = {op.name: op for op in (
    NpuOp("npu_rms_norm", ("self", "gamma", "epsilon"), 2, returns="(y, rstd)",
          computes="x * rsqrt(mean(x^2) + epsilon) * gamma in one kernel"),
    NpuOp("npu_add_rms_norm", ("x1", "x2", "gamma", "epsilon"), 3, returns="(y, rstd, x1 + x2)",
          computes="the residual add and the RMSNorm after it in one kernel"),
    NpuOp("npu_swiglu", ("x", "dim"), 1, by_position=1,
          computes="SiLU(first half of x) * second half, halves along dim"),
    NpuOp("npu_rotary_mul", ("embedding", "cosine", "sine", "mode", "rotate"), 3, by_position=4,
          computes="x * cos + rotate_half(x) * sin ('half' mode) in one kernel"),
    NpuOp("npu_fused_infer_attention_score", ("query", "key", "value"), 3,
          keyword_only=("pse_shift", "atten_mask", "actual_seq_lengths", "actual_seq_lengths_kv", "num_heads",
                        "scale", "input_layout", "num_key_value_heads", "sparse_mode", "softmax_lse_flag"),
          returns="(attention_out, softmax_lse)",
          computes="softmax(q k^T * scale, masked) v for a query of any length in one kernel"),
)}


def npu_op_called(call: ast.Call) -> str | None:
    """The operator's name when `call` is `torch_npu.<name>(...)`, else None."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "torch_npu":
        return func.attr
    return None


def bind_problems(call: ast.Call) -> list[str]:
    """Why `torch_npu.<op>(...)` does not bind to the signature NPU_OPS gives the operator; [] when it does."""
    name = npu_op_called(call)
    if name is None:
        return [f"`{ast.unparse(call.func)}(...)` is not a torch_npu.<operator>(...) call"]
    op = NPU_OPS.get(name)
    if op is None:
        return [f"torch_npu.{name} is not in NPU_OPS (transforms/codemods/lib/npu_ops.py): graphmode writes only "
                f"{', '.join(sorted(NPU_OPS))}"]
    where = f"torch_npu.{name} (NPU_OPS: {op.signature()})"
    if any(isinstance(arg, ast.Starred) for arg in call.args) or any(kw.arg is None for kw in call.keywords):
        return [f"{where}: *args or **kwargs cannot be bound before run time; graphmode writes each argument"]
    problems = []
    given = list(op.positional[:len(call.args)])
    if len(call.args) > len(op.positional):
        problems.append(f"{where}: {len(call.args)} positional arguments, at most {len(op.positional)}")
    known = set(op.positional) | set(op.keyword_only)
    for keyword in call.keywords:
        if keyword.arg not in known:
            problems.append(f"{where}: unknown keyword {keyword.arg!r}")
        elif keyword.arg in given:
            problems.append(f"{where}: {keyword.arg!r} is given twice")
        elif keyword.arg in op.positional[:op.by_position]:
            problems.append(f"{where}: {keyword.arg!r} is passed by keyword; pass it by position (the operator's "
                            f"documentation names parameter {op.positional.index(keyword.arg) + 1} differently)")
        given.append(keyword.arg)
    missing = [param for param in op.positional[:op.required] if param not in given]
    if missing:
        problems.append(f"{where}: missing required {', '.join(map(repr, missing))}")
    return problems
