"""torchtune (PyTorch): `torchtune==VERSION:llama3`, a TransformerDecoder built like models.llama3.llama3().

SOURCES = transformer.py, attention.py, kv_cache.py, position_embeddings.py (torchtune/modules/...),
imports between them made local. torchtune's package __init__ (and torchtune.modules') imports torchao
(a compiled dependency); the harness registers those packages without running their __init__ and
builds the llama3 decoder from the copied modules, the way torchtune/models/llama3/_component_builders.py
does (RMSNorm and FeedForward come from the site, unchanged). Calling convention, as
torchtune.generation.generate with KV caches: `model.setup_caches(batch_size=1, dtype=...,
decoder_max_seq_len=N)`, then `model(tokens, input_pos=..., mask=...)`, the mask rows of a
(N, N) lower-triangular bool matrix: `masks[:, :T]` for the prompt, `masks[:, pos, None, :]` per step.
"""
from __future__ import annotations

from pathlib import Path

from . import core
from .core import Case, CaseError

PACKAGE = "torchtune"
MODELS = ("llama3",)
FILES = {name: f"torchtune/modules/{name}"
         for name in ("transformer.py", "attention.py", "kv_cache.py", "position_embeddings.py")}
# `from torchtune.modules import MultiHeadAttention` (the package re-export) -> the copy.
REEXPORTS = {("torchtune.modules", "MultiHeadAttention"): "torchtune.modules.attention"}


def prepare_site(version: str, root: Path) -> Path:
    return core.prepare_site(root, PACKAGE, version)


BODY = '''
for _package in ("torchtune", "torchtune.modules", "torchtune.utils", "torchtune.models"):
    corpus_support.bare_package(_package, SITE)  # torchtune/__init__ and modules/__init__ import torchao

from torch import nn  # noqa: E402
from torchtune.modules.feed_forward import FeedForward  # noqa: E402
from torchtune.modules.rms_norm import RMSNorm  # noqa: E402

from attention import MultiHeadAttention  # noqa: E402
from position_embeddings import RotaryPositionalEmbeddings  # noqa: E402
from transformer import TransformerDecoder, TransformerSelfAttentionLayer  # noqa: E402

CONFIG = dict(vocab_size=VOCAB_SIZE, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=128)


def _llama3(vocab_size, num_layers, num_heads, num_kv_heads, embed_dim, intermediate_dim, norm_eps=1e-5):
    """torchtune.models.llama3._component_builders.llama3, with the target's copies of the modules."""
    head_dim = embed_dim // num_heads
    rope = RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=MAX_SEQ_LEN, base=500000.0)
    self_attn = MultiHeadAttention(
        embed_dim=embed_dim, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        q_proj=nn.Linear(embed_dim, num_heads * head_dim, bias=False),
        k_proj=nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False),
        v_proj=nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False),
        output_proj=nn.Linear(embed_dim, embed_dim, bias=False),
        pos_embeddings=rope, max_seq_len=MAX_SEQ_LEN, attn_dropout=0.0)
    mlp = FeedForward(gate_proj=nn.Linear(embed_dim, intermediate_dim, bias=False),
                      down_proj=nn.Linear(intermediate_dim, embed_dim, bias=False),
                      up_proj=nn.Linear(embed_dim, intermediate_dim, bias=False))
    layer = TransformerSelfAttentionLayer(attn=self_attn, mlp=mlp, sa_norm=RMSNorm(dim=embed_dim, eps=norm_eps),
                                          mlp_norm=RMSNorm(dim=embed_dim, eps=norm_eps))
    return TransformerDecoder(tok_embeddings=nn.Embedding(vocab_size, embed_dim), layers=layer,
                              num_layers=num_layers, max_seq_len=MAX_SEQ_LEN, num_heads=num_heads,
                              head_dim=head_dim, norm=RMSNorm(embed_dim, eps=norm_eps),
                              output=nn.Linear(embed_dim, vocab_size, bias=False))


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = corpus_support.init_parameters(_llama3(**CONFIG))
    model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=MAX_SEQ_LEN)
    return model


def _masks():
    return torch.tril(torch.ones(MAX_SEQ_LEN, MAX_SEQ_LEN, dtype=torch.bool)).unsqueeze(0)


def prefill(model, tokens):
    length = tokens.shape[1]
    model.reset_caches()
    input_pos = torch.arange(0, length).unsqueeze(0)
    logits = model(tokens, input_pos=input_pos, mask=_masks()[:, :length])
    return logits[:, -1, :], {"pos": length}


def decode(model, token, state):
    pos = state["pos"]
    input_pos = torch.tensor([[pos]])
    logits = model(token, input_pos=input_pos, mask=_masks()[:, pos, None, :])
    return logits[:, -1, :], {"pos": pos + 1}
'''


def build_target(case: Case, site: Path, dest: Path) -> Path:
    if case.model not in MODELS:
        raise CaseError(f"torchtune: no model named {case.model!r} (known: {', '.join(MODELS)})")
    target = core.new_target(case, dest)
    sources = core.copy_sources(site, target, FILES, REEXPORTS)
    description = (f"torchtune=={case.version}: {', '.join(FILES)} are torchtune/modules/'s. A tiny llama3 "
                   "TransformerDecoder built from them,\ndriven as torchtune.generation.generate does with KV "
                   "caches: setup_caches, then model(tokens, input_pos=, mask=).")
    (target / "harness.py").write_text(core.harness_text(
        case, family_name="torchtune", site=site, sources=sources, description=description, body=BODY,
        top_modules=("torchtune",)), encoding="utf-8")
    return target
