"""Builds graphmode targets from modeling files of released transformers wheels (the corpus tests).

A case is VERSION:MODEL, e.g. 4.36.2:llama. For each VERSION we

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
libcst, and a generated `harness.py` that puts the site folder first on `sys.path` (so
`transformers` is the extracted release, in graphmode's worker processes too: they import the harness
before anything imports transformers) and drives `<Model>ForCausalLM` in its own calling convention.

Everything extracted lives in temporary folders: third-party code is never written into the repo.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import libcst as cst
from libcst.helpers import get_full_name_for_node
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

DEFAULT_CORPUS = "4.36.2:llama,mistral"
ENV_VAR = "GRAPHMODE_CORPUS"

# Installed packages the release checks at import but may do without (it skips them when absent).
_OPTIONAL_AT_RUNTIME = {"tokenizers", "accelerate"}
_PIP_TIMEOUT_S = 600

# The tiny model every case builds (hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 256).
TINY_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 64,
}
MAX_SEQ_LEN = 64
PROMPT_LEN = 8


class CaseError(RuntimeError):
    """A case cannot be built; the message says why, on one line."""


@dataclass(frozen=True)
class Case:
    version: str
    model: str
    error: str | None = None  # set when the entry itself is malformed

    @property
    def id(self) -> str:
        return f"{self.version}:{self.model}" if self.version else self.model


def parse_corpus(text: str | None) -> list[Case]:
    """Cases from GRAPHMODE_CORPUS: space-separated VERSION:MODEL,MODEL entries. A malformed entry is a
    case that carries its error, so it fails (with the reason) instead of vanishing."""
    text = DEFAULT_CORPUS if text is None else text
    entries = text.split()
    if not entries:
        return [Case("", "<empty>", f"{ENV_VAR} is set but empty; expected e.g. {DEFAULT_CORPUS!r}")]
    cases: list[Case] = []
    for entry in entries:
        version, sep, models = entry.partition(":")
        if not sep or not version or not models:
            cases.append(Case("", entry, f"{ENV_VAR} entry {entry!r} is not VERSION:MODEL[,MODEL...]"))
            continue
        try:
            Version(version)
        except InvalidVersion:
            cases.append(Case(version, models, f"{ENV_VAR} entry {entry!r}: {version!r} is not a version"))
            continue
        for model in models.split(","):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", model):
                cases.append(Case(version, model or "<empty>",
                                  f"{ENV_VAR} entry {entry!r}: {model!r} is not a folder name under transformers/models/"))
            else:
                cases.append(Case(version, model))
    return cases


def corpus_cases() -> list[Case]:
    return parse_corpus(os.environ.get(ENV_VAR))


# -- downloading and unpacking ---------------------------------------------------------------------
def _tail(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def pip_download(requirement: str, dest: Path, *, binary_only: bool = True) -> Path:
    """`pip download --no-deps` of one requirement into its own folder; returns the wheel."""
    folder = dest / re.sub(r"[^A-Za-z0-9_.=-]+", "_", requirement)
    folder.mkdir(parents=True, exist_ok=True)
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "--no-input", "-d", str(folder), requirement]
        if binary_only:
            command[5:5] = ["--only-binary=:all:"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise CaseError(f"`pip download --no-deps {requirement}` timed out after {_PIP_TIMEOUT_S} s") from None
        if done.returncode != 0:
            raise CaseError(f"`pip download --no-deps {requirement}` failed: {_tail(done.stderr or done.stdout)}")
        wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        found = ", ".join(p.name for p in folder.iterdir()) or "nothing"
        raise CaseError(f"`pip download --no-deps {requirement}` gave no single wheel (found {found}); "
                        "a source-only release cannot be used here")
    return wheels[0]


def _extract(wheel: Path, site: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)


def _assigned_literal(path: Path, name: str):
    """The literal value assigned to a module-level `name` in `path`, or None (parsed, never run)."""
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def runtime_requirements(package: Path) -> list[Requirement]:
    """What the release checks at `import transformers` (its dependency_versions_check), as requirements."""
    deps = _assigned_literal(package / "dependency_versions_table.py", "deps") or {}
    checked = _assigned_literal(package / "dependency_versions_check.py", "pkgs_to_check_at_runtime") or []
    return [Requirement(deps[name]) for name in checked if name != "python" and name in deps]


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def prepare_site(version: str, root: Path) -> Path:
    """The folder to put first on sys.path for transformers==version (built once, then reused)."""
    base = root / f"transformers-{version}"
    site = base / "site"
    manifest = site / "corpus-site.json"
    if manifest.is_file():
        return site
    site.mkdir(parents=True, exist_ok=True)
    # Pure Python: the sdist fallback is not wanted either, so binary only (transformers ships wheels).
    _extract(pip_download(f"transformers=={version}", base / "wheels"), site)
    package = site / "transformers"
    if not (package / "__init__.py").is_file():
        raise CaseError(f"the transformers=={version} wheel has no transformers/ package")
    pinned: dict[str, str] = {}
    for requirement in runtime_requirements(package):
        installed = _installed(requirement.name)
        if installed is None and requirement.name in _OPTIONAL_AT_RUNTIME:
            continue  # the release skips its check when the package is absent
        if installed is not None and requirement.specifier.contains(installed, prereleases=True):
            continue
        wheel = pip_download(str(requirement), base / "wheels")
        _extract(wheel, site)
        pinned[requirement.name] = wheel.name
    manifest.write_text(json.dumps({"transformers": version, "pinned": pinned}, indent=2))
    return site


def site_pins(site: Path) -> dict[str, str]:
    return json.loads((site / "corpus-site.json").read_text())["pinned"]


# -- the target folder -----------------------------------------------------------------------------
class _AbsoluteImports(cst.CSTTransformer):
    """`from ..x import y` -> `from pkg.x import y`, for a module in package `pkg`."""

    def __init__(self, package: str):
        super().__init__()
        self.package = package.split(".")

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        level = len(updated_node.relative)
        if level == 0:
            return updated_node
        if level > len(self.package):
            raise CaseError(f"a relative import with {level} dots goes above the package {'.'.join(self.package)}")
        parts = self.package[:len(self.package) - (level - 1)]
        if updated_node.module is not None:
            parts = parts + get_full_name_for_node(updated_node.module).split(".")
        return updated_node.with_changes(
            relative=[], module=cst.parse_expression(".".join(parts)),
            whitespace_after_from=cst.SimpleWhitespace(" "),
            whitespace_before_import=cst.SimpleWhitespace(" "),
        )


def absolute_imports(source: str, module: str) -> str:
    """The source with every relative import made absolute, for a file that is module `module`."""
    package = module.rpartition(".")[0]
    return cst.parse_module(source).visit(_AbsoluteImports(package)).code


def _entry_classes(source: str, model: str) -> tuple[str, str]:
    """(the *ForCausalLM class, its config class) of a modeling file."""
    tree = ast.parse(source)
    causal = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("ForCausalLM")]
    if not causal:
        raise CaseError(f"models/{model}/modeling_{model}.py defines no *ForCausalLM class")
    causal.sort(key=len)  # LlamaForCausalLM before e.g. LlamaSomethingForCausalLM
    configs = [alias.asname or alias.name
               for node in tree.body if isinstance(node, ast.ImportFrom) and node.level
               and (node.module or "").startswith("configuration_")
               for alias in node.names if alias.name.endswith("Config")]
    if not configs:
        raise CaseError(f"models/{model}/modeling_{model}.py imports no *Config from .configuration_{model}")
    prefix = causal[0][: -len("ForCausalLM")]
    configs.sort(key=lambda name: (name != f"{prefix}Config", len(name)))
    return causal[0], configs[0]


HARNESS_TEMPLATE = '''\
"""Generated by graphmode's corpus tests (tests/corpus/hf.py); not part of transformers.

