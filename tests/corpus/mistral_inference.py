"""mistral-inference (Mistral AI): `mistral-inference==VERSION:mistral`, transformer.py's Transformer.

SOURCES = transformer.py, transformer_layers.py, cache.py (mistral_inference/...), imports between them
made local. mistral-inference calls xformers' memory_efficient_attention with its block-diagonal
attention biases; xformers is a CUDA build without CPU kernels, so the site gets the stand-in in
tests/corpus/shims/xformers (dense masks, plain softmax attention, xformers' bias semantics).
simple_parsing (args.py) and its docstring_parser come as light wheels. Calling convention, as
mistral_inference/generate.py: a BufferCache (n_layers, batch, max_seq_len, kv heads, head_dim) goes
into every call, `model.forward(input_ids (flattened), seqlens=[...], cache=cache)` returns one row of
logits per input token.
"""
from __future__ import annotations

from pathlib import Path

from . import core
from .core import Case, CaseError

PACKAGE = "mistral-inference"
DEPENDENCIES = ("simple_parsing", "docstring_parser", "safetensors")
MODELS = ("mistral",)
FILES = {name: f"mistral_inference/{name}" for name in ("transformer.py", "transformer_layers.py", "cache.py")}


def prepare_site(version: str, root: Path) -> Path:
    return core.prepare_site(root, PACKAGE, version, dependencies=DEPENDENCIES, shims=("xformers",))


BODY = '''
from mistral_inference.args import TransformerArgs  # noqa: E402

from cache import BufferCache  # noqa: E402
from transformer import Transformer  # noqa: E402

CONFIG = dict(dim=64, n_layers=2, head_dim=16, hidden_dim=128, n_heads=4, n_kv_heads=2, norm_eps=1e-5,
              vocab_size=VOCAB_SIZE, max_batch_size=1)


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return corpus_support.init_parameters(Transformer(TransformerArgs(**CONFIG)))


def prefill(model, tokens):
    args = model.args
    cache = BufferCache(args.n_layers, 1, MAX_SEQ_LEN, args.n_kv_heads, args.head_dim)
    cache.to(device=tokens.device, dtype=torch.float32)
    cache.reset()
    logits = model.forward(tokens.view(-1), seqlens=[tokens.shape[1]], cache=cache)
    return logits[-1:, :], {"cache": cache}


def decode(model, token, state):
    logits = model.forward(token.view(-1), seqlens=[1], cache=state["cache"])
    return logits[-1:, :], state
'''


def build_target(case: Case, site: Path, dest: Path) -> Path:
    if case.model not in MODELS:
        raise CaseError(f"mistral-inference: no model named {case.model!r} (known: {', '.join(MODELS)})")
    target = core.new_target(case, dest)
    sources = core.copy_sources(site, target, FILES)
    description = (f"mistral-inference=={case.version}: {', '.join(FILES)} are mistral_inference/'s. Transformer with "
                   "tiny TransformerArgs,\ndriven as its generate.py does: a BufferCache into every "
                   "forward(input_ids, seqlens=, cache=).")
    (target / "harness.py").write_text(core.harness_text(
        case, family_name="mistral_inference", site=site, sources=sources, description=description, body=BODY,
        top_modules=("mistral_inference", "xformers")), encoding="utf-8")
    return target
