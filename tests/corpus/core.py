"""The shared core of the model test bed (`pytest -m corpus`): cases, downloads, sites, targets, runs.

A case is one decoder model from one released PyPI package: `PACKAGE==VERSION:MODEL`. Each library
family has one module here (hf.py for transformers, litgpt.py, xtransformers.py, torchtune.py,
llama_models.py, mistral_inference.py) with the same small interface:

    PACKAGE                      the PyPI name (`transformers`, `litgpt`, ...)
    prepare_site(version, root)  the folder to put first on sys.path: the package's wheel unzipped
                                 (never installed), plus the light pure-Python wheels it imports and
                                 any import shim (tests/corpus/shims/), built once and reused
    build_target(case, site, dest) -> Path
                                 the target folder: the model's source files copied from the site
                                 (SOURCES; only the model files: the rest of the library stays
                                 importable from the site) and a harness.py that drives the model
                                 in the library's own calling convention

Every harness is assembled by `harness_text` from one prologue (the site first on sys.path), the
family's body (build_model, prefill, decode) and one epilogue (make_prompt, generate, main), and
leans on `corpus_support.py` (harness_support.py, copied next to it) for parameter initialisation,
the prompt, greedy generation and the `tokens [[...]]` line `python harness.py N` prints.

GRAPHMODE_CORPUS is a space-separated list of entries:

    VERSION:MODEL[,MODEL...]            transformers (e.g. 4.36.2:llama,mistral)
    PACKAGE==VERSION:MODEL[,MODEL...]   any family (e.g. litgpt==0.4.10:gpt, transformers==4.40.2:qwen2)
    testbed                             the whole test bed (TESTBED below)

Third-party code is only ever extracted into temporary or cache folders, never into the repo.
"""
from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
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

ENV_VAR = "GRAPHMODE_CORPUS"
DEFAULT_CORPUS = "4.36.2:llama,mistral"
HERE = Path(__file__).resolve().parent
SHIMS = HERE / "shims"
SUPPORT_FILE = HERE / "harness_support.py"
SUPPORT_MODULE = "corpus_support"

MAX_SEQ_LEN = 64
PROMPT_LEN = 8
VOCAB_SIZE = 256
_PIP_TIMEOUT_S = 600

# The families: PyPI name -> module in this folder.
FAMILIES = {
    "transformers": "hf",
    "litgpt": "litgpt",
    "x-transformers": "xtransformers",
    "torchtune": "torchtune",
    "llama-models": "llama_models",
    "mistral-inference": "mistral_inference",
    "remote": "remote",  # Hub remote code and research code from GitHub mirrors (remote.py)
}

# GRAPHMODE_CORPUS=remote: Hub remote code and research code, each under the release it needs (issue 23);
# its files come from a cache filled once from GitHub (remote.py), else the cases are skipped.
REMOTE = " ".join([
    "remote==4.27.1:chatglm_6b",
    "remote==4.30.2:telechat_7b",
    "remote==4.31.0:qwen_7b",
    "remote==4.33.3:baichuan2_7b",
    "remote==4.36.2:phi2,stable_code_3b",
    "remote==4.37.2:phi3_mini_128k",
    "remote==4.39.3:deepseek_v2_lite,nanogpt",
    "remote==4.41.2:internlm2_5,hunyuan_large,hunyuan_a13b",
    "remote==4.44.2:glm4_9b",
    "remote==4.46.3:ling_lite",
    "remote==4.53.2:openpangu_embedded_7b",
])
# GRAPHMODE_CORPUS=testbed: at least 20 decoders written by others (issue 9), and the remote-code cases.
TESTBED = " ".join([
    "transformers==4.26.1:gpt2",
    "transformers==4.28.1:gptj",
    "transformers==4.31.0:gpt_neox",
    "transformers==4.34.1:opt,llama",
    "transformers==4.36.2:bloom,llama,mistral,mpt",
    "transformers==4.40.2:falcon,qwen2",
    "transformers==4.44.2:codegen,gemma",
    "transformers==4.46.3:gpt2,llama",
    "transformers==4.48.3:llama",
    "transformers==4.51.3:llama",
    "transformers==4.55.4:llama",
    "transformers==4.56.2:llama",
    "litgpt==0.4.10:llama,pythia",
    "x-transformers==1.42.0:decoder",
    "torchtune==0.4.0:llama3",
    "torchtune==0.6.1:llama3",
    "llama-models==0.3.0:llama3",
    "mistral-inference==1.6.0:mistral",
    REMOTE,
])
NAMED_SETS = {"testbed": TESTBED, "remote": REMOTE}


