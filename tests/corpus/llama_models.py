"""llama-models (Meta's reference implementation): `llama-models==VERSION:llama3`, llama3/model.py's Transformer.

SOURCES = model.py (llama_models/llama3/model.py; `from .args import ModelArgs` made absolute, so the
args stay on the site). The model builds its layers from fairscale's model-parallel classes; fairscale
ships only an sdist whose package imports far more, so the site gets the stand-in in
tests/corpus/shims/fairscale (world size 1: nn.Linear / nn.Embedding). Calling convention, as the
reference generation.py: `model.forward(tokens, start_pos)` (an int), the caches held in the model.
"""
from __future__ import annotations

from pathlib import Path

from . import core
from .core import Case, CaseError

PACKAGE = "llama-models"
MODELS = {"llama3": "llama_models/llama3/model.py"}


def prepare_site(version: str, root: Path) -> Path:
    return core.prepare_site(root, PACKAGE, version, shims=("fairscale",))


BODY = '''
from llama_models.llama3.args import ModelArgs  # noqa: E402

from model import Transformer  # noqa: E402

CONFIG = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=VOCAB_SIZE, multiple_of=16,
              max_batch_size=1, max_seq_len=MAX_SEQ_LEN)


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return corpus_support.init_parameters(Transformer(ModelArgs(**CONFIG)))


def prefill(model, tokens):
    logits = model(tokens, 0)
    return logits[:, -1, :], {"pos": tokens.shape[1]}


def decode(model, token, state):
    logits = model(token, state["pos"])
    return logits[:, -1, :], {"pos": state["pos"] + 1}
'''


def build_target(case: Case, site: Path, dest: Path) -> Path:
    if case.model not in MODELS:
        raise CaseError(f"llama-models: no model named {case.model!r} (known: {', '.join(MODELS)})")
    if not (site / MODELS[case.model]).is_file():
        raise CaseError(f"llama-models=={case.version} has no {MODELS[case.model]}")
    target = core.new_target(case, dest)
    sources = core.copy_sources(site, target, {"model.py": MODELS[case.model]})
    description = (f"llama-models=={case.version}: model.py is {MODELS[case.model]} (Meta's reference). "
                   "Transformer with a tiny ModelArgs,\ndriven as its generation.py does: "
                   "forward(tokens, start_pos), caches in the model.")
    (target / "harness.py").write_text(core.harness_text(
        case, family_name="llama_models", site=site, sources=sources, description=description, body=BODY,
        top_modules=("llama_models", "fairscale")), encoding="utf-8")
    return target
