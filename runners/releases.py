"""Which transformers releases have what remote code imports, and what a failure for the lack of one means.

Hub repositories ship modeling code written against one transformers release; a later release drops what it used,
and the code fails to import or to run. `diagnose` reads such a failure (in the worker, where the exception and the
interpreter's own release are at hand) and says what is missing and which releases have it, so the person can run
the target under an interpreter with such a release (graphmode.toml's `python`, a manifest's, `--python`).

Every fact of RELEASE_FACTS was read from the released wheels (pip download transformers==X --no-deps; the class,
method or module looked up in the wheel's sources): 4.35.2, 4.36.0, 4.38.0, 4.41.2, 4.42.4, 4.43.4, 4.44.2, 4.45.0,
4.46.0, 4.47.0, 4.47.1, 4.48.0, 4.48.3, 4.49.0, 4.50.0, 4.52.0, 4.53.0, 4.53.3, 4.54.0, 4.55.0, 4.55.4, 4.56.0, 4.57.0,
4.57.6, 5.0.0, 5.1.0, 5.2.0, 5.13.1, 5.18.0, 5.21.1, 5.22.2, 5.23.0 and 5.24.0. `last` names a minor release
(for 4.47, 4.53 and 4.57 its first and last patch releases were both read); `first` is the earliest release in
graphmode's range (SUPPORTED_FROM onward) that has it. Left out, because no one range says it:
`Cache.get_max_length` (4.36 to 4.48, back in 5.x), and `_flash_supports_window_size` (moved between modules in 4.43,
gone in 4.54); and `pytorch_utils.ALL_LAYERNORM_LAYERS`, which every release read has.

Standard library only: the agent reads it without torch, and the workers of any interpreter import it.
"""
from __future__ import annotations

import ast
import linecache
import re
import traceback
from dataclasses import dataclass

from graphmode.runners.interpreter import release

# The oldest release graphmode supports (pyproject.toml's `hf` extra): the Cache API (DynamicCache) arrived in 4.36.
SUPPORTED_FROM = "4.36"
# `--hf MODEL_TYPE` drives transformers' own StaticCache path (runners.hf_driver.StaticCacheDecoder): StaticCache
# and the models' `cache_position` argument arrived in 4.38.
STATIC_CACHE_FROM = "4.38"
HF_EXTRA = ">=4.36,<6"


@dataclass(frozen=True)
class ReleaseFact:
    """A name remote code uses, and the releases that have it (last None: every release since `first`; `back_from`:
    the release that brought it back after a gap, and every one since)."""
    symbol: str  # as a person writes it: "Cache.get_usable_length", "transformers.modeling_attn_mask_utils"
    first: str
    last: str | None
    # How its absence shows in an exception's message; group "name" must equal `name` for the fact to apply.
    name: str
    shows_as: tuple[str, ...]
    back_from: str | None = None
    keyword_of: str | None = None  # a keyword argument (`name`) of this method, not the method itself

    @property
    def releases(self) -> str:
        said = f"transformers {self.first} to {self.last}" if self.last else f"transformers {self.first} onward"
        return f"{said}, and {self.back_from} onward" if self.back_from else said

    def has(self, version: str | None) -> bool:
        found = release(version)
        if self.back_from is not None and found and found >= release(self.back_from):
            return True
        return bool(found) and release(self.first) <= found and (
            self.last is None or found[:len(release(self.last))] <= release(self.last))


_MODULE = (r"No module named '(?P<name>[\w.]+)'",)
_IMPORTED = (r"cannot import name '(?P<name>\w+)' from '[\w.]+'",)
_ATTRIBUTE = (r"has no attribute '(?P<name>\w+)'",)
_KEYWORD = (r"got an unexpected keyword argument '(?P<name>\w+)'",)

