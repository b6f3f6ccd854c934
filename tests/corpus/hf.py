"""transformers: targets from modeling files of released transformers wheels (the corpus tests).

A case is `transformers==VERSION:MODEL` (or the short `VERSION:MODEL`), MODEL a folder under
transformers/models/. For each VERSION we

1. `pip download --no-deps transformers==VERSION` and unzip the whole wheel (its `transformers/`
   package and its dist-info) into a private "site" folder. An extracted modeling file imports its
   own package (`from ...modeling_utils import ...`, `cache_utils`, `modeling_attn_mask_utils`),
   so a case runs against that release itself, never against the installed transformers.
2. Read the release's own runtime version checks (`dependency_versions_check.pkgs_to_check_at_runtime`
   and `dependency_versions_table.deps`, parsed, not executed). Any package installed here that fails
   them (for 4.36.2: tokenizers<0.19 and huggingface-hub<1.0) gets a matching wheel,
   `pip download --no-deps --only-binary=:all:`, unzipped into the same site folder. A wheel with a C
   extension is then the build for this interpreter (cp311 manylinux), or the case cannot be built.

For each MODEL we write a target folder: `model.py`, a copy of `models/MODEL/modeling_MODEL.py` with
its relative imports made absolute (`from ...activations` -> `from transformers.activations`) by
libcst (line numbers unchanged), and a harness.py that drives `<Model>ForCausalLM` in its own calling
convention (`input_ids`, `past_key_values`, `use_cache=True`; `.logits` and `.past_key_values`; 5.x names the
cache `cache` in both places, see `cache_keyword`).

Each model names its config fields its own way (GPT-2 n_embd/n_layer/n_head/n_positions, OPT ffn_dim
and word_embed_proj_dim, Bloom n_head, Falcon new_decoder_architecture/multi_query, MPT d_model...):
`tiny_config(model)` gives every one the same tiny shape (hidden 64, 2 layers, 4 heads, vocab 256,
64 positions) from TINY_CONFIG and the per-model table CONFIG_OVERRIDES.
"""
from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

from packaging.requirements import Requirement

from . import core
from .core import Case, CaseError

PACKAGE = "transformers"

# Installed packages the release checks at import but may do without (it skips them when absent).
_OPTIONAL_AT_RUNTIME = {"accelerate"}  # tokenizers: 4.44+ import it whether checked or not
# Packages the release imports at `import transformers.modeling_utils` whenever they are installed, without checking
# their version: where the one installed here is outside the release's own pin (its dependency table), the pinned
# wheel goes into the site. 4.53's `from kernels import get_kernel` imports kernels 0.19, which needs
# huggingface-hub 1.x, against the site's 0.x: every model of the release then fails at import.
_IMPORTED_WHEN_PRESENT = {"kernels"}

# The tiny model every case builds (Llama-style names: Llama, Mistral, Qwen2, Gemma, GPT-NeoX, ...).
TINY_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": core.VOCAB_SIZE,
    "max_position_embeddings": 64,
}
# Models whose config names the same sizes otherwise: their whole tiny config (replaces TINY_CONFIG),
# or, under "+", fields added to TINY_CONFIG.
_GPT2_NAMES = {"vocab_size": core.VOCAB_SIZE, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
               "n_inner": 128}
CONFIG_OVERRIDES: dict[str, dict] = {
    "gpt2": dict(_GPT2_NAMES),
    "gptj": {**_GPT2_NAMES, "rotary_dim": 8},
    "codegen": {**_GPT2_NAMES, "n_ctx": 64, "rotary_dim": 8},
    "gpt_neox": {"+": {"rotary_pct": 0.25}},  # no num_key_value_heads in GPT-NeoX; ignored there
    "opt": {"vocab_size": core.VOCAB_SIZE, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "ffn_dim": 128, "max_position_embeddings": 64, "word_embed_proj_dim": 64},
    "bloom": {"vocab_size": core.VOCAB_SIZE, "hidden_size": 64, "n_layer": 2, "n_head": 4},  # ALiBi: no positions
    "falcon": {"vocab_size": core.VOCAB_SIZE, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "new_decoder_architecture": False, "multi_query": True, "alibi": False, "parallel_attn": True,
               "max_position_embeddings": 64},  # Falcon-7B style: multi-query, rotary, parallel attention
    "mpt": {"vocab_size": core.VOCAB_SIZE, "d_model": 64, "n_layers": 2, "n_heads": 4, "expansion_ratio": 2,
            "max_seq_len": 64},  # ALiBi
    "gemma": {"+": {"head_dim": 16}},
}


