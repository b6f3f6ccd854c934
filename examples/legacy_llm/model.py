"""A small decoder-only language model, written the way much older inference code is.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU feed-forward,
with a key/value cache that grows by concatenation and is passed around as tuples.
Nothing here was written with graph mode in mind: that is the point of this example.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


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


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        norm = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return norm.type_as(x) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q, k, cos, sin):
    # cos/sin are (seqlen, head_dim); q/k are (bsz, heads, seqlen, head_dim).
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(x, n_rep: int):
    if n_rep == 1:
        return x
    bsz, n_kv_heads, seqlen, head_dim = x.shape
    x = x[:, :, None, :, :].expand(bsz, n_kv_heads, n_rep, seqlen, head_dim)
    return x.reshape(bsz, n_kv_heads * n_rep, seqlen, head_dim)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions):
        # Build the table only as far as the furthest position asked for.
        seq_len = positions.max().item() + 1
        t = torch.arange(seq_len, dtype=torch.float32, device=positions.device)
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[positions], emb.sin()[positions]


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.n_rep = args.n_heads // args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.rotary = RotaryEmbedding(self.head_dim, args.rope_theta)

    def forward(self, x, start_pos: int, mask, past_key_value=None):
        bsz, seqlen, _ = x.shape
        q = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)

        positions = torch.arange(start_pos, start_pos + seqlen, device=x.device)
        cos, sin = self.rotary(positions)
        q, k = apply_rotary(q, k, cos, sin)

        # Append this step's keys and values to everything seen so far.
        if past_key_value is not None:
            k = torch.cat([past_key_value[0], k], dim=2)
            v = torch.cat([past_key_value[1], v], dim=2)
        present = (k, v)

        k = repeat_kv(k, self.n_rep)
        v = repeat_kv(v, self.n_rep)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        probs = F.softmax(scores.float(), dim=-1).type_as(q)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(bsz, seqlen, -1)
        return self.wo(out), present


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x, start_pos: int, mask, past_key_value=None):
        attn_out, present = self.attention(self.attention_norm(x), start_pos, mask, past_key_value)
        h = x + attn_out
        return h + self.feed_forward(self.ffn_norm(h)), present


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens, start_pos: int, past_key_values=None):
        bsz, seqlen = tokens.shape
        assert tokens.max().item() < self.args.vocab_size, "token id out of range"
        h = self.tok_embeddings(tokens)

        mask = None
        if seqlen > 1:
            mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device)
            mask = torch.triu(mask, diagonal=1)
            # Every cached position is visible to every new token.
            mask = torch.hstack([torch.zeros((seqlen, start_pos), device=tokens.device), mask])

        if past_key_values is None:
            past_key_values = [None] * len(self.layers)
        presents = []
        for layer, past in zip(self.layers, past_key_values):
            h, present = layer(h, start_pos, mask, past)
            presents.append(present)

        if seqlen > 1:
            # The prompt's last position is the only one whose logits are needed.
            h = h[:, -1:, :]
        h = self.norm(h)
        logits = self.output(h).float()
        return logits, tuple(presents)