RELEASE_FACTS: tuple[ReleaseFact, ...] = (
    # Removed in 5.24, back in 5.25 as a deprecated module kept for backward compatibility.
    ReleaseFact("transformers.modeling_attn_mask_utils", "4.36", "5.23", "transformers.modeling_attn_mask_utils",
                _MODULE, back_from="5.25"),
    ReleaseFact("transformers.utils.is_torch_fx_available", "4.36", "4.57", "is_torch_fx_available",
                _IMPORTED + _ATTRIBUTE),
    ReleaseFact("Cache.get_usable_length", "4.36", "4.53", "get_usable_length", _ATTRIBUTE),
    ReleaseFact("DynamicCache.from_legacy_cache", "4.36", "4.57", "from_legacy_cache", _ATTRIBUTE),
    ReleaseFact("DynamicCache.to_legacy_cache", "4.36", "4.57", "to_legacy_cache", _ATTRIBUTE),
    ReleaseFact("transformers.models.llama.modeling_llama.LlamaFlashAttention2", "4.36", "4.47",
                "LlamaFlashAttention2", _IMPORTED + _ATTRIBUTE),
    # In transformers.utils.generic, exported by transformers.utils: 4.47.0 and 4.53.3 have it, 4.46.0 and 4.54.0 not.
    ReleaseFact("transformers.utils.LossKwargs", "4.47", "4.53", "LossKwargs", _IMPORTED + _ATTRIBUTE),
    # ModuleUtilsMixin.get_head_mask: 4.57.6 has it, 5.0.0 not.
    ReleaseFact("PreTrainedModel.get_head_mask", "4.36", "4.57", "get_head_mask", _ATTRIBUTE),
    # Remote code that overrides _update_model_kwargs_for_generation (ChatGLM-6B) calls it: 4.48.3 has it, 4.49.0
    # not; its `standardize_cache_format` keyword: 4.43.4 has it, 4.44.2 not.
    ReleaseFact("GenerationMixin._extract_past_from_model_output", "4.36", "4.48", "_extract_past_from_model_output",
                _ATTRIBUTE),
    ReleaseFact("GenerationMixin._extract_past_from_model_output(standardize_cache_format=)", "4.36", "4.43",
                "standardize_cache_format", _KEYWORD, keyword_of="_extract_past_from_model_output"),
)
# 5.0 turned a config's `rope_scaling: null` into a dict ({"rope_type": "default", ...}): code written for 4.x reads
# `rope_scaling["type"]` once it is not None, and gets a KeyError (or the dict where it tested for None).
ROPE_SCALING_DICT_FROM = "5.0"


@dataclass(frozen=True)
class NameUse:
    """A name of RELEASE_FACTS that a model's code uses, where it first does."""
    fact: ReleaseFact
    where: str  # "file:line"


def names_used(texts: dict[str, str]) -> list[NameUse]:
    """The names of RELEASE_FACTS that these files ({path: text}) use, read from their code without running it: a
    module imported, a name imported from a transformers module, a method called by its name (`.get_usable_length(`).
    A file that does not parse is skipped (its import fails with its own message)."""
    found: dict[ReleaseFact, str] = {}
    defined: set[str] = set()  # a method the code defines itself (its own cache's get_usable_length) is its own
    for path, text in texts.items():
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        imports_transformers, methods = _read_file(tree, path, found, defined)
        # A method called by name is transformers' only in a file that imports transformers: code with a cache of
        # its own (its own get_usable_length, in a file not read here) is not held to transformers' releases.
        if imports_transformers:
            for fact, where in methods.items():
                found.setdefault(fact, where)
    return [NameUse(fact, where) for fact, where in found.items()
            if not (_called(fact) and (fact.keyword_of or fact.name) in defined)]


def _called(fact: ReleaseFact) -> bool:
    """A method (or a method's keyword) the code calls by name, rather than a module or a name it imports."""
    return fact.shows_as in (_ATTRIBUTE, _KEYWORD)