# Always: an output projection of its own. With the input embedding tied to it, a tiny random model's
# greedy tokens collapse into repeating the last token (the residual stream keeps the input embedding,
# which scores highest against itself), and identical-token checks would prove little.
ALWAYS = {"tie_word_embeddings": False}


def tiny_config(model: str) -> dict:
    """The tiny config keyword arguments for models/MODEL's config class."""
    override = CONFIG_OVERRIDES.get(model)
    if override is None:
        config = dict(TINY_CONFIG)
    elif "+" in override:
        config = {**TINY_CONFIG, **override["+"]}
    else:
        config = dict(override)
    return {**config, **ALWAYS}


# -- the site --------------------------------------------------------------------------------------
def runtime_requirements(package: Path) -> list[Requirement]:
    """What the release checks at `import transformers` (its dependency_versions_check) and what its wheel
    requires (Requires-Dist without extras), as requirements."""
    deps = core.assigned_literal(package / "dependency_versions_table.py", "deps") or {}
    checked = core.assigned_literal(package / "dependency_versions_check.py", "pkgs_to_check_at_runtime") or []
    checked_requirements = [Requirement(deps[name]) for name in checked if name != "python" and name in deps]
    # What the wheel declares it needs (older releases import huggingface_hub without checking it).
    declared = []
    for dist_info in package.parent.glob("transformers-*.dist-info"):
        for line in (dist_info / "METADATA").read_text(encoding="utf-8").splitlines():
            if line.startswith("Requires-Dist:"):
                requirement = Requirement(line.partition(":")[2].strip())
                if requirement.marker is None:
                    declared.append(requirement)
    names = {r.name for r in checked_requirements}
    present = [Requirement(deps[name]) for name in sorted(_IMPORTED_WHEN_PRESENT) if name in deps
               and core.installed_version(name) is not None]
    return checked_requirements + [r for r in declared + present if r.name not in names]


def prepare_site(version: str, root: Path) -> Path:
    """The folder to put first on sys.path for transformers==version (built once, then reused)."""
    base = root / f"transformers-{version}"
    site = base / "site"
    manifest = site / "corpus-site.json"
    if manifest.is_file():
        return site
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    # Pure Python: the sdist fallback is not wanted either, so binary only (transformers ships wheels).
    core.extract(core.pip_download(f"transformers=={version}", base / "wheels"), site)
    package = site / "transformers"
    if not (package / "__init__.py").is_file():
        raise CaseError(f"the transformers=={version} wheel has no transformers/ package")
    pinned: dict[str, str] = {}
    for requirement in runtime_requirements(package):
        installed = core.installed_version(requirement.name)
        if installed is None and requirement.name in _OPTIONAL_AT_RUNTIME:
            continue  # the release skips its check when the package is absent
        if core.satisfied_here(requirement):
            continue
        wheel = core.pip_download(str(requirement), base / "wheels")
        core.extract(wheel, site)
        pinned[requirement.name] = wheel.name
    manifest.write_text(json.dumps({"transformers": version, "pinned": pinned}, indent=2))
    return site


# -- the target folder -----------------------------------------------------------------------------
def absolute_imports(source: str, module: str) -> str:
    """The source with every relative import made absolute, for a file that is module `module`."""
    return core.localize(source, module)


