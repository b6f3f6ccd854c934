"""Which calling convention a model folder's code uses, read statically (stdlib `ast`; nothing is imported or run).

`graphmode init` writes a harness from this: the model class, how to construct it, and how its `forward` is
driven for one Prefill and one Decode step. The four conventions it knows:

- `hf`: `forward` takes `past_key_values` and/or `cache_position` (Hugging Face style; the cache goes in and out);
- `start_pos`: Meta style, `forward(tokens, start_pos)`, the caches made in `__init__` and written at start_pos;
- `input_pos`: gpt-fast style, `forward(idx, input_pos)`, the caches made by `setup_caches(...)`;
- `full-sequence`: no cache, `forward(tokens)` (maybe a mask or targets), the whole sequence recomputed each step.

Anything else is `unknown`, with the reason; the user may name the convention instead.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from graphmode.transforms.vocabulary import TOKEN_PARAM_NAMES

CONVENTIONS = ("hf", "start_pos", "input_pos", "full-sequence")
UNKNOWN = "unknown"
HARNESS_FILE = "harness.py"  # as graphmode.runners.harness says it; that module imports torch

# Files in a model folder that are never model code.
_NOT_MODEL_FILES = frozenset({HARNESS_FILE, "setup.py", "conftest.py"})
# Base classes (last dotted name) that make a class an nn.Module even when defined outside the folder.
_MODULE_BASES = frozenset({"Module", "PreTrainedModel", "PretrainedModel"})
# More token parameter names than the codemods need: research code also says `input`, `inputs` or `ids`.
_TOKEN_PARAMS = TOKEN_PARAM_NAMES | {"ids", "inputs", "input", "input_tokens", "tok", "toks"}
_HF_PARAMS = ("past_key_values", "cache_position")
# Arguments a cache-free model's forward may take besides the tokens without holding any state.
_STATELESS_PARAMS = frozenset(
    {"mask", "attention_mask", "attn_mask", "padding_mask", "key_padding_mask", "targets", "target", "labels",
     "return_loss", "return_dict", "output_attentions", "output_hidden_states", "return_logits"})
# A parameter whose name says it carries a cache, a position or state between steps.
_STATEFUL_PARAM = re.compile(r"cache|past|pos|kv|state|memory|mems|offset|step")
# An attribute that holds keys and values: `cache_k`, `k_cache`, `kv_cache`, `key_cache`, `self.cache`, ...
# (rotary `cos_cached` tables are not caches of keys and values).
_KV_CACHE_ATTR = re.compile(r"^_?(caches?|kv_caches?)$|(^|_)(k|v|kv|key|keys|value|values)_?cache|cache_?(k|v|kv)$")
# Class names that say "the whole language model", best first.
_PREFERRED_NAMES = (re.compile(r"ForCausalLM$"), re.compile(r"LMHeadModel$"), re.compile(r"^Transformer$"),
                    re.compile(r"^GPT"))
_CONFIG_PARAM = re.compile(r"^(config|cfg|conf|args|params|model_args|model_config|hparams|hps)$|_?(config|args)$")
_CONFIG_CLASS = re.compile(r"(Config|Configuration|Args|Params|Hparams|Options)$")


@dataclass(frozen=True)
class Param:
    """One parameter: its name, its default as source text (None when required) and whether it can be passed
    by position."""

    name: str
    default: str | None = None
    positional: bool = True


@dataclass(frozen=True)
class ModelFacts:
    """What a harness needs beyond the convention, all read from the source: the constructor, the config class's
    fields, `setup_caches`' parameters, and which files hold model code."""

    sources: tuple[str, ...] = ()
    init_params: tuple[Param, ...] = ()
    config_param: str | None = None          # the constructor parameter that takes the config object
    config_file: str | None = None           # the file of the folder that defines the config class, if one does
    config_style: str | None = None          # "kwargs" (dataclass or __init__) or "attributes" (class attributes)
    config_fields: tuple[Param, ...] = ()    # empty when the class is not defined in the folder
    setup_caches: tuple[Param, ...] | None = None
    module_cache: str | None = None          # evidence of a module-held KV cache, "Class.attr (file:line)"


@dataclass(frozen=True)
class Detection:
    convention: str                          # one of CONVENTIONS, or UNKNOWN
    model_class: str | None
    file: str | None                         # the model class's file, relative to the folder
    line: int | None                         # the line of its forward (or of the class, without one)
    forward_params: tuple[Param, ...]
    config_class: str | None
    reason: str                              # one sentence naming the evidence with file:line
    named: bool = False                      # the user named the convention (it won over detection)
    facts: ModelFacts = field(default_factory=ModelFacts)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.forward_params)


