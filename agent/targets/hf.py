"""`graphmode adapt --hf SPEC`: a Hugging Face model as a target folder graphmode writes itself.

SPEC is a model_type the installed transformers knows ("llama"), a config.json, or a local model folder. graphmode
writes a target folder inside the run folder (never into the user's): a harness.py, the config, and for a folder with
remote code (config.json's `auto_map` naming its own `configuration_*.py` / `modeling_*.py`) a copy of that code as a
package, whose modeling files are the sources the codemods may rewrite. Every problem a user can fix is found here,
before any model runs, and said in one line (exit status 2).

- A model type transformers implements is not rewritten: the harness drives transformers' own static-cache path
  (runners.hf_driver.StaticCacheDecoder), and verification compares it, Decode compiled, with the default dynamic
  cache run eagerly.
- With `--rewrite`, or where transformers itself says that path does not compile (`_can_compile_fullgraph = False`,
  no static cache), the installed release's modeling file is copied into the target folder instead
  (agent.targets.installed_copy) and adapted like remote code; transformers' config class builds the config.
- Remote code is loaded the way `trust_remote_code` would load it, from the local folder only, and is adapted like
  any other source.
"""
from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from graphmode.agent.errors import UserError
from graphmode.agent.output import render, swapped_in, write_atomic
from graphmode.agent.targets.hf_prompt import PromptTokens, prompt_tokens, tiny_special_ids

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
INSTALL_HINT = "pip install -e '.[hf]' (or pip install transformers)"


@dataclass
class HFTarget:
    """What the harness needs to build the model, and what the user is told about it."""
    name: str                     # the run's folder name under --out
    spec: str                     # what the user gave
    model_type: str
    tiny: bool
    transformers_version: str
    config_overrides: dict = field(default_factory=dict)  # the --tiny sizes, under the config's own names
    config_folder: str | None = None   # inside the target: where config.json was copied
    weights_folder: str | None = None  # the user's folder with the weights, read in place (never copied)
    package: str | None = None         # remote code: the copy's package name
    auto_map: dict = field(default_factory=dict)
    model_refs: list[str] = field(default_factory=list)  # auto_map's model classes, tried in order for an LM head
    in_place: bool = False             # remote code imported from the harness's own folder (`graphmode init`)
    installed_copy: str | None = None  # --rewrite: the installed modeling file the package's copy is made from
    installed_module: str | None = None  # ... and its module (transformers.models.x.modeling_x)
    sources: list[str] = field(default_factory=list)
    missing_imports: dict = field(default_factory=dict)  # package -> "file:line" of an unguarded import
    prompt_vocab: int = 256            # prompt ids are drawn below this (and below the vocabulary size)
    prompt_prefix: list[int] = field(default_factory=list)  # the special ids every prompt starts with (hf_prompt)
    prompt_suffix: list[int] = field(default_factory=list)  # ... and ends with (a GLM v1 tokenizer's layout)
    special_ids: list[int] = field(default_factory=list)    # below prompt_vocab: never drawn at random
    prompt_evidence: list[str] = field(default_factory=list)  # where each prefix (then suffix) id was read
    notes: list[str] = field(default_factory=list)


def summary(target: HFTarget) -> dict:
    """What the documents say about an --hf target (RunOptions.hf)."""
    if target.installed_copy:
        installed = _site_relative(target.installed_copy)
        how = (f"the installed transformers {target.transformers_version}'s own {installed}, "
               f"copied into the run folder as {', '.join(target.sources)} (relative imports made absolute, every "
               "line where it was) and rewritten; the installed file is not touched")
    elif target.package:
        how = ("its own code (config.json's auto_map), loaded from the folder's copy; "
               f"{', '.join(target.sources)} rewritten")
    else:
        how = ("transformers' own code, not rewritten: Decode runs on its static-cache path (StaticCache, positions "
               "as a tensor), the original on the default dynamic cache")
    return {"spec": target.spec, "model_type": target.model_type, "transformers": target.transformers_version,
            "weights": "tiny, random (--tiny)" if target.tiny else f"read from {target.weights_folder}",
            "code": how, "rewritten": bool(target.package or target.installed_copy),
            "placeholders": dict(target.missing_imports),
            "prompt_prefix": "; ".join(target.prompt_evidence) or "none (no special token in the config)",
            "notes": list(target.notes)}