class CaseError(RuntimeError):
    """A case cannot be built; the message says why, on one line."""


class CaseSkipped(CaseError):
    """A case whose inputs are not here and cannot be fetched in this run (remote code read from a cache
    that a one-time step fills from GitHub): skipped, the message says how to fill it."""


@dataclass(frozen=True)
class Case:
    package: str
    version: str
    model: str
    error: str | None = None  # set when the entry itself is malformed

    @property
    def id(self) -> str:
        if not self.package:
            return self.model
        return f"{self.package}=={self.version}:{self.model}"

    @property
    def slug(self) -> str:
        """A folder name for the case."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.id)


def _entry_cases(entry: str) -> list[Case]:
    spec, sep, models = entry.partition(":")
    if not sep or not spec or not models:
        return [Case("", "", entry, f"{ENV_VAR} entry {entry!r} is not [PACKAGE==]VERSION:MODEL[,MODEL...] "
                                    f"or one of {', '.join(NAMED_SETS)}")]
    package, eq, version = spec.partition("==")
    if not eq:
        package, version = "transformers", spec
    if package not in FAMILIES:
        return [Case(package, version, models, f"{ENV_VAR} entry {entry!r}: no family for package {package!r} "
                                               f"(known: {', '.join(FAMILIES)})")]
    try:
        Version(version)
    except InvalidVersion:
        return [Case(package, version, models, f"{ENV_VAR} entry {entry!r}: {version!r} is not a version")]
    cases = []
    for model in models.split(","):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", model):
            cases.append(Case(package, version, model or "<empty>",
                              f"{ENV_VAR} entry {entry!r}: {model!r} is not a model name"))
        else:
            cases.append(Case(package, version, model))
    return cases


def parse_corpus(text: str | None) -> list[Case]:
    """Cases from GRAPHMODE_CORPUS. A malformed entry is a case that carries its error, so it fails
    (with the reason) instead of vanishing; a case named twice runs once."""
    text = DEFAULT_CORPUS if text is None else text
    entries = text.split()
    if not entries:
        return [Case("", "", "<empty>", f"{ENV_VAR} is set but empty; expected e.g. {DEFAULT_CORPUS!r} or testbed")]
    cases: list[Case] = []
    for entry in entries:
        expanded = NAMED_SETS.get(entry)
        for part in (expanded.split() if expanded else [entry]):
            for case in _entry_cases(part):
                if case not in cases:
                    cases.append(case)
    return cases


def corpus_cases() -> list[Case]:
    return parse_corpus(os.environ.get(ENV_VAR))


def family(package: str):
    """The module that builds cases of `package` (tests/corpus/<family>.py)."""
    return importlib.import_module(f"{__package__}.{FAMILIES[package]}")


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


def extract(wheel: Path, site: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def satisfied_here(requirement: Requirement) -> bool:
    """True when the environment already has a release of the requirement that fits it."""
    installed = installed_version(requirement.name)
    return installed is not None and requirement.specifier.contains(installed, prereleases=True)


def prepare_site(root: Path, package: str, version: str, *, dependencies: tuple[str, ...] = (),
                 shims: tuple[str, ...] = ()) -> Path:
    """root/PACKAGE-VERSION/site: the package's wheel unzipped, plus each of `dependencies` (light,
    pure-Python requirements it imports) the environment does not already satisfy, plus the named
    shim folders of tests/corpus/shims/ (stand-ins for heavy imports). Built once, then reused; the shims are
    copied again every time, so a cached site never runs an older stand-in than this checkout's."""
    base = root / f"{package}-{version}"
    site = base / "site"
    manifest = site / "corpus-site.json"
    if manifest.is_file():
        _copy_shims(site, shims)
        return site
    if site.exists():
        shutil.rmtree(site)  # a build that stopped half-way
    site.mkdir(parents=True)
    _extract_wheel(f"{package}=={version}", base / "wheels", site)
    pinned: dict[str, str] = {}
    for dependency in dependencies:
        requirement = Requirement(dependency)
        if satisfied_here(requirement):
            continue
        wheel = pip_download(dependency, base / "wheels")
        extract(wheel, site)
        pinned[requirement.name] = wheel.name
    _copy_shims(site, shims)
    manifest.write_text(json.dumps({package: version, "pinned": pinned, "shims": list(shims)}, indent=2))
    return site