@dataclass
class _Class:
    name: str
    file: str
    node: ast.ClassDef
    bases: tuple[str, ...]
    order: int

    def method(self, name: str) -> ast.FunctionDef | None:
        for stmt in self.node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                return stmt  # type: ignore[return-value]
        return None


def model_files(folder: Path) -> list[Path]:
    """The .py files of a model folder (not recursive: the harness imports them by module name)."""
    return sorted(p for p in Path(folder).glob("*.py") if p.is_file() and p.name not in _NOT_MODEL_FILES
                  and not p.name.startswith("test_") and not p.name.endswith("_test.py"))


def detect(folder: Path, convention: str | None = None) -> Detection:
    """The model class in `folder` and its calling convention. A `convention` the user names wins over detection;
    the reason then says what detection alone would have said."""
    if convention is not None and convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}; one of {', '.join(CONVENTIONS)}")
    folder = Path(folder)
    files = model_files(folder)
    trees: dict[str, ast.Module] = {}
    unparsed: list[str] = []
    for path in files:
        try:
            trees[path.name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError) as error:
            unparsed.append(f"{path.name}:{getattr(error, 'lineno', None) or 1}")
    found = _detect(trees, unparsed, [p.name for p in files])
    if convention is None:
        return found
    reason = f"named with --convention {convention}; detection alone says {found.convention}: {found.reason}"
    return Detection(convention, found.model_class, found.file, found.line, found.forward_params,
                     found.config_class, reason, named=True, facts=found.facts)


def _detect(trees: dict[str, ast.Module], unparsed: list[str], names: list[str]) -> Detection:
    classes = _module_classes(trees)
    chosen = _choose_model(classes)
    if chosen is None:
        where = ", ".join(names) or "no .py file"
        extra = f" ({', '.join(unparsed)} could not be parsed)" if unparsed else ""
        return Detection(UNKNOWN, None, None, None, (), None,
                         f"no nn.Module subclass with a forward method in {where}{extra}")
    forward, owner = _resolve(chosen, "forward", classes)
    params = _params(forward) if forward is not None else ()
    line = forward.lineno if forward is not None else chosen.node.lineno
    facts, config_class = _facts(chosen, classes, trees)
    convention, reason = _classify(chosen, owner or chosen, forward, params, classes, facts)
    return Detection(convention, chosen.name, chosen.file, line, params, config_class, reason, facts=facts)


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):  # Generic[...] and the like
        return _last_name(node.value)
    return None


def _module_classes(trees: dict[str, ast.Module]) -> dict[str, _Class]:
    """Every top-level class of the files that is an nn.Module, directly or through other classes of the files."""
    every = _every_class(trees)
    modules: set[str] = set()
    changed = True
    while changed:  # a fixed point: a base defined after its subclass, or in another file, still counts
        found = {cls.name for cls in every.values() if cls.name not in modules and _module_bases(cls, modules)}
        modules |= found
        changed = bool(found)
    return {name: cls for name, cls in every.items() if name in modules}


def _every_class(trees: dict[str, ast.Module]) -> dict[str, _Class]:
    """Every top-level class of the files by name (a later one of the same name wins), numbered in file order."""
    every: dict[str, _Class] = {}
    order = 0
    for file, tree in trees.items():
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef):
                bases = tuple(n for n in (_last_name(b) for b in stmt.bases) if n)
                every[stmt.name] = _Class(stmt.name, file, stmt, bases, order)
                order += 1
    return every


def _module_bases(cls: _Class, modules: set[str]) -> bool:
    """Whether one of the class's bases is an nn.Module: torch's, a Hugging Face model's, or one already found."""
    return any(b in _MODULE_BASES or b in modules or b.endswith("PreTrainedModel") for b in cls.bases)


def _resolve(cls: _Class, method: str, classes: dict[str, _Class]) -> tuple[ast.FunctionDef | None, _Class | None]:
    """A method as the class has it: its own, else the first base in the files that defines it."""
    seen: set[str] = set()
    queue = [cls]
    while queue:
        current = queue.pop(0)
        if current.name in seen:
            continue
        seen.add(current.name)
        found = current.method(method)
        if found is not None:
            return found, current
        queue.extend(classes[b] for b in current.bases if b in classes)
    return None, None


