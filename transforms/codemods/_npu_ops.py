"""The torch_npu fused operators the fusions write under the NPU backends, with the signatures they are written for.

Each signature is the one the torch_npu 2.13.0 wheel registers for the operator's meta function
(`torch_npu/op_plugin/meta/_meta_registrations.py`): the `npu_api` tests hold this table to the wheel, and every
fixture's NPU output is bound against it on CPU (tests/test_npu_fused_ops.py). A call graphmode writes passes only
the arguments it needs, and passes positionally only the leading ones every documentation of the operator agrees on.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NpuOp:
    name: str
    positional: tuple[str, ...]  # parameters in order; those before `required` have no default
    required: int
    keyword_only: tuple[str, ...] = ()
    returns: str = "Tensor"  # what the call gives back, as the wheel's meta function builds it
    computes: str = ""  # what it fuses, for the design document


NPU_OPS: dict[str, NpuOp] = {op.name: op for op in (
    NpuOp("npu_rms_norm", ("self", "gamma", "epsilon"), 2, returns="(y, rstd)",
          computes="x * rsqrt(mean(x^2) + epsilon) * gamma in one kernel"),
    NpuOp("npu_add_rms_norm", ("x1", "x2", "gamma", "epsilon"), 3, returns="(y, rstd, x1 + x2)",
          computes="the residual add and the RMSNorm after it in one kernel"),
    NpuOp("npu_swiglu", ("x", "dim"), 1, computes="SiLU(first half of x) * second half, halves along dim"),
    NpuOp("npu_rotary_mul", ("embedding", "cosine", "sine", "mode", "rotate"), 3,
          computes="x * cos + rotate_half(x) * sin ('half' mode) in one kernel"),
    NpuOp("npu_fused_infer_attention_score", ("query", "key", "value"), 3,
          keyword_only=("pse_shift", "atten_mask", "actual_seq_lengths", "actual_seq_lengths_kv", "num_heads",
                        "scale", "input_layout", "num_key_value_heads", "sparse_mode", "softmax_lse_flag"),
          returns="(attention_out, softmax_lse)",
          computes="softmax(q k^T * scale, masked) v for a query of any length in one kernel"),
)}