def _copy_shims(site: Path, shims: tuple[str, ...]) -> None:
    for shim in shims:
        for path in (SHIMS / shim).rglob("*.py"):
            copy = site / path.relative_to(SHIMS / shim)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)


def _extract_wheel(requirement: str, wheels: Path, site: Path) -> None:
    extract(pip_download(requirement, wheels), site)


def site_pins(site: Path) -> dict[str, str]:
    return json.loads((site / "corpus-site.json").read_text())["pinned"]


# -- source files ----------------------------------------------------------------------------------
class _Imports(cst.CSTTransformer):
    """Relative imports made absolute (for a module of package `package`), then imports of the
    modules copied into the target (`local`: module -> local module name; `reexports`:
    (package, name) -> module that defines it) pointed at the local copies."""

    def __init__(self, package: str, local: dict[str, str], reexports: dict[tuple[str, str], str]):
        super().__init__()
        self.package = package.split(".") if package else []
        self.local = local
        self.reexports = reexports

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        level = len(updated_node.relative)
        if level:
            if level > len(self.package):
                raise CaseError(f"a relative import with {level} dots goes above the package "
                                f"{'.'.join(self.package)}")
            parts = self.package[:len(self.package) - (level - 1)]
            if updated_node.module is not None:
                parts = parts + get_full_name_for_node(updated_node.module).split(".")
            updated_node = updated_node.with_changes(
                relative=[], module=cst.parse_expression(".".join(parts)),
                whitespace_after_from=cst.SimpleWhitespace(" "),
                whitespace_before_import=cst.SimpleWhitespace(" "))
        module = get_full_name_for_node(updated_node.module) if updated_node.module is not None else None
        if module is None or isinstance(updated_node.names, cst.ImportStar):
            return updated_node
        if module in self.local:
            return updated_node.with_changes(module=cst.parse_expression(self.local[module]))
        names = {get_full_name_for_node(alias.name) for alias in updated_node.names}
        targets = {self.reexports.get((module, name)) for name in names}
        if len(targets) == 1 and None not in targets:
            (target,) = targets
            return updated_node.with_changes(module=cst.parse_expression(self.local.get(target, target)))
        return updated_node


def localize(source: str, module: str, local: dict[str, str] | None = None,
             reexports: dict[tuple[str, str], str] | None = None) -> str:
    """The source of module `module` with relative imports made absolute and imports of the other
    copied modules made local (a line-for-line rewrite: line numbers do not change)."""
    package = module.rpartition(".")[0]
    out = cst.parse_module(source).visit(_Imports(package, local or {}, reexports or {})).code
    if out.count("\n") != source.count("\n"):
        raise CaseError(f"rewriting the imports of {module} changed its line count")
    return out


def copy_sources(site: Path, target: Path, files: dict[str, str],
                 reexports: dict[tuple[str, str], str] | None = None) -> list[str]:
    """Copies site files (`local name -> path in the site`, e.g. 'model.py' -> 'litgpt/model.py')
    into the target, imports localized; returns SOURCES."""
    modules = {_module_name(path): Path(name).stem for name, path in files.items()}
    for name, path in files.items():
        source_file = site / path
        if not source_file.is_file():
            raise CaseError(f"{path} is not in the extracted wheel")
        text = localize(source_file.read_text(encoding="utf-8"), _module_name(path), modules, reexports)
        (target / name).write_text(text, encoding="utf-8")
    return list(files)


def _module_name(path: str) -> str:
    return path[:-len(".py")].replace("/", ".")


def assigned_literal(path: Path, name: str):
    """The literal value assigned to a module-level `name` in `path`, or None (parsed, never run)."""
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            # `"a b c".split()` (how older releases write their lists)
            if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "split"
                    and isinstance(value.func.value, ast.Constant) and isinstance(value.func.value.value, str)
                    and not value.args and not value.keywords):
                return value.func.value.value.split()
            try:
                return ast.literal_eval(value)
            except ValueError:
                return None
    return None