def _params(function: ast.FunctionDef) -> tuple[Param, ...]:
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = [Param(a.arg, ast.unparse(d) if d is not None else None, True) for a, d in zip(positional, defaults)]
    out += [Param(a.arg, ast.unparse(d) if d is not None else None, False)
            for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return tuple(out[1:] if out and out[0].name in ("self", "cls") else out)


def _instantiated(classes: dict[str, _Class]) -> set[str]:
    """Classes some other class of the files calls (constructs)."""
    called: set[str] = set()
    for cls in classes.values():
        for node in ast.walk(cls.node):
            if isinstance(node, ast.Call):
                name = _last_name(node.func)
                if name in classes and name != cls.name:
                    called.add(name)
    return called


def _owns_embedding(cls: _Class) -> bool:
    init = cls.method("__init__")
    return init is not None and any(isinstance(n, ast.Call) and _last_name(n.func) == "Embedding"
                                    for n in ast.walk(init))


def _choose_model(classes: dict[str, _Class]) -> _Class | None:
    """The language model: a module whose forward takes token ids (or that owns the token embedding), preferring
    the ones no other class constructs, then the names ForCausalLM / LMHeadModel / Transformer / GPT, then the
    last one in the files."""
    def takes_tokens(cls: _Class) -> bool:
        forward, _ = _resolve(cls, "forward", classes)
        if forward is None:
            return False
        params = _params(forward)
        return bool(params) and (params[0].name in _TOKEN_PARAMS or _owns_embedding(cls))

    with_forward = [c for c in classes.values() if _resolve(c, "forward", classes)[0] is not None]
    candidates = [c for c in with_forward if takes_tokens(c)] or with_forward
    if not candidates:
        return None
    inner = _instantiated(classes)
    pool = [c for c in candidates if c.name not in inner] or candidates

    def rank(cls: _Class) -> tuple[int, int]:
        preferred = next((i for i, p in enumerate(_PREFERRED_NAMES) if p.search(cls.name)), len(_PREFERRED_NAMES))
        return preferred, -cls.order

    return min(pool, key=rank)


def _where(cls: _Class, node: ast.AST) -> str:
    return f"{cls.file}:{getattr(node, 'lineno', cls.node.lineno)}"


def _signature(cls: _Class, params: tuple[Param, ...]) -> str:
    return f"{cls.name}.forward({', '.join(p.name for p in params)})"


def _kv_cache_made(classes: dict[str, _Class]) -> tuple[str, _Class, ast.AST] | None:
    """The first KV cache an `__init__` of the files creates: `self.cache_k = torch.zeros(...)` or
    `self.register_buffer("k_cache", ...)` (a placeholder `= None` is filled elsewhere, so it does not count)."""
    for cls in sorted(classes.values(), key=lambda c: c.order):
        init = cls.method("__init__")
        if init is None:
            continue
        for node in ast.walk(init):
            name = _cache_assigned(node) or _cache_registered(node)
            if name:
                return name, cls, node
    return None


def _cache_assigned(node: ast.AST) -> str | None:
    """The KV cache attribute `self.cache_k = <not None>` assigns, None for any other statement."""
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return None
    if isinstance(node.value, ast.Constant) and node.value.value is None:
        return None
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return next((target.attr for target in targets if _is_self_cache(target)), None)


def _is_self_cache(target: ast.expr) -> bool:
    """`self.<name>` where the name is a KV cache's (cache_k, k_cache, kv_cache...)."""
    return isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self" \
        and bool(_KV_CACHE_ATTR.search(target.attr))


def _cache_registered(node: ast.AST) -> str | None:
    """The KV cache buffer `self.register_buffer("k_cache", ...)` registers, None for any other node."""
    if not (isinstance(node, ast.Call) and _last_name(node.func) == "register_buffer" and node.args):
        return None
    name = node.args[0]
    if isinstance(name, ast.Constant) and isinstance(name.value, str) and _KV_CACHE_ATTR.search(name.value):
        return name.value
    return None


def _written_at(classes: dict[str, _Class], name: str) -> tuple[_Class, ast.AST] | None:
    """The first subscript assignment `x[..., name ...] = ...` in the files: a cache written at that position."""
    for cls in sorted(classes.values(), key=lambda c: c.order):
        for node in ast.walk(cls.node):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Subscript) and any(isinstance(n, ast.Name) and n.id == name
                                                                 for n in ast.walk(target.slice)):
                        return cls, node
    return None