transformers=={version}, models/{model}: model.py is modeling_{model}.py with absolute imports. The
model is {causal} with a tiny random config, driven in its own calling convention (input_ids,
past_key_values, use_cache=True; HF's output object with .logits and .past_key_values).
"""
import sys

# `transformers` must be the extracted {version}, not the installed release: first on sys.path, and
# before anything imports it (graphmode's workers import this harness before model code runs).
SITE = {site!r}
if SITE not in sys.path:
    sys.path.insert(0, SITE)
_loaded = sys.modules.get("transformers")
if _loaded is not None and not str(getattr(_loaded, "__file__", "")).startswith(SITE):
    raise ImportError(f"transformers was imported from {{_loaded.__file__}} before this harness; "
                      f"the corpus case needs the copy in {{SITE}}")

import torch  # noqa: E402

from model import {config}, {causal}  # noqa: E402

SOURCES = ["model.py"]
MAX_SEQ_LEN = {max_seq_len}
CONFIG = {config_kwargs!r}
PROMPT_LEN = {prompt_len}


def build_model() -> torch.nn.Module:
    """Seeded, every parameter set explicitly (tiny random models need it), in eval mode."""
    torch.manual_seed(0)
    model = {causal}({config}(**CONFIG))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:  # norm weights 1, biases 0
                param.fill_(1.0) if name.endswith("weight") else param.zero_()
            elif "embed" in name:
                param.normal_(0.0, 1.0)
            else:
                param.normal_(0.0, param.shape[-1] ** -0.5)
    return model.eval()


def make_prompt() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, CONFIG["vocab_size"], (1, PROMPT_LEN), generator=generator)


def prefill(model, tokens):
    out = model(input_ids=tokens, past_key_values=None, use_cache=True)
    return out.logits[:, -1, :], out.past_key_values


def decode(model, token, state):
    out = model(input_ids=token, past_key_values=state, use_cache=True)
    return out.logits[:, -1, :], out.past_key_values


def generate(model, steps: int = 32):
    tokens = make_prompt()
    with torch.inference_mode():
        logits, state = prefill(model, tokens)
        out = []
        for _ in range(steps):
            token = logits.argmax(-1, keepdim=True)
            out.append(token)
            logits, state = decode(model, token, state)
    return torch.cat(out, dim=1)


if __name__ == "__main__":
    import transformers

    model = build_model()
    print("transformers", transformers.__version__, transformers.__file__)
    print("attention", getattr(model.config, "_attn_implementation", "?"))
    print("tokens", generate(model, int(sys.argv[1]) if len(sys.argv) > 1 else 32).tolist())
'''


def build_target(case: Case, site: Path, dest: Path) -> Path:
    """Writes the target folder for one case (model.py + harness.py) and returns it."""
    models = site / "transformers" / "models"
    folder = models / case.model
    if not folder.is_dir():
        raise CaseError(f"transformers=={case.version} has no models/{case.model}/ folder")
    modeling = folder / f"modeling_{case.model}.py"
    if not modeling.is_file():
        present = ", ".join(sorted(p.name for p in folder.glob("modeling_*.py"))) or "no modeling_*.py"
        raise CaseError(f"transformers=={case.version} models/{case.model}/ has no modeling_{case.model}.py "
                        f"({present})")
    source = modeling.read_text(encoding="utf-8")
    causal, config = _entry_classes(source, case.model)
    target = dest / f"transformers-{case.version}-{case.model}"
    target.mkdir(parents=True, exist_ok=False)
    (target / "model.py").write_text(
        absolute_imports(source, f"transformers.models.{case.model}.modeling_{case.model}"), encoding="utf-8")
    (target / "harness.py").write_text(HARNESS_TEMPLATE.format(
        version=case.version, model=case.model, causal=causal, config=config, site=str(site),
        max_seq_len=MAX_SEQ_LEN, config_kwargs=TINY_CONFIG, prompt_len=PROMPT_LEN), encoding="utf-8")
    return target


def run_original(target: Path, steps: int, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """`python harness.py STEPS` in the target folder, in a fresh process: the original, eagerly."""
    return subprocess.run([sys.executable, "harness.py", str(steps)], cwd=target, capture_output=True,
                          text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


def graphmode(*args: str, home: Path, cwd: Path, timeout_s: float = 1800) -> subprocess.CompletedProcess:
    """The `graphmode` command as a user runs it (a fresh process; sessions kept in `home`)."""
    env = {**os.environ, "GRAPHMODE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL, timeout=timeout_s)
