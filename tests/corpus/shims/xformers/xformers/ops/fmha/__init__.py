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
    scores = (q @ k.transpose(-2, -1)) * scale
    if isinstance(attn_bias, AttentionBias):
        scores = scores + attn_bias.materialize(scores.shape[-2:], dtype=scores.dtype, device=scores.device)
    elif attn_bias is not None:
        scores = scores + attn_bias
    return (scores.softmax(-1) @ v).transpose(1, 2).contiguous()