def _classify(cls: _Class, owner: _Class, forward: ast.FunctionDef | None, params: tuple[Param, ...],
              classes: dict[str, _Class], facts: ModelFacts) -> tuple[str, str]:
    if forward is None:
        return UNKNOWN, f"{cls.name} ({cls.file}:{cls.node.lineno}) has no forward method"
    names = [p.name for p in params]
    at = _where(owner, forward)
    signature = _signature(cls, params)
    said = f"{signature} ({at})"
    hf = [n for n in _HF_PARAMS if n in names]
    if hf:
        return "hf", (f"{said} takes {' and '.join(hf)}, so the cache goes in and out of forward Hugging Face style")
    if "start_pos" in names[1:]:
        return _classify_start_pos(said, names[1:], classes, facts)
    if "input_pos" in names:
        return _classify_input_pos(said, cls, classes)
    return _classify_positionless(said, cls, params, classes, facts)


def _classify_start_pos(said: str, rest: list[str], classes: dict[str, _Class], facts: ModelFacts) -> tuple[str, str]:
    """A forward taking start_pos is the start_pos convention when the model holds the cache it indexes."""
    carried = [n for n in rest if n != "start_pos" and re.search(r"cache|past|kv", n)]
    if carried:
        return UNKNOWN, (f"{said} takes start_pos but also carries {carried[0]} in and out, which is not a "
                         "module-held cache")
    if facts.module_cache is None:
        return UNKNOWN, (f"{said} takes start_pos, but no __init__ in the files creates a key/value cache for it to "
                         "index")
    written = _written_at(classes, "start_pos")
    written_text = f", written at start_pos ({_where(*written)})" if written else ""
    return "start_pos", (f"{said} takes start_pos and the model holds its cache: {facts.module_cache} is created in "
                         f"__init__{written_text}")


def _classify_input_pos(said: str, cls: _Class, classes: dict[str, _Class]) -> tuple[str, str]:
    """A forward taking input_pos is the gpt-fast convention when the class has setup_caches to make the caches."""
    setup, setup_owner = _resolve(cls, "setup_caches", classes)
    if setup is None or setup_owner is None:
        return UNKNOWN, f"{said} takes input_pos, but {cls.name} has no setup_caches method to make its caches"
    return "input_pos", (f"{said} takes input_pos and {cls.name}.setup_caches ({_where(setup_owner, setup)}) makes "
                         "the caches, gpt-fast style")


def _carries_state(param: Param) -> bool:
    """A forward parameter after the tokens that may carry state between steps: required, or named like state."""
    return param.name not in _STATELESS_PARAMS and (param.default is None or bool(_STATEFUL_PARAM.search(param.name)))


def _unreached_caches(said: str, cls: _Class, classes: dict[str, _Class], facts: ModelFacts) -> str | None:
    """Why a forward that takes no position is not recognized when the model makes caches anyway; None when not."""
    setup, setup_owner = _resolve(cls, "setup_caches", classes)
    if setup is not None and setup_owner is not None:
        return (f"{said} takes no position, yet {cls.name}.setup_caches ({_where(setup_owner, setup)}) makes caches; "
                "how positions reach them is not recognized")
    if facts.module_cache is not None:
        return (f"{said} takes no position, yet {facts.module_cache} is a key/value cache created in __init__; how "
                "positions reach it is not recognized")
    return None


def _classify_positionless(said: str, cls: _Class, params: tuple[Param, ...], classes: dict[str, _Class],
                           facts: ModelFacts) -> tuple[str, str]:
    """A forward taking no position recomputes the whole sequence, unless it carries state or the model has caches
    (then how positions reach them is not recognized)."""
    stateful = [p.name for p in params[1:] if _carries_state(p)]
    if not params or stateful:
        taken = f"takes {', '.join(stateful)}" if stateful else "takes no token argument"
        return UNKNOWN, f"{said} {taken}, and none of past_key_values/cache_position, start_pos or input_pos"
    unreached = _unreached_caches(said, cls, classes, facts)
    if unreached:
        return UNKNOWN, unreached
    rest = [p.name for p in params[1:]]
    extra = f" (besides {', '.join(rest)}, which hold no state)" if rest else ""
    return "full-sequence", (f"{said} takes only the tokens{extra} and no class creates a key/value cache, so every "
                             "step recomputes the whole sequence")


def _annotation_name(annotation: ast.expr | None) -> str | None:
    """`Config`, `"Config"`, `Optional[Config]`, `cfg.Config` -> "Config"."""
    if annotation is None:
        return None
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            return _annotation_name(ast.parse(annotation.value, mode="eval").body)
        except SyntaxError:
            return None
    if isinstance(annotation, ast.Subscript) and _last_name(annotation.value) == "Optional":
        return _annotation_name(annotation.slice)
    if isinstance(annotation, ast.BinOp):  # Config | None
        return _annotation_name(annotation.left)
    return _last_name(annotation)