def _site_relative(path: str) -> str:
    """transformers/models/x/modeling_x.py for a file of the installed package (the reader knows where it lives)."""
    parts = Path(path).parts
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("transformers"):]) if "transformers" in parts else path


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError(f"--hf needs transformers, which is not installed: {INSTALL_HINT}") from None
    return transformers


def refuse_missing_path(spec: str) -> None:
    """The checks of an --hf SPEC that need only the file system (no transformers): a path that is not there, a file
    that is no config.json, a folder with no config.json."""
    path = Path(spec).expanduser()
    if not path.exists():
        if "/" in spec or spec.endswith(".json"):
            raise UserError(f"--hf {spec}: no such file or folder")
        return  # a model type, checked against the installed transformers later
    folder = path.parent if path.is_file() else path
    config_file = path if path.is_file() else path / "config.json"
    if path.is_file() and path.suffix != ".json":
        raise UserError(f"--hf {spec}: give a config.json, a model folder or a model type, not {path.name}")
    if not config_file.is_file():
        has_harness = (folder / "harness.py").is_file()
        hint = (f"it has a harness.py: run `graphmode adapt {folder}`" if has_harness else
                f"a folder needs a config.json (a Hugging Face model) or a harness.py (`graphmode init {folder}` "
                "writes one)")
        raise UserError(f"--hf {spec}: no config.json in {folder}; {hint}")
    read_config(config_file)


def read_config(config_file: Path) -> dict:
    """config.json as a dict; UserError when it is not a readable JSON object. Standard library only, so a broken
    file is refused before transformers is imported."""
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UserError(f"{config_file}: not readable JSON ({error})") from None
    if not isinstance(config, dict):
        raise UserError(f"{config_file}: not a JSON object")
    return config


