"""Stand-in (graphmode corpus tests): memory_efficient_attention as dense softmax attention."""
from __future__ import annotations

import torch

from xformers.ops.fmha import attn_bias as attn_bias  # noqa: F401
from xformers.ops.fmha.attn_bias import AttentionBias


def memory_efficient_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attn_bias: AttentionBias | torch.Tensor | None = None, p: float = 0.0,
                               scale: float | None = None, **_: object) -> torch.Tensor:
    """query (B, Mq, H, D), key/value (B, Mk, H, D) -> (B, Mq, H, D)."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (B, H, M, D)
    if isinstance(attn_bias, AttentionBias):
        bias = attn_bias.materialize((q.shape[-2], k.shape[-2]), dtype=q.dtype, device=q.device)
        # xformers' kernels never read the keys no query may see (cache slots not written yet, often
        # torch.empty memory that can hold NaN); a dense softmax would, and 0 * NaN is NaN. Zero them.
        unseen = torch.isneginf(bias).all(dim=-2)[..., None]  # (..., Mk, 1)
        k, v = k.masked_fill(unseen, 0), v.masked_fill(unseen, 0)
        return ((q @ k.transpose(-2, -1)) * scale + bias).softmax(-1).matmul(v).transpose(1, 2).contiguous()
    scores = (q @ k.transpose(-2, -1)) * scale
    if attn_bias is not None:
        scores = scores + attn_bias
    return (scores.softmax(-1) @ v).transpose(1, 2).contiguous()