def _imported_names(tree: ast.Module) -> set[str]:
    return {alias.asname or alias.name for stmt in tree.body if isinstance(stmt, ast.ImportFrom)
            for alias in stmt.names}


def _top_classes(trees: dict[str, ast.Module]) -> dict[str, tuple[str, ast.ClassDef]]:
    return {stmt.name: (file, stmt) for file, tree in trees.items() for stmt in tree.body
            if isinstance(stmt, ast.ClassDef)}


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any(_last_name(d.func if isinstance(d, ast.Call) else d) == "dataclass" for d in node.decorator_list)


def _config_fields(node: ast.ClassDef) -> tuple[str, tuple[Param, ...]]:
    """A config class's fields and how it takes them: "kwargs" (a dataclass or an __init__ with parameters), or
    "attributes" (plain class attributes, set on an instance)."""
    init = _own_init(node)
    if init is not None and not _is_dataclass(node):
        return "kwargs", tuple(p for p in _params(init) if p.name not in ("args", "kwargs"))
    fields = tuple(field_ for field_ in map(_class_field, node.body) if field_ is not None)
    return ("kwargs" if _is_dataclass(node) else "attributes"), fields


def _own_init(node: ast.ClassDef) -> ast.FunctionDef | None:
    """The __init__ the class body defines itself."""
    return next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)


def _class_field(stmt: ast.stmt) -> Param | None:
    """A config class's field a statement of its body defines (`dim: int = 64`, `dim = 64`), with its default."""
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
            and _last_name(stmt.annotation) != "ClassVar":
        return Param(stmt.target.id, ast.unparse(stmt.value) if stmt.value is not None else None, False)
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return Param(stmt.targets[0].id, ast.unparse(stmt.value), False)
    return None


def _facts(cls: _Class, classes: dict[str, _Class], trees: dict[str, ast.Module]) -> tuple[ModelFacts, str | None]:
    init, _ = _resolve(cls, "__init__", classes)
    init_params = _params(init) if init is not None else ()
    defined = _top_classes(trees)
    imported = _imported_names(trees[cls.file])
    config_param = config_class = None
    if init_params and init is not None:
        config_param, config_class = _config_of(cls, init, init_params[0].name, classes, defined, imported)
    config_file, style, fields = _config_shape(config_class, defined)
    setup, _ = _resolve(cls, "setup_caches", classes)
    made = _kv_cache_made(classes)
    sources = tuple(sorted({c.file for c in classes.values()}))
    return ModelFacts(
        sources=sources, init_params=init_params, config_param=config_param, config_file=config_file,
        config_style=style, config_fields=fields, setup_caches=_params(setup) if setup is not None else None,
        module_cache=f"{made[1].name}.{made[0]} ({_where(made[1], made[2])})" if made else None,
    ), config_class


def _config_of(cls: _Class, init: ast.FunctionDef, first: str, classes: dict[str, _Class],
               defined: dict[str, tuple[str, ast.ClassDef]], imported: set[str]) -> tuple[str | None, str | None]:
    """The constructor's config parameter (its first, when annotated with a config class or named like a config)
    and the config class it takes; None for either it does not have."""
    arg = next(a for a in [*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs] if a.arg == first)
    annotated = _annotation_name(arg.annotation)
    if annotated and (annotated in defined or annotated in imported) and annotated not in classes:
        return first, annotated
    if _CONFIG_PARAM.search(first):
        return first, _unnamed_config_class(cls, classes, defined, imported)
    return None, None


def _unnamed_config_class(cls: _Class, classes: dict[str, _Class], defined: dict[str, tuple[str, ast.ClassDef]],
                          imported: set[str]) -> str | None:
    """The constructor takes a config object it does not name: the file's config-like class, if any (one named
    like a config first, then a dataclass), else an imported one named like a config."""
    local = _local_config_classes(cls.file, classes, defined)
    named = [n for n in local if _CONFIG_CLASS.search(n)]
    outside = sorted(n for n in imported if _CONFIG_CLASS.search(n) and n not in defined)
    choice = named or local or outside
    return choice[0] if choice else None


def _local_config_classes(file: str, classes: dict[str, _Class],
                          defined: dict[str, tuple[str, ast.ClassDef]]) -> list[str]:
    """The classes of `file` that are not modules and can hold a model's config."""
    return [n for n, (f, node) in defined.items() if f == file and n not in classes and _config_like(n, node)]