def resolve(spec: str, tiny: bool, max_seq_len: int, python: str | None = None, rewrite: bool = False) -> HFTarget:
    """Reads SPEC (a model type, a config.json or a folder) and checks everything that can be checked without
    running the model. `python`: the interpreter the model runs on (None: this one), which is asked which of the
    packages the code imports it lacks. `rewrite`: a type transformers implements is adapted from a copy of its
    installed modeling file rather than driven on transformers' static-cache path."""
    transformers = _transformers()
    from transformers import CONFIG_MAPPING

    refuse_missing_path(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        return _model_type(spec, tiny, max_seq_len, transformers.__version__, rewrite)
    folder = path.parent if path.is_file() else path
    config_file = path if path.is_file() else path / "config.json"
    config = read_config(config_file)
    model_type = config.get("model_type")
    auto_map = config.get("auto_map") or {}
    name = f"hf-{_safe_name(folder.resolve().name)}{'-tiny' if tiny else ''}"
    target = HFTarget(name=name, spec=spec, model_type=str(model_type), tiny=tiny,
                      transformers_version=transformers.__version__, config_folder="model")
    if auto_map:
        if rewrite:
            raise UserError(f"--hf {spec} --rewrite: the folder's own code (config.json's auto_map) is rewritten "
                            "already; --rewrite is for a model type transformers implements")
        _remote_code(target, folder, config_file, auto_map, python)
    else:
        target.notes += _built_in_type_notes(target, config_file, config, transformers.__version__, rewrite)
    # (the lazy CONFIG_MAPPING answers .get() with None: look the type up by `in`)
    config_class = CONFIG_MAPPING[model_type] if not auto_map and model_type in CONFIG_MAPPING else None
    _sizes_and_prompt(target, config, config_class, folder, max_seq_len)
    if not tiny:
        _weights(target, folder, config_file, check_shapes=not auto_map)
    return target


def _built_in_type_notes(target: HFTarget, config_file: Path, config: dict, version: str,
                         rewrite: bool) -> list[str]:
    """A folder without code of its own: its model_type must be one the installed transformers implements; the
    doubts about that model's static path, as notes (and the copy of its modeling file, where it is rewritten)."""
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not model_type:
        raise UserError(f"{config_file}: no model_type and no auto_map: transformers cannot tell which model this is")
    if model_type not in CONFIG_MAPPING:
        raise UserError(f"{config_file}: model_type {model_type!r} is unknown to the installed transformers "
                        f"{version}{_suggest(model_type, list(CONFIG_MAPPING.keys()))}; upgrade "
                        "transformers, or add the model's own code to the folder with an auto_map in config.json")
    return list(filter(None, [_check_static_path(target, CONFIG_MAPPING[model_type], config, rewrite)]))


def _model_type(spec: str, tiny: bool, max_seq_len: int, version: str, rewrite: bool = False) -> HFTarget:
    """`--hf MODEL_TYPE --tiny`: a model type the installed transformers implements, built small from its config."""
    from transformers import CONFIG_MAPPING

    if spec not in CONFIG_MAPPING:
        raise UserError(f"--hf {spec}: not a model type transformers {version} knows, nor a "
                        f"file or folder{_suggest(spec, list(CONFIG_MAPPING.keys()))}")
    if not tiny:
        raise UserError(f"--hf {spec}: a model type alone has no weights; add --tiny for a small model with "
                        "random weights, or give a local model folder")
    target = HFTarget(name=f"hf-{spec}-tiny", spec=spec, model_type=spec, tiny=True, transformers_version=version)
    doubt = _check_static_path(target, CONFIG_MAPPING[spec], None, rewrite)
    target.notes += [doubt] if doubt else []
    target.config_overrides = _tiny_overrides(CONFIG_MAPPING[spec], max_seq_len)
    _set_prompt_tokens(target, prompt_tokens({**CONFIG_MAPPING[spec]().to_dict(), **target.config_overrides}, None))
    return target


def _sizes_and_prompt(target: HFTarget, config: dict, config_class, folder: Path, max_seq_len: int) -> None:
    """The vocabulary the prompt is drawn from, the --tiny sizes, and the special ids the prompt starts with."""
    vocab = next((config[k] for k in ("vocab_size", "padded_vocab_size") if isinstance(config.get(k), int)), None)
    if vocab:
        target.prompt_vocab = min(vocab, target.prompt_vocab)
    values = {**(config_class().to_dict() if config_class else {}), **config}
    tokens = prompt_tokens(values, folder)  # read at full size: --tiny moves the ids it names below
    if target.tiny:
        target.config_overrides = (_tiny_overrides(config_class, max_seq_len, config) if config_class else
                                   _tiny_overrides_from_dict(config, max_seq_len))
        vocab = next((target.config_overrides[k] for k in ("vocab_size", "padded_vocab_size")
                      if k in target.config_overrides), None)
        if vocab:
            target.prompt_vocab = min(vocab, target.prompt_vocab)
            target.config_overrides.update(tiny_special_ids(values, vocab, tokens))
    _set_prompt_tokens(target, tokens)


def _weights(target: HFTarget, folder: Path, config_file: Path, check_shapes: bool) -> None:
    """The folder's weights, which must be there (and, where the shapes can be read without importing the model's
    code, match its config)."""
    weights = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not weights:
        raise UserError(f"--hf {target.spec}: no weights in {folder} (looked for {', '.join(WEIGHT_FILES)}); add "
                        "--tiny for a small model with random weights built from the config")
    target.weights_folder = str(folder.resolve())
    if check_shapes:  # remote code would have to be imported to know its shapes; its harness says it then
        _check_weights_match(folder, config_file, target.model_type)


def _set_prompt_tokens(target: HFTarget, tokens: PromptTokens) -> None:
    target.prompt_prefix, target.prompt_suffix = list(tokens.prefix), list(tokens.suffix)
    target.special_ids = [i for i in tokens.special if i < target.prompt_vocab]
    target.prompt_evidence = list(tokens.evidence)
    if len(target.special_ids) >= target.prompt_vocab:
        raise UserError(f"--hf {target.spec}: every id below {target.prompt_vocab} is a special token; graphmode "
                        "draws the prompt from the others")


def _check_weights_match(folder: Path, config_file: Path, model_type: str) -> None:
    """Weights whose shapes the config does not give are bad input, said before any model is built: transformers'
    own refusal comes much later, as a report on stderr and a one-line error pointing at it."""
    saved = _saved_shapes(folder)
    if not saved:
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        expected = {name: list(t.shape) for name, t in AutoModelForCausalLM.from_config(config).state_dict().items()}
    wrong = [(name, shape, expected[name]) for name, shape in saved.items()
             if name in expected and expected[name] != shape]
    if wrong:
        name, got, want = wrong[0]
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise UserError(f"--hf {folder}: the weights do not match {config_file.name}: {name} is {got} in the weights "
                        f"and {want} by the config{more}; use the config.json the weights were saved with")


def _saved_shapes(folder: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from the safetensors headers (single file or index), without reading any tensor."""
    index = folder / "model.safetensors.index.json"
    files = ([folder / name for name in sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))]
             if index.is_file() else [folder / "model.safetensors"])
    shapes: dict[str, list[int]] = {}
    for path in files:
        if not path.is_file():
            continue
        with path.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        shapes.update({name: entry["shape"] for name, entry in header.items() if name != "__metadata__"})
    return shapes


def _check_static_path(target: HFTarget, config_class, config: dict | None = None, rewrite: bool = False) -> str | None:
    """The model type has a causal LM class in this transformers, on a static-cache path graphmode can drive, or
    (`rewrite`, or no static path at all in this release) a modeling file graphmode copies and rewrites instead
    (`_use_installed_copy`); a note for the person where transformers doubts that the path compiles whole. `config`:
    config.json's values, where the model comes from a folder."""
    from graphmode.runners.hf_driver import declared_not_compilable, has_static_cache_path, \
        layers_without_static_kind, takes_no_cache

    spec = target.spec
    model_class = _decoder_class(spec, config_class, config)
    state = takes_no_cache(model_class)
    if state:
        # Nothing to move into buffers: the rewrites serve a key/value cache that grows a position a step.
        raise UserError(f"--hf {spec}: {state}, so it has no path on transformers' StaticCache, which graphmode "
                        "compiles Decode on, and no rewrite of its code serves it either: graphmode's rewrites move "
                        "a key/value cache that grows by one position a step into fixed buffers, which this state "
                        "is not")
    built = _config_object(config_class, config)
    why_not = has_static_cache_path(model_class) or (built is not None and layers_without_static_kind(built))
    if rewrite or why_not:
        _use_installed_copy(target, model_class, rewrite)
        # Said where graphmode chose the copy itself; a --rewrite the person gave needs no note.
        return (f"{why_not}: graphmode cannot drive transformers' static-cache path, and rewrites a copy of "
                f"{_site_relative(target.installed_copy)} instead") if why_not and not rewrite else None
    doubt = declared_not_compilable(model_class)
    return (f"{doubt}: its authors expect graph breaks; graphmode drives the static-cache path anyway, and the "
            "report counts what breaks (where it breaks, `--rewrite` adapts a copy of its modeling file "
            "instead)") if doubt else None


def _decoder_class(spec: str, config_class, config: dict | None) -> type:
    """The type's causal LM class; UserError where it has none, or where it is an encoder's LM head."""
    from transformers import AutoModelForCausalLM

    try:
        model_class = AutoModelForCausalLM._model_mapping[config_class]
    except KeyError:
        raise UserError(f"--hf {spec}: {config_class.model_type} has no causal language model in transformers "
                        "(AutoModelForCausalLM); graphmode adapts decoders that generate token by token") from None
    flag = _encoder_flag(config_class, model_class, config or {})
    if flag:
        raise UserError(f"--hf {spec}: {config_class.__name__} describes an encoder ({flag} is false: every "
                        "position attends to the ones after it too), which no KV cache serves; graphmode adapts "
                        "decoders that generate token by token")
    return model_class


def _config_object(config_class, config: dict | None):
    """The config the model would be built from: config.json's values where there are some, else the class's
    defaults (the layer types a tiny build cuts to its layers are the same kinds)."""
    try:
        return config_class.from_dict(config) if config else config_class()
    except (TypeError, ValueError):  # defaults that do not validate (Gemma-4's assistant): the build says why
        return None


def _use_installed_copy(target: HFTarget, model_class: type, asked: bool) -> None:
    """The target's source becomes a copy of the installed file that defines `model_class` (write_target makes it),
    under its own name; the model class is read from the copy, the config from transformers. `asked`: --rewrite was
    given (else the release has no static path for the type)."""
    from graphmode.agent.targets.installed_copy import installed_modeling_file, recurrent_state_write

    installed = installed_modeling_file(model_class)
    recurrent = recurrent_state_write(installed)
    if recurrent:
        instead = ("; without --rewrite, transformers' own static-cache path holds that state and is driven" if asked
                   else ", and this transformers release has no static-cache path for it either")
        raise UserError(f"--hf {target.spec}{' --rewrite' if asked else ''}: {recurrent}: the model carries a "
                        "recurrent state (a state overwritten every step, not keys and values that grow by one "
                        "position), and graphmode's rewrites move only a key/value cache into fixed buffers, so no "
                        f"rewrite of this file serves it{instead}")
    target.installed_copy, target.installed_module = str(installed), model_class.__module__
    # At the target folder's top, as the harness's own sources are: the copy imports nothing relatively, so the
    # adapted copy imports graphmode's helper module beside it plainly, which a package would not find.
    target.sources = [installed.name]
    target.model_refs = [f"{installed.stem}.{model_class.__name__}"]
    target.auto_map = {"AutoModelForCausalLM": target.model_refs[0]}


def _encoder_flag(config_class, model_class, config: dict) -> str | None:
    """An encoder's causal LM head: the config field that makes its attention causal, where neither the config nor
    the class sets it, else None. BERT, RoBERTa, ... attend causally only where `is_decoder` is set (checkpoints
    fine-tuned as decoders); XLM only where `causal` is (its CLM checkpoints). BART's and Marian's causal LM classes
    set is_decoder themselves; GPT-NeoX declares the field and never reads it."""
    import inspect

    fields = getattr(config_class, "__annotations__", {})
    try:
        module = ast.parse(inspect.getsource(sys.modules[model_class.__module__]))
        init = ast.parse(textwrap.dedent(inspect.getsource(model_class.__init__)))
    except (OSError, TypeError, KeyError, SyntaxError):
        return None

    def uses(tree: ast.AST, name: str, context: type) -> bool:
        return any(isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, context)
                   for node in ast.walk(tree))

    for flag in ("is_decoder", "causal"):
        if flag not in fields or config.get(flag) is True:
            continue
        # (a class whose default is already True, were there one, is a decoder as built)
        if getattr(config_class, flag, False) is not True and uses(module, flag, ast.Load) \
                and not uses(init, flag, ast.Store):
            return flag
    return None


def _remote_code(target: HFTarget, folder: Path, config_file: Path, auto_map: dict, python: str | None) -> None:
    """A folder whose config.json names its own classes: their files, copied as a package, are the sources."""
    if not isinstance(auto_map, dict):
        raise UserError(f"{config_file}: auto_map must be an object of class references")
    config_ref = auto_map.get("AutoConfig")
    model_keys = _model_entries(auto_map)
    _check_model_entries(config_file, config_ref, model_keys)
    refs = list(dict.fromkeys(auto_map[key] for key in model_keys))
    for ref in (config_ref, *refs):
        _check_local_ref(config_file, folder, ref)
    target.package = _safe_name(folder.resolve().name)
    target.auto_map = {"AutoConfig": config_ref, **{key: auto_map[key] for key in model_keys}}
    target.model_refs = refs
    if "AutoModelForCausalLM" not in model_keys:
        target.notes.append(f"auto_map names no AutoModelForCausalLM: the harness takes the first of "
                            f"{', '.join(refs)} ({', '.join(model_keys)}) whose model has an LM head (a linear onto "
                            "the vocabulary), and says so when none has")
    target.sources = _remote_sources(target.package, folder, refs)
    target.missing_imports.update(_folder_missing_imports(folder, python))
    target.notes += [_missing_import_note(package, where) for package, where in target.missing_imports.items()]


def _check_model_entries(config_file: Path, config_ref: object, model_keys: list[str]) -> None:
    """auto_map names a config class and at least one model class."""
    if model_keys and config_ref:
        return
    missing = " and ".join(k for k, v in (("AutoConfig", config_ref), ("AutoModel* entry", model_keys)) if not v)
    raise UserError(f"{config_file}: auto_map has no {missing}; graphmode adapts language models (auto_map must "
                    "name AutoConfig, and AutoModelForCausalLM or another AutoModel* class with an LM head)")


def _check_local_ref(config_file: Path, folder: Path, ref: object) -> None:
    """An auto_map class reference names a module of this folder (not another repository's)."""
    if not isinstance(ref, str) or "--" in ref:
        raise UserError(f"{config_file}: auto_map entry {ref!r} points into another repository; copy that code "
                        "into this folder (graphmode reads local files only)")
    module = ref.rpartition(".")[0]
    if not (folder / f"{module}.py").is_file():
        raise UserError(f"{config_file}: auto_map names {ref}, but {folder / (module + '.py')} does not exist")


def _remote_sources(package: str, folder: Path, refs: list[str]) -> list[str]:
    """The sources of a remote-code folder, as package/file: every modeling_*.py, and each model class's module."""
    sources = sorted(f"{package}/{p.name}" for p in folder.glob("modeling_*.py"))
    for ref in refs:
        model_module = ref.rpartition(".")[0]
        if f"{package}/{model_module}.py" not in sources:
            sources.append(f"{package}/{model_module}.py")
    return sources


def _missing_import_note(package: str, where: str) -> str:
    """The note for a package the folder's code imports and the interpreter lacks."""
    return (f"{where} imports {package}, which is not installed: graphmode puts a placeholder in its "
            f"place, so the run fails (naming {package}) only if the code calls into it"
            + ("; `torch.npu` is a CPU stand-in that answers questions about the device as a machine "
               "without an NPU would (design.md lists the calls)" if package == "torch_npu" else ""))


# The auto_map entries that may name a language model, in the order tried: a causal LM first, then the classes
# GLM-style repositories map theirs to (AutoModel, AutoModelForSeq2SeqLM), then any other AutoModel* entry.
_MODEL_ENTRY_ORDER = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModel")


def _model_entries(auto_map: dict) -> list[str]:
    keys = [key for key in auto_map if isinstance(key, str) and key.startswith("AutoModel")]
    return sorted(keys, key=lambda k: _MODEL_ENTRY_ORDER.index(k) if k in _MODEL_ENTRY_ORDER else len(keys))


def _folder_missing_imports(folder: Path, python: str | None) -> dict[str, str]:
    """`_missing_imports` of every .py file of the folder, asking the interpreter once; the first import of each."""
    imports: dict[str, str] = {}
    for source in sorted(folder.glob("*.py")):
        imports.update({k: v for k, v in unguarded_imports(source).items() if k not in imports})
    absent = absent_packages(set(imports), python)
    return {package: where for package, where in imports.items() if package in absent}


def _missing_imports(source: Path, python: str | None = None) -> dict[str, str]:
    """{top-level package: "file:line"} for imports not guarded by try or an `if is_..._available()` that the
    interpreter the model runs on (`python`; None: this one) cannot import; relative imports are the folder's own."""
    imports = unguarded_imports(source)
    absent = absent_packages(set(imports), python)
    return {package: where for package, where in imports.items() if package in absent}


def absent_packages(names: set[str], python: str | None) -> set[str]:
    """Those of `names` that the interpreter (`python`; None: this one) cannot import: the target's own is asked, in
    one process, since it may have a package this one lacks, or lack one it has."""
    if not names:
        return set()
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        return {name for name in names if importlib.util.find_spec(name) is None}
    code = ("import importlib.util, json, sys; "
            "print(json.dumps([n for n in sys.argv[1:] if importlib.util.find_spec(n) is None]))")
    try:
        done = subprocess.run([python, "-c", code, *sorted(names)], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        return set(json.loads(done.stdout.strip().splitlines()[-1]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        # The interpreter was checked when the run began; should it not answer now, this one's view stands in.
        return {name for name in names if importlib.util.find_spec(name) is None}


def unguarded_imports(source: Path) -> dict[str, str]:
    """{top-level package: "file:line"} for every import not guarded by try or an `if is_..._available()`, of a
    package that is not the standard library's."""
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    except SyntaxError as error:
        raise UserError(f"{source}:{error.lineno}:{error.offset or 1}: syntax error: {error.msg}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{source}: not readable as UTF-8 text ({error})") from None
    found: dict[str, str] = {}

    def guarded(node: ast.AST) -> bool:
        if isinstance(node, ast.Try):
            return True
        if isinstance(node, ast.If):
            return any(isinstance(call, ast.Call) and re.match(r"is_\w*available", _called(call))
                       for call in ast.walk(node.test))
        return False

    def visit(node: ast.AST) -> None:
        if guarded(node):
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        for name in names:
            top = name.partition(".")[0]
            if top not in found and top not in sys.stdlib_module_names:
                found[top] = f"{source.name}:{node.lineno}"
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _tiny_overrides(config_class, max_seq_len: int, config: dict | None = None) -> dict:
    from graphmode.runners.hf_driver import tiny_config_overrides

    overrides = tiny_config_overrides(config_class, values=config)
    default = config_class()
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if hasattr(default, name):
            overrides[name] = max(max_seq_len, 64)
            break
    return _fit_per_layer_lists(overrides, config or {})


def _tiny_overrides_from_dict(config: dict, max_seq_len: int) -> dict:
    """The --tiny sizes for a config class graphmode cannot instantiate before the remote code is imported: the
    usual key names, where config.json has them."""
    from graphmode.runners.hf_driver import TINY_SIZES, tiny_moe_mla_overrides

    aliases = {"hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
               "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
               "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
               "num_key_value_heads": ("num_key_value_heads", "n_kv_heads", "multi_query_group_num"),
               "intermediate_size": ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim"),
               "vocab_size": ("vocab_size", "padded_vocab_size")}
    overrides = {}
    for size, names in aliases.items():
        for name in names:
            if isinstance(config.get(name), int):
                overrides[name] = TINY_SIZES[size]
    for name in ("head_dim", "kv_channels"):  # ChatGLM names the head size kv_channels
        if isinstance(config.get(name), int):
            overrides[name] = TINY_SIZES["hidden_size"] // TINY_SIZES["num_attention_heads"]
    for name in ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length"):
        if isinstance(config.get(name), int):
            overrides[name] = max(config[name], max_seq_len) if config[name] < max_seq_len else config[name]
    if "tie_word_embeddings" in config:
        overrides["tie_word_embeddings"] = False  # a tied tiny head repeats one token (runners.hf_driver)
    # special ids beyond the tiny vocabulary move in resolve() (hf_prompt.tiny_special_ids)
    overrides.update(tiny_moe_mla_overrides(config, TINY_SIZES["num_hidden_layers"]))
    return _fit_per_layer_lists(overrides, config)


def _fit_per_layer_lists(overrides: dict, config: dict) -> dict:
    """A config.json written for N layers lists some settings per layer (Gemma's layer_types); with fewer layers
    those lists are cut to the new count, or the config refuses to build."""
    layers_key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers") if k in overrides), None)
    old = config.get(layers_key) if layers_key else None
    if isinstance(old, int) and old != overrides[layers_key]:
        for key, value in config.items():
            if isinstance(value, list) and len(value) == old and key not in overrides:
                overrides[key] = value[:overrides[layers_key]]
    for key, part in overrides.items():  # a composite config's parts (Gemma 3's text_config) list theirs too
        if isinstance(part, dict) and isinstance(config.get(key), dict):
            _fit_per_layer_lists(part, config[key])
    return overrides


def _safe_name(name: str) -> str:
    cleaned = re.sub(r"\W", "_", name).strip("_") or "model"
    return f"m_{cleaned}" if cleaned[0].isdigit() else cleaned


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def is_hub_folder(folder: Path) -> bool:
    """A folder whose config.json names its own code (auto_map): remote code, imported as a package."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("auto_map"))


def init_harness(folder: Path, max_seq_len: int = 64) -> tuple[str, HFTarget]:
    """`graphmode init` on a Hub folder: the harness `--hf FOLDER --tiny` writes, but importing the folder it sits
    in as a package (the modeling files import each other relatively) and reading config.json beside it."""
    target = resolve(str(folder), True, max_seq_len)
    target.in_place, target.config_folder = True, None
    target.sources = [source.partition("/")[2] for source in target.sources]
    return render("hf_harness.py.j2", t=target, max_seq_len=max_seq_len), target


def write_target(target: HFTarget, source_spec: Path | None, dest: Path, max_seq_len: int) -> Path:
    """The target folder: harness.py, the config and any remote code (or the copy of the installed modeling file),
    swapped in whole."""
    with swapped_in(dest) as staging:
        if target.installed_copy:
            from graphmode.agent.targets.installed_copy import copy_modeling_file

            copy_modeling_file(Path(target.installed_copy), target.installed_module, staging)
        if source_spec is not None:
            folder = source_spec.parent if source_spec.is_file() else source_spec
            config_dest = staging / (target.package or target.config_folder or "model")
            config_dest.mkdir()
            shutil.copyfile(folder / "config.json" if source_spec.is_dir() else source_spec,
                            config_dest / "config.json")
            target.config_folder = config_dest.name
            if target.package:
                (config_dest / "__init__.py").write_text("", encoding="utf-8")
                for source in folder.glob("*.py"):
                    if source.name != "__init__.py":
                        shutil.copyfile(source, config_dest / source.name)
        write_atomic(staging / "harness.py", render("hf_harness.py.j2", t=target, max_seq_len=max_seq_len))
    return dest