def _entry_classes(source: str, model: str) -> tuple[str, str]:
    """(the *ForCausalLM class, its config class) of a modeling file."""
    tree = ast.parse(source)
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    # GPT-2 names its causal LM *LMHeadModel (GPT2DoubleHeadsModel is not one).
    causal = [n for n in classes if n.endswith("ForCausalLM")] or [n for n in classes if n.endswith("LMHeadModel")]
    if not causal:
        raise CaseError(f"models/{model}/modeling_{model}.py defines no *ForCausalLM or *LMHeadModel class")
    causal.sort(key=len)  # LlamaForCausalLM before e.g. LlamaSomethingForCausalLM
    configs = [alias.asname or alias.name
               for node in tree.body if isinstance(node, ast.ImportFrom) and node.level
               and (node.module or "").startswith("configuration_")
               for alias in node.names if alias.name.endswith("Config")]
    if not configs:
        raise CaseError(f"models/{model}/modeling_{model}.py imports no *Config from .configuration_{model}")
    prefix = causal[0].removesuffix("ForCausalLM").removesuffix("LMHeadModel")
    configs.sort(key=lambda name: (name.lower() != f"{prefix}Config".lower(), len(name)))
    return causal[0], configs[0]


_LEGACY_CACHE = "past_key_values"


def cache_keyword(source: str, causal: str) -> str:
    """The name `causal`'s forward takes the cache by, as the release itself spells it: `past_key_values` through
    4.x; 5.x renames it (`@deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")` over a forward that
    declares `cache`). The old name still works there, but only through the decorator and `**kwargs`, so a harness
    using it calls `forward` with a name it does not declare (graphmode's entries pass named parameters only) and
    reads a deprecated alias off the output (its field is the new name too)."""
    tree = ast.parse(source)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == causal), None)
    forward = next((n for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef) and n.name == "forward"),
                   None)
    if forward is None:
        return _LEGACY_CACHE
    declared = {a.arg for a in [*forward.args.args, *forward.args.kwonlyargs]}
    if _LEGACY_CACHE in declared:
        return _LEGACY_CACHE
    for decorator in forward.decorator_list:
        if not (isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "deprecate_kwarg"):
            continue
        old = decorator.args[0] if decorator.args else None
        new = next((k.value for k in decorator.keywords if k.arg == "new_name"), None)
        if isinstance(old, ast.Constant) and old.value == _LEGACY_CACHE and isinstance(new, ast.Constant) \
                and new.value in declared:
            return new.value
    return _LEGACY_CACHE


BODY = '''
from model import {config}, {causal}  # noqa: E402

CONFIG = {config_kwargs!r}


def build_model() -> torch.nn.Module:
    """Seeded, every parameter set explicitly (tiny random models need it), in eval mode."""
    torch.manual_seed(0)
    model = {causal}({config}(**CONFIG))
    return corpus_support.init_parameters(model)


def prefill(model, tokens):
    out = model(input_ids=tokens, {cache}=None, use_cache=True)
    return out.logits[:, -1, :], out.{cache}


def decode(model, token, state):
    out = model(input_ids=token, {cache}=state, use_cache=True)
    return out.logits[:, -1, :], out.{cache}
'''


def build_target(case: Case, site: Path, dest: Path) -> Path:
    """Writes the target folder for one case (model.py + harness.py) and returns it."""
    folder = site / "transformers" / "models" / case.model
    if not folder.is_dir():
        raise CaseError(f"transformers=={case.version} has no models/{case.model}/ folder")
    modeling = folder / f"modeling_{case.model}.py"
    if not modeling.is_file():
        present = ", ".join(sorted(p.name for p in folder.glob("modeling_*.py"))) or "no modeling_*.py"
        raise CaseError(f"transformers=={case.version} models/{case.model}/ has no modeling_{case.model}.py "
                        f"({present})")
    source = modeling.read_text(encoding="utf-8")
    causal, config = _entry_classes(source, case.model)
    cache = cache_keyword(source, causal)
    target = core.new_target(case, dest)
    sources = core.copy_sources(site, target,
                                {"model.py": f"transformers/models/{case.model}/modeling_{case.model}.py"})
    description = (f"transformers=={case.version}, models/{case.model}: model.py is modeling_{case.model}.py with "
                   f"absolute imports. The model is {causal} with a tiny random config, driven in its own\n"
                   f"calling convention (input_ids, {cache}, use_cache=True; HF's output object with "
                   f".logits and .{cache}).")
    body = BODY.format(causal=causal, config=config, config_kwargs=tiny_config(case.model),
                       cache=cache)
    (target / "harness.py").write_text(core.harness_text(
        case, family_name="hf", site=site, sources=sources, description=description, body=body,
        top_modules=("transformers",)), encoding="utf-8")
    return target