def _config_like(name: str, node: ast.ClassDef) -> bool:
    """A class that can hold a model's config: named like one, or a dataclass that is not a model's output."""
    return bool(_CONFIG_CLASS.search(name)) or (_is_dataclass(node) and not name.endswith("Output"))


def _config_shape(config_class: str | None, defined: dict[str, tuple[str, ast.ClassDef]],
                  ) -> tuple[str | None, str | None, tuple[Param, ...]]:
    """Where the config class is defined, how it takes its fields, and its fields (none known for a library's)."""
    if config_class in defined:
        config_file, node = defined[config_class]
        return (config_file, *_config_fields(node))
    if config_class is not None:
        return None, "kwargs", ()  # a library config class (transformers' PretrainedConfig takes keywords)
    return None, None, ()


# ---- What `graphmode init` writes: the template's context (templates/harness.py.j2) ----

TODO = "# TODO(graphmode):"
_SEQ_NAMES = frozenset({"max_seq_len", "max_seq_length", "block_size", "max_position_embeddings", "n_positions",
                        "context_length", "n_ctx", "seq_len", "max_len", "max_length", "max_positions",
                        "decoder_max_seq_len", "max_sequence_length"})
_BATCH_NAMES = frozenset({"max_batch_size", "max_batch", "batch_size", "bsz", "max_bs"})
# Size fields by kind: the tiny value a check needs, and the largest default still small enough to keep.
_SIZES: tuple[tuple[frozenset[str], int, int], ...] = (
    (frozenset({"vocab_size", "n_vocab", "vocab", "num_tokens", "padded_vocab_size", "ntoken", "n_token"}), 128, 50000),
    (frozenset({"dim", "hidden_size", "n_embd", "n_embed", "d_model", "embed_dim", "emb_dim", "model_dim"}), 64, 512),
    (frozenset({"intermediate_size", "ffn_dim", "ffn_hidden_size", "hidden_dim", "d_ff", "n_inner",
                "intermediate_dim"}), 128, 2048),
    (frozenset({"n_layers", "n_layer", "num_layers", "num_hidden_layers", "depth", "num_blocks"}), 2, 4),
    (frozenset({"n_heads", "n_head", "num_heads", "num_attention_heads", "heads", "nhead"}), 4, 8),
    (frozenset({"n_kv_heads", "num_key_value_heads", "n_local_heads", "n_kv_head", "n_query_groups",
                "num_kv_heads"}), 4, 8),
)
_VOCAB_NAMES = _SIZES[0][0]


def _size_kind(name: str) -> tuple[int, int] | None:
    return next(((tiny, largest) for names, tiny, largest in _SIZES if name in names), None)


def _int_literal(text: str | None) -> int | None:
    try:
        value = ast.literal_eval(text) if text is not None else None
    except (ValueError, SyntaxError):
        return None
    return value if type(value) is int else None


def _config_entry(field_: Param) -> tuple[str, str, str | None] | None:
    """One CONFIG entry (name, value source, TODO text or None), or None to leave the field at its default."""
    name = field_.name
    if name in _SEQ_NAMES:
        return name, "MAX_SEQ_LEN", None
    if name in _BATCH_NAMES:
        return name, "1", None
    size = _size_kind(name)
    if size is not None:
        return _size_entry(field_, *size)
    if field_.default is None:
        return name, "None", f"set {name} (required, and graphmode cannot guess it)"
    return None


def _size_entry(field_: Param, tiny: int, largest: int) -> tuple[str, str, str | None] | None:
    """The CONFIG entry of a size field: tiny when its default is missing or full-size; a vocabulary size is always
    written, since make_prompt reads it."""
    name = field_.name
    default = _int_literal(field_.default)
    if field_.default is None or (name in _VOCAB_NAMES and (default is None or default <= 0)):
        return name, str(tiny), f"a tiny {name} for the check (a guess: {name} has no usable default)"
    if default is not None and default > largest:
        return name, str(tiny), f"a tiny {name} for the check (the default, {default}, is full-size)"
    if name in _VOCAB_NAMES:
        return name, str(default if default is not None else field_.default), None  # make_prompt reads it
    return None


def _pass_after_tokens(params: tuple[Param, ...], name: str, value: str) -> tuple[str, bool]:
    """How to pass `name` after the tokens: positionally when it is forward's second parameter, else by keyword
    (positionally when forward lacks it, for a convention the user named). The flag: forward has it."""
    names = [p.name for p in params]
    if name not in names:
        return value, False
    index = names.index(name)
    return (value if index == 1 and params[index].positional else f"{name}={value}"), True


