"""The bundled example's architecture (examples/legacy_llm/model.py), written by hand in gpt-fast style.

What a person would write for graph mode from the start (after pytorch-labs/gpt-fast model.py):
a KV cache of static buffers written in place at `input_pos`, a boolean causal-mask buffer and
rotary cos/sin tables indexed by `input_pos`, one `forward(idx, input_pos)` for Prefill and Decode,
and no Python-side state between steps. Module and parameter names are the original's, so
`load_from(original)` copies its weights and the two compute the same function (RMSNorm, rotate-half
rotary, grouped-query attention, SwiGLU; attention through F.scaled_dot_product_attention by
default, or the original's matmul/softmax with `sdpa=False`).

Used by bench/three_way.py; not part of graphmode.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class ModelArgs:
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 512
    hidden_dim: int = 344
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 64
    max_batch_size: int = 1

    @classmethod
    def like(cls, original_args, **overrides) -> "ModelArgs":
        """The same sizes as the original example's ModelArgs (any object with those fields)."""
        fields = {name: getattr(original_args, name) for name in cls.__dataclass_fields__
                  if hasattr(original_args, name)}
        return cls(**{**fields, **overrides})


class KVCache(nn.Module):
    def __init__(self, max_batch_size: int, n_kv_heads: int, max_seq_len: int, head_dim: int):
        super().__init__()
        shape = (max_batch_size, n_kv_heads, max_seq_len, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # input_pos: (T,); k, v: (B, H_kv, T, D). Written in place; the whole buffer is returned.
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        return self.k_cache, self.v_cache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, sdpa: bool = True):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.n_rep = args.n_heads // args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.sdpa = sdpa
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.kv_cache = KVCache(args.max_batch_size, args.n_kv_heads, args.max_seq_len, self.head_dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, input_pos: Tensor) -> Tensor:
        bsz, seqlen, _ = x.shape
        q = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        k, v = self.kv_cache.update(input_pos, k, v)
        k = k.repeat_interleave(self.n_rep, dim=1)  # same head order as the original's repeat_kv
        v = v.repeat_interleave(self.n_rep, dim=1)
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
        else:
            scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
            scores = scores.masked_fill(~mask, float("-inf"))
            out = torch.matmul(F.softmax(scores.float(), dim=-1).type_as(q), v)
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, sdpa: bool = True):
        super().__init__()
        self.attention = Attention(args, sdpa)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, input_pos: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs, sdpa: bool = True):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, sdpa) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

        head_dim = args.dim // args.n_heads
        inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(args.max_seq_len, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)  # (S, D)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)
        causal = torch.tril(torch.ones(args.max_seq_len, args.max_seq_len, dtype=torch.bool))
        self.register_buffer("causal_mask", causal, persistent=False)  # (S, S), True = visible

    def forward(self, idx: Tensor, input_pos: Tensor) -> Tensor:
        """idx (B, T) token ids at positions input_pos (T,); returns logits (B, T, V)."""
        mask = self.causal_mask[None, None, input_pos]  # (1, 1, T, S)
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]  # (T, D)
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos)
        return self.output(self.norm(x)).float()

    @torch.no_grad()
    def load_from(self, original: nn.Module) -> "Transformer":
        """Copies the original example's weights (same names); every parameter must match."""
        self.load_state_dict(original.state_dict(), strict=True)
        return self
