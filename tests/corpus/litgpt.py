"""litgpt (Lightning AI): `litgpt==VERSION:MODEL`, the GPT class of litgpt/model.py.

SOURCES = model.py (litgpt/model.py; `from litgpt.config import Config` stays on the site). litgpt's
package __init__ imports its API and litgpt/utils.py imports lightning, neither of which the model
needs: the harness registers `litgpt` without running its __init__ and stands in for `litgpt.utils`
with the one helper config.py imports (`find_multiple`); `litgpt.model` is the target's model.py, so
the config's `mlp_class` resolves to the copy graphmode rewrites. Calling convention, as litgpt's
generate/base.py: `model.max_seq_length = N; model.set_kv_cache(batch_size=1)`, then
`model(idx, input_pos)` with `input_pos = torch.arange(T)` for the prompt and `torch.tensor([pos])`
for each Decode step; the KV cache lives in the model.

MODEL picks a tiny config in litgpt's own vocabulary (CONFIGS): `llama` (RMSNorm, LLaMAMLP, grouped
queries) or `pythia` (GPT-NeoX style: LayerNorm, parallel residual, partial rotary, biases).
"""
from __future__ import annotations

from pathlib import Path

from . import core
from .core import Case, CaseError

PACKAGE = "litgpt"
DEPENDENCIES = ("pyyaml", "typing_extensions")

_SHAPE = dict(block_size=core.MAX_SEQ_LEN, vocab_size=core.VOCAB_SIZE, padded_vocab_size=core.VOCAB_SIZE,
              n_layer=2, n_head=4, n_embd=64)
CONFIGS = {
    "llama": {**_SHAPE, "name": "tiny-llama", "n_query_groups": 2, "rotary_percentage": 1.0,
              "parallel_residual": False, "bias": False, "norm_class_name": "RMSNorm",
              "mlp_class_name": "LLaMAMLP", "intermediate_size": 128},
    "pythia": {**_SHAPE, "name": "tiny-pythia", "rotary_percentage": 0.25, "parallel_residual": True,
               "bias": True, "norm_class_name": "LayerNorm", "mlp_class_name": "GptNeoxMLP",
               "intermediate_size": 128},
}


def prepare_site(version: str, root: Path) -> Path:
    return core.prepare_site(root, PACKAGE, version, dependencies=DEPENDENCIES)


BODY = '''
corpus_support.bare_package("litgpt", SITE)  # its __init__ imports litgpt.api (lightning)


def find_multiple(n: int, k: int) -> int:  # litgpt.utils.find_multiple; litgpt/utils.py imports lightning
    return n if n % k == 0 else n + k - (n % k)


corpus_support.stub_module("litgpt.utils", find_multiple=find_multiple)

import model as model_module  # noqa: E402
from litgpt.config import Config  # noqa: E402

corpus_support.alias_module("litgpt.model", model_module)  # Config.mlp_class reads litgpt.model
CONFIG = {config!r}


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = model_module.GPT(Config(**CONFIG))
    corpus_support.init_parameters(model)
    model.max_seq_length = MAX_SEQ_LEN
    model.set_kv_cache(batch_size=1)
    return model.eval()


def prefill(model, tokens):
    input_pos = torch.arange(0, tokens.shape[1])
    logits = model(tokens, input_pos)
    return logits[:, -1, :], {{"pos": tokens.shape[1]}}


def decode(model, token, state):
    input_pos = torch.tensor([state["pos"]])
    logits = model(token, input_pos)
    return logits[:, -1, :], {{"pos": state["pos"] + 1}}
'''


def build_target(case: Case, site: Path, dest: Path) -> Path:
    if case.model not in CONFIGS:
        raise CaseError(f"litgpt: no tiny config named {case.model!r} (known: {', '.join(CONFIGS)})")
    target = core.new_target(case, dest)
    sources = core.copy_sources(site, target, {"model.py": "litgpt/model.py"})
    description = (f"litgpt=={case.version}: model.py is litgpt/model.py. GPT with the tiny {case.model!r} config, "
                   "driven as litgpt's generate does:\nset_kv_cache, then model(idx, input_pos).")
    (target / "harness.py").write_text(core.harness_text(
        case, family_name="litgpt", site=site, sources=sources, description=description,
        body=BODY.format(config=CONFIGS[case.model]), top_modules=("litgpt",)), encoding="utf-8")
    return target