def _hf_args(params: tuple[Param, ...], tokens: str, cache: str, pos: str) -> list[str]:
    """Keyword arguments, in forward's order, for the parameters of the Hugging Face convention it has."""
    if not params:
        return [f"input_ids={tokens}"]
    values = {"past_key_values": cache, "start_pos": pos, "position_ids": "positions.unsqueeze(0)",
              "cache_position": "positions", "use_cache": "True", params[0].name: tokens}
    return [f"{p.name}={values[p.name]}" for p in params if p.name in values]


def _call_lines(args: list[str], indent: int = 4, width: int = 116) -> list[str]:
    """`out = model(args)` as lines of the function body: one line when it fits, else one argument a line."""
    line = f"out = model({', '.join(args)})"
    if indent + len(line) <= width:
        return [line]
    return ["out = model(", *(f"    {a}," for a in args), ")"]


def _setup_args(params: tuple[Param, ...]) -> tuple[str, list[str]]:
    """setup_caches' arguments (batch 1, MAX_SEQ_LEN positions, float32 as build_model makes the model; the rest at
    their defaults), and the required ones graphmode cannot fill."""
    args, unknown = [], []
    for p in params:
        if p.name in _BATCH_NAMES:
            args.append(f"{p.name}=1")
        elif p.name in _SEQ_NAMES or p.name.endswith(("max_seq_len", "max_seq_length")):
            args.append(f"{p.name}=MAX_SEQ_LEN")
        elif p.default is not None:
            continue
        elif p.name == "dtype":
            args.append("dtype=torch.float32")
        elif p.name == "device":
            args.append('device="cpu"')
        else:
            args.append(f"{p.name}=None")
            unknown.append(p.name)
    return ", ".join(args), unknown


def _construction_from_config(d: Detection) -> tuple[list[str], list[tuple[str, str, str | None]], list[str]]:
    """_construction for a model built from a config class: the config from CONFIG, then the model from it."""
    facts = d.facts
    entries = [e for e in map(_config_entry, facts.config_fields) if e is not None]
    notes = [] if facts.config_file is not None else [
        f"{TODO} tiny sizes for {d.config_class} (vocabulary, hidden size, layers, heads, positions): its "
        "fields are not defined in these files"]
    if facts.config_style == "attributes":
        build = [f"config = {d.config_class}()",
                 "for name, value in CONFIG.items():  # the config keeps its sizes as class attributes",
                 "    setattr(config, name, value)"]
    else:
        build = [f"config = {d.config_class}(**CONFIG)"]
    others = [p.name for p in facts.init_params[1:] if p.default is None]
    build.append(f"model = {d.model_class}(config{''.join(f', {n}=None' for n in others)})")
    if others:
        build[-1] += f"  {TODO} pass {', '.join(others)} (required by {d.model_class}.__init__)"
    return build, entries, notes


def _construction(d: Detection) -> tuple[list[str], list[tuple[str, str, str | None]], list[str]]:
    """build_model()'s lines that construct the model, the CONFIG entries they read, and TODO lines for above
    CONFIG."""
    facts = d.facts
    if d.config_class is not None:
        return _construction_from_config(d)
    if facts.config_param is not None:
        return [f"config = None  {TODO} the {facts.config_param} object {d.model_class}.__init__ takes (no config "
                f"class found in {d.file})", f"model = {d.model_class}(config)"], [], []
    entries = [e for e in map(_config_entry, facts.init_params) if e is not None]
    return [f"model = {d.model_class}(**CONFIG)" if entries else f"model = {d.model_class}()"], entries, []


def _imports(d: Detection) -> dict[str, list[str]]:
    """The harness's imports: the model class from its file, and the config class from its own."""
    module = Path(d.file).stem
    imports: dict[str, list[str]] = {module: [d.model_class]}
    if d.config_class is not None:
        config_file = d.facts.config_file
        imports.setdefault(Path(config_file).stem if config_file else module, []).append(d.config_class)
    return imports


def _seq_len_notes(d: Detection, entries: list[tuple[str, str, str | None]]) -> list[str]:
    """A start_pos model sizes its caches from its config: a TODO when no config field sets MAX_SEQ_LEN."""
    if d.convention != "start_pos" or d.config_class is None or d.facts.config_file is None:
        return []
    if any(n in _SEQ_NAMES for n, _, _ in entries):
        return []
    return [f"{TODO} make the model's caches hold MAX_SEQ_LEN positions (no max_seq_len field found)"]