# -- harnesses -------------------------------------------------------------------------------------
PROLOGUE = '''\
"""Generated by graphmode's corpus tests (tests/corpus/{family}.py); not part of {package}.

{description}
"""
import sys

# The extracted {package}=={version} (and its light dependencies and shims) first on sys.path, before
# anything imports it: graphmode's workers import this harness before any model code runs.
SITE = {site!r}
if SITE not in sys.path:
    sys.path.insert(0, SITE)

import torch  # noqa: E402

import corpus_support  # noqa: E402

corpus_support.require_site(SITE, {top_modules!r})

SOURCES = {sources!r}
MAX_SEQ_LEN = {max_seq_len}
PROMPT_LEN = {prompt_len}
VOCAB_SIZE = {vocab_size}
'''

EPILOGUE = '''

def make_prompt() -> torch.Tensor:
    return corpus_support.make_prompt(VOCAB_SIZE, PROMPT_LEN)


def generate(model, steps: int = 32):
    return corpus_support.generate(sys.modules[__name__], model, steps)


if __name__ == "__main__":
    corpus_support.main(sys.modules[__name__])
'''


def harness_text(case: Case, *, family_name: str, site: Path, sources: list[str], description: str,
                 body: str, top_modules: tuple[str, ...]) -> str:
    """A harness: the shared prologue, the family's body (build_model, prefill, decode), the epilogue."""
    prologue = PROLOGUE.format(family=family_name, package=case.package, version=case.version,
                               description=description.strip(), site=str(site), sources=sources,
                               top_modules=list(top_modules), max_seq_len=MAX_SEQ_LEN, prompt_len=PROMPT_LEN,
                               vocab_size=VOCAB_SIZE)
    return prologue + "\n" + body.strip("\n") + "\n" + EPILOGUE


def new_target(case: Case, dest: Path) -> Path:
    target = dest / case.slug
    target.mkdir(parents=True, exist_ok=False)
    shutil.copyfile(SUPPORT_FILE, target / f"{SUPPORT_MODULE}.py")
    return target


def build_target(case: Case, root: Path, dest: Path) -> Path:
    """The case's target folder (sources, harness.py, corpus_support.py), its site built first."""
    if case.error:
        raise CaseError(case.error)
    module = family(case.package)
    # A family whose inputs come from a cache (remote.py) says it is empty before anything is downloaded.
    if hasattr(module, "check_inputs"):
        module.check_inputs(case)
    site = module.prepare_site(case.version, root)
    return module.build_target(case, site, dest)


# -- running ---------------------------------------------------------------------------------------
@dataclass
class HarnessRun:
    returncode: int
    stdout: str
    stderr: str
    tokens: list | None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.tokens is not None

    def why(self, lines: int = 12) -> str:
        if self.returncode != 0:
            return f"exit {self.returncode}:\n" + "\n".join((self.stderr or self.stdout).strip().splitlines()[-lines:])
        return "printed no `tokens [...]` line:\n" + "\n".join(self.stdout.strip().splitlines()[-lines:])


def parse_tokens(stdout: str) -> list | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("tokens "):
            return json.loads(line[len("tokens "):])
    return None


def run_harness(folder: Path, steps: int, timeout_s: float = 900) -> HarnessRun:
    """`python harness.py STEPS` in `folder`, a fresh process: the model eagerly, in its own convention."""
    try:
        done = subprocess.run([sys.executable, "harness.py", str(steps)], cwd=folder, capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return HarnessRun(124, "", f"timed out after {timeout_s} s", None)
    return HarnessRun(done.returncode, done.stdout, done.stderr, parse_tokens(done.stdout))


def graphmode(*args: str, home: Path, cwd: Path, timeout_s: float = 3600) -> subprocess.CompletedProcess:
    """The `graphmode` command as a user runs it (a fresh process; sessions kept in `home`)."""
    env = {**os.environ, "GRAPHMODE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "graphmode.agent.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL, timeout=timeout_s)


def runs_from_env(default: int = 3) -> int:
    text = os.environ.get("GRAPHMODE_CORPUS_RUNS", "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"GRAPHMODE_CORPUS_RUNS must be a positive integer, got {text!r}")
    return int(text)
