"""Stand-in (graphmode corpus tests) for xformers.ops.fmha.attn_bias: block-diagonal biases over
sequences packed along one axis, materialized as dense (Mq, Mk) additive masks (0 or -inf)."""
from __future__ import annotations

from typing import Sequence

import torch


class AttentionBias:
    def materialize(self, shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
        raise NotImplementedError


def _starts(lengths: Sequence[int]) -> list[int]:
    out, at = [], 0
    for length in lengths:
        out.append(at)
        at += length
    return out


class BlockDiagonalMask(AttentionBias):
    """Query block b attends key block b only; optionally causal (aligned top-left or bottom-right)
    and local (a window of keys)."""

    _causal: str | None = None  # None, "top_left" or "bottom_right"

    def __init__(self, q_seqlen: Sequence[int], kv_seqlen: Sequence[int], kv_starts: Sequence[int] | None = None,
                 causal: str | None = None, window: int | None = None):
        self.q_seqlen = [int(s) for s in q_seqlen]
        self.kv_seqlen = [int(s) for s in kv_seqlen]
        self.kv_starts = list(kv_starts) if kv_starts is not None else _starts(self.kv_seqlen)
        self.causal = causal if causal is not None else self._causal
        self.window = window

    @classmethod
    def from_seqlens(cls, q_seqlen, kv_seqlen=None):
        return cls(q_seqlen, q_seqlen if kv_seqlen is None else kv_seqlen)

    def _with(self, causal, window):
        return BlockDiagonalMask(self.q_seqlen, self.kv_seqlen, self.kv_starts, causal, window)

    def make_causal(self):
        return self._with("top_left", self.window)

    def make_causal_from_bottomright(self):
        return self._with("bottom_right", self.window)

    def make_local_attention(self, window_size: int):
        return self._with("top_left", window_size)

    def make_local_attention_from_bottomright(self, window_size: int):
        return self._with("bottom_right", window_size)

    def materialize(self, shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
        allowed = torch.zeros(tuple(shape)[-2:], dtype=torch.bool, device=device)
        for q_start, q_len, kv_start, kv_len in zip(_starts(self.q_seqlen), self.q_seqlen, self.kv_starts,
                                                    self.kv_seqlen):
            i = torch.arange(q_len, device=device)[:, None]
            j = torch.arange(kv_len, device=device)[None, :]
            row = i + (kv_len - q_len if self.causal == "bottom_right" else 0)
            ok = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
            if self.causal is not None:
                ok &= j <= row
            if self.window is not None:
                ok &= row - j < self.window
            allowed[q_start:q_start + q_len, kv_start:kv_start + kv_len] = ok
        bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
        return bias.masked_fill(~allowed, float("-inf"))


class BlockDiagonalCausalMask(BlockDiagonalMask):
    _causal = "top_left"


class BlockDiagonalCausalWithOffsetPaddedKeysMask(BlockDiagonalMask):
    """Keys of sequence b live in slots [b * kv_padding, b * kv_padding + kv_seqlen[b]); causal from the
    bottom right (the queries are the last q_seqlen[b] positions of sequence b)."""

    _causal = "bottom_right"

    @classmethod
    def from_seqlens(cls, q_seqlen, kv_padding: int, kv_seqlen):
        return cls(q_seqlen, kv_seqlen, [b * kv_padding for b in range(len(kv_seqlen))])