def _call_args(d: Detection) -> tuple[list[str], list[str], list[str]]:
    """prefill's and decode's model() arguments under the convention, and TODO lines for what graphmode could not
    pass."""
    build = _CALL_ARGS.get(d.convention)
    return build(d) if build is not None else ([], [], [])


def _hf_call_args(d: Detection) -> tuple[list[str], list[str], list[str]]:
    """Hugging Face style: the cache and the positions by keyword, as forward names them."""
    params, names = d.forward_params, d.param_names
    prefill_args = _hf_args(params, "tokens", "None", "0")
    decode_args = _hf_args(params, "token", 'state["past_key_values"]', 'state["pos"]')
    if "past_key_values" in names or "cache_position" in names:
        return prefill_args, decode_args, []
    return prefill_args, decode_args, [f"{TODO} {d.model_class}.forward takes neither past_key_values nor "
                                       "cache_position: pass its cache and positions the way it expects"]


def _start_pos_call_args(d: Detection) -> tuple[list[str], list[str], list[str]]:
    """The tokens and the start position (0 for prefill, the step's position for decode)."""
    prefill_pos, found = _pass_after_tokens(d.forward_params, "start_pos", "0")
    decode_pos, _ = _pass_after_tokens(d.forward_params, "start_pos", 'state["pos"]')
    todo = [] if found else [f"{TODO} {d.model_class}.forward has no start_pos: pass the start position its way"]
    return ["tokens", prefill_pos], ["token", decode_pos], todo


def _input_pos_call_args(d: Detection) -> tuple[list[str], list[str], list[str]]:
    """gpt-fast style: the tokens and their positions; a mask parameter is the person's to fill."""
    passed, found = _pass_after_tokens(d.forward_params, "input_pos", "input_pos")
    todo = [] if found else [f"{TODO} {d.model_class}.forward has no input_pos: pass the positions its way"]
    if "mask" in d.param_names:
        todo.append(f"{TODO} forward also takes mask: torchtune-style models need the causal mask's rows at "
                    "input_pos here")
    return ["tokens", passed], ["token", passed], todo


_CALL_ARGS = {"hf": _hf_call_args, "start_pos": _start_pos_call_args, "input_pos": _input_pos_call_args}


def _setup_line(d: Detection) -> str:
    """The setup_caches call an input_pos model needs before prefill, or a TODO when it has none."""
    if d.facts.setup_caches is None:
        return (f"{TODO} {d.model_class} has no setup_caches method: make its caches for batch 1 and MAX_SEQ_LEN "
                "positions here")
    args, unknown = _setup_args(d.facts.setup_caches)
    setup = f"model.setup_caches({args})"
    if unknown:
        setup += f"  {TODO} set {', '.join(unknown)} (required, and graphmode cannot guess them)"
    return setup


def harness_context(target: str, detection: Detection, max_seq_len: int = 64, prompt_len: int = 8) -> dict:
    """Everything templates/harness.py.j2 fills in, as source text; lines a person must check carry the TODO
    marker."""
    import textwrap

    d, facts = detection, detection.facts
    if d.model_class is None or d.file is None:
        raise ValueError("no model class to write a harness for")
    build, entries, notes = _construction(d)
    notes += _seq_len_notes(d, entries)
    vocab = next((n for n, _, _ in entries if n in _VOCAB_NAMES), None)
    names = list(d.param_names)
    prefill_args, decode_args, call_todo = _call_args(d)
    return {
        "target": target,
        "prefill_call": _call_lines(prefill_args),
        "decode_call": _call_lines(decode_args),
        "convention": d.convention,
        "named": d.named,
        "reason_lines": textwrap.wrap(d.reason.rstrip(".") + ".", 108, break_on_hyphens=False,
                                      break_long_words=False),
        "model_class": d.model_class,
        "imports": sorted(_imports(d).items()),
        "sources": list(facts.sources or (d.file,)),
        "max_seq_len": max_seq_len,
        "prompt_len": prompt_len,
        "config_notes": notes,
        "config_entries": entries,
        "define_config": any("CONFIG" in line for line in build),
        "build_lines": build,
        "vocab": vocab,
        "setup_caches": _setup_line(d) if d.convention == "input_pos" else "",
        "carries_cache": "past_key_values" in names,
        "positions": d.convention == "hf" and ("position_ids" in names or "cache_position" in names),
        "call_todo": call_todo,
        "todo": TODO,
    }