def _read_file(tree: ast.Module, path: str, found: dict[ReleaseFact, str], defined: set[str]
               ) -> tuple[bool, dict[ReleaseFact, str]]:
    """Adds the file's imported names to `found` and its function names to `defined`; returns whether it imports
    transformers, and the methods it calls by name (where first)."""
    imports_transformers, methods = False, {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        imports_transformers = imports_transformers or _imports_transformers(node)
        for fact in _facts_at(node):
            (methods if _called(fact) else found).setdefault(fact, f"{path}:{node.lineno}")
    return imports_transformers, methods


def _imports_transformers(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").startswith("transformers")
    return isinstance(node, ast.Import) and any(alias.name.startswith("transformers") for alias in node.names)


def _facts_at(node: ast.AST) -> list[ReleaseFact]:
    if isinstance(node, ast.Import):
        return _modules_named([alias.name for alias in node.names])
    if isinstance(node, ast.ImportFrom):
        return _imported_facts(node)
    if isinstance(node, ast.Attribute) and node.attr in _METHODS:
        return [_METHODS[node.attr]]
    return _keywords_passed(node) if isinstance(node, ast.Call) else []


def _imported_facts(node: ast.ImportFrom) -> list[ReleaseFact]:
    """The module a `from transformers... import ...` reads, and the names it imports."""
    if not (node.module or "").startswith("transformers"):
        return []
    names = [alias.name for alias in node.names]
    return _modules_named([node.module]) + [_IMPORTED_NAMES[name] for name in names if name in _IMPORTED_NAMES]


def _keywords_passed(call: ast.Call) -> list[ReleaseFact]:
    """The keyword facts of a method call that passes their keyword (`x._extract_past...(o, standardize_...=)`)."""
    if not isinstance(call.func, ast.Attribute):
        return []
    passed = {keyword.arg for keyword in call.keywords}
    return [fact for fact in _KEYWORDS if fact.keyword_of == call.func.attr and fact.name in passed]


def _modules_named(modules: list[str]) -> list[ReleaseFact]:
    return [fact for fact in _MODULES if any(module.startswith(fact.name) for module in modules)]


# The facts by how code uses the name: a module it imports, a name it imports, a method it calls.
_MODULES = tuple(fact for fact in RELEASE_FACTS if fact.shows_as == _MODULE)
_IMPORTED_NAMES = {fact.name: fact for fact in RELEASE_FACTS if _IMPORTED[0] in fact.shows_as}
_METHODS = {fact.name: fact for fact in RELEASE_FACTS if fact.shows_as == _ATTRIBUTE}
_KEYWORDS = tuple(fact for fact in RELEASE_FACTS if fact.shows_as == _KEYWORD)


def _spans(fact: ReleaseFact) -> list[tuple[tuple[int, ...], tuple[int, ...] | None]]:
    """The releases that have the name, as (first, last) minor releases, last None for "onward". A name graphmode's
    oldest release has may be older still: no release bounds it from below (the wheels before it were not read)."""
    first = () if fact.first == SUPPORTED_FROM else release(fact.first)
    spans = [(first, release(fact.last) if fact.last else None)]
    return spans + [(release(fact.back_from), None)] if fact.back_from else spans


def common_releases(uses: list[NameUse]) -> list[tuple[tuple[int, ...], tuple[int, ...] | None]]:
    """The minor releases that have every name used, as spans (first, last or None; first () when no release bounds
    it from below); [] when none has them all."""
    spans: list[tuple[tuple[int, ...], tuple[int, ...] | None]] = [((), None)]
    for use in uses:
        spans = [(max(a[0], b[0]), _earlier(a[1], b[1])) for a in spans for b in _spans(use.fact)]
        spans = [(first, last) for first, last in spans if last is None or first <= last]
    return spans


def _earlier(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return b if a is None else a if b is None else min(a, b)


def _said(spans: list[tuple[tuple[int, ...], tuple[int, ...] | None]]) -> str:
    def one(first, last):
        low, high = ".".join(map(str, first)), ".".join(map(str, last or ()))
        low = low or SUPPORTED_FROM  # graphmode's range starts there
        return f"{low} onward" if last is None else low if low == high else f"{low} to {high}"
    return " or ".join(one(first, last) for first, last in spans)


def release_need(uses: list[NameUse], version: str | None) -> str | None:
    """What the code needs of transformers, when `version` (None: not installed) cannot run it; None when it can
    or the code uses none of RELEASE_FACTS' names. Every name is said, with its line and its releases."""
    if not uses:
        return None
    spans = common_releases(uses)
    found = release(version)[:2]
    if found and any(first <= found and (last is None or found <= last) for first, last in spans):
        return None
    each = "; ".join(f"`{u.fact.symbol}` at {u.where}: {u.fact.releases.removeprefix('transformers ')}" for u in uses)
    here = f"this interpreter has transformers {version}" if version else "this interpreter has no transformers"
    if not spans:
        return (f"the model's code uses names that no one transformers release has together ({each}); {here}: "
                "the code itself must change")
    return (f"the model's code needs transformers {_said(spans)} ({each}); {here}: run the target under an "
            "interpreter with such a release (`python = ...` in graphmode.toml's [target] or a batch manifest's "
            "target, or `graphmode adapt --python PATH`), or let graphmode make one (`--python auto`)")


def _matching_fact(exc: BaseException) -> ReleaseFact | None:
    if not isinstance(exc, (ImportError, AttributeError, TypeError)):
        return None
    message = str(exc)
    for fact in RELEASE_FACTS:
        for pattern in fact.shows_as:
            found = re.search(pattern, message)
            if found and found.group("name") == fact.name:
                return fact
    return None


def _raising_line(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return last.line or linecache.getline(last.filename, last.lineno or 0)


def _rope_scaling_failure(exc: BaseException, version: str | None) -> bool:
    return (isinstance(exc, (KeyError, TypeError)) and release(version) >= release(ROPE_SCALING_DICT_FROM)
            and "rope_scaling" in _raising_line(exc))


def diagnose(chain: list[BaseException], version: str | None) -> str | None:
    """What a failure says about the release, for the exceptions of one failure (outermost first) under transformers
    `version` (None: not installed): the missing name and the releases that have it, and how to run under one; None
    when the failure is not for the lack of something a release has."""
    fix = ("run the target under an interpreter with such a release (`python = ...` in graphmode.toml's [target] or "
           "a batch manifest's target, or `graphmode adapt --python PATH`)")
    here = f"this interpreter has transformers {version}" if version else "this interpreter has no transformers"
    for exc in reversed(chain):
        fact = _matching_fact(exc)
        if fact is not None and not fact.has(version):
            return f"the model's code needs `{fact.symbol}` ({fact.releases}); {here}: {fix}"
        if _rope_scaling_failure(exc, version):
            return (f"the model's code reads `rope_scaling` as transformers 4.x gave it (None when config.json says "
                    f"null); from {ROPE_SCALING_DICT_FROM} it is a dict ({{'rope_type': 'default', ...}}), so a 4.x "
                    f"release (transformers {SUPPORTED_FROM} to 4.57) runs it; {here}: {fix}")
    return None


def hf_release_problem(spec: str, interpreter: str, version: str | None) -> str | None:
    """Why `--hf SPEC` cannot run under transformers `version` of `interpreter`, or None."""
    install = f"`{interpreter} -m pip install 'transformers{HF_EXTRA}'`"
    if version is None:
        return f"{interpreter} has no transformers: {install}"
    if release(version) < release(SUPPORTED_FROM):
        return (f"{interpreter} has transformers {version}; graphmode supports {SUPPORTED_FROM} onward (the Cache API "
                f"the models' code is written for): {install}")
    if release(version) < release(STATIC_CACHE_FROM) and not _is_remote_code(spec):
        return (f"{interpreter} has transformers {version}; a model transformers implements is driven on its own "
                f"StaticCache path, which arrived in {STATIC_CACHE_FROM} (with the models' cache_position): "
                f"`{interpreter} -m pip install 'transformers>={STATIC_CACHE_FROM},<6'`")
    return None


def _is_remote_code(spec: str) -> bool:
    """The folder (or config.json) names its own modeling code (config.json's auto_map)."""
    import json
    from pathlib import Path

    path = Path(spec).expanduser()
    config = path / "config.json" if path.is_dir() else path
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("auto_map"))
    except (OSError, ValueError, AttributeError):
        return False
