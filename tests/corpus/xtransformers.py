"""x-transformers (lucidrains): `x-transformers==VERSION:decoder`, TransformerWrapper(Decoder).

SOURCES = xtransformers.py (x_transformers/x_transformers.py, renamed so it does not shadow the
package) and attend.py (x_transformers/attend.py), with the imports between them made local. einops
and einx (and einx's frozendict) are unzipped into the site. Calling convention, as its
AutoregressiveWrapper.generate: the whole sequence so far goes in every step, with
`return_intermediates=True` and `cache=` the intermediates of the previous call (the wrapper then
runs only the newest token against the cached keys and values).
"""
from __future__ import annotations

from pathlib import Path

from . import core
from .core import Case, CaseError

PACKAGE = "x-transformers"
DEPENDENCIES = ("einops>=0.8.0", "einx>=0.3.0", "frozendict")
CONFIGS = {
    # Rotary positions, pre-norm, 4 heads of 32 (x-transformers rotates at least 32 dims per head).
    "decoder": {"num_tokens": core.VOCAB_SIZE, "max_seq_len": core.MAX_SEQ_LEN,
                "layers": {"dim": 64, "depth": 2, "heads": 4, "attn_dim_head": 32, "rotary_pos_emb": True,
                           "ff_mult": 2}},
}


def prepare_site(version: str, root: Path) -> Path:
    return core.prepare_site(root, PACKAGE, version, dependencies=DEPENDENCIES)


BODY = '''
from xtransformers import Decoder, TransformerWrapper  # noqa: E402

CONFIG = {config!r}


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = TransformerWrapper(num_tokens=CONFIG["num_tokens"], max_seq_len=CONFIG["max_seq_len"],
                               attn_layers=Decoder(**CONFIG["layers"]))
    return corpus_support.init_parameters(model)


def prefill(model, tokens):
    logits, cache = model(tokens, return_intermediates=True)
    return logits[:, -1, :], {{"seq": tokens, "cache": cache}}


def decode(model, token, state):
    seq = torch.cat([state["seq"], token], dim=-1)
    logits, cache = model(seq, return_intermediates=True, cache=state["cache"])
    return logits[:, -1, :], {{"seq": seq, "cache": cache}}
'''


def build_target(case: Case, site: Path, dest: Path) -> Path:
    if case.model not in CONFIGS:
        raise CaseError(f"x-transformers: no tiny config named {case.model!r} (known: {', '.join(CONFIGS)})")
    target = core.new_target(case, dest)
    sources = core.copy_sources(site, target, {"xtransformers.py": "x_transformers/x_transformers.py",
                                               "attend.py": "x_transformers/attend.py"})
    description = (f"x-transformers=={case.version}: xtransformers.py and attend.py are "
                   "x_transformers/x_transformers.py "
                   "and attend.py.\nTransformerWrapper(Decoder) driven as AutoregressiveWrapper.generate does: "
                   "the sequence so far, return_intermediates=True, cache=.")
    (target / "harness.py").write_text(core.harness_text(
        case, family_name="xtransformers", site=site, sources=sources, description=description,
        body=BODY.format(config=CONFIGS[case.model]), top_modules=("x_transformers",)), encoding="utf-8")
    return target
