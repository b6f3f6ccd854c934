"""Driving a transformers causal LM the two ways graphmode compares, with no source rewritten.

The harness that `graphmode adapt --hf` writes builds the model and wraps it in `StaticCacheDecoder`:

- `forward(**kwargs)` is the model's own call, so the harness's prefill/decode run the original way: a dynamic
  cache that grows every step (what `generate()` does by default). This is the eager baseline.
- `prefill(tokens, input_pos)` / `decode(tokens, input_pos)` are graphmode's entry contract, on transformers' own
  static-cache path: one `StaticCache` allocated for the longest sequence, written in place, the positions passed
  as a tensor. Verify compiles `decode` alone, as for any adapted model.

transformers renamed its arguments between releases (`past_key_values` became `cache`; `cache_position` was
dropped when StaticCache began counting its own length), so the names are read from `forward`'s signature of the
release installed, never assumed.
"""
from __future__ import annotations

import inspect
import math
import typing

import torch

# The --tiny model: small enough for a CPU run in seconds, large enough to have grouped KV heads and two layers.
TINY_SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=256)


def forward_parameters(model: torch.nn.Module) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def cache_argument(model: torch.nn.Module) -> str:
    """The keyword this transformers release (or this remote code) takes the cache object by."""
    if isinstance(model, StaticCacheDecoder):
        return model.cache_argument
    names = forward_parameters(model)
    return "cache" if "cache" in names and "past_key_values" not in names else "past_key_values"


def has_static_cache_path(model: type | torch.nn.Module) -> str | None:
    """None when the model (class) can run on transformers' StaticCache, else why not (one line)."""
    import transformers

    if not hasattr(transformers, "StaticCache"):
        return "the installed transformers has no StaticCache (it arrived in 4.38)"
    # 4.38-4.5x mark the models whose attention writes a static cache; 5.x gives every Cache-based model the path.
    if getattr(model, "_supports_static_cache", True) is False:
        return f"{_name(model)} declares _supports_static_cache = False in this transformers release"
    return None


def layers_without_static_kind(config) -> str | None:
    """None when transformers' StaticCache has a layer for every layer type the config names, else which types it
    lacks, in one line. DeepSeek-V4's compressed attention layers, say: StaticCache cannot even be built for them."""
    from transformers import cache_utils

    mapping = getattr(cache_utils, "STATIC_LAYER_TYPE_MAPPING", None)
    layer_types = getattr(cache_utils, "get_layer_types_and_kwargs", None)
    if mapping is None or layer_types is None:  # releases before 5.x: one kind of static layer, built for any model
        return None
    try:
        kinds = layer_types(config.get_text_config(decoder=True))[0]
    except (AttributeError, TypeError, ValueError):  # a config whose defaults are incomplete (BLT): its build says why
        return None
    lacking = [kind for kind in dict.fromkeys(kinds) if kind not in mapping]
    if not lacking:
        return None
    return (f"its {', '.join(map(repr, lacking))} layers have no kind of layer in this transformers' StaticCache "
            f"(which holds {', '.join(sorted(mapping))})")


def declared_not_compilable(model: type | torch.nn.Module) -> str | None:
    """5.x keeps `_can_compile_fullgraph = False` for the models its authors do not expect to compile whole: a
    guess, not a refusal (Aria's text model compiles to one graph on the static path), so graphmode runs the path
    and counts what breaks. The flag's own words, or None."""
    if getattr(model, "_can_compile_fullgraph", True) is False and not hasattr(model, "_supports_static_cache"):
        return f"{_name(model)} declares _can_compile_fullgraph = False in this transformers release"
    return None


def takes_no_cache(model: type | torch.nn.Module) -> str | None:
    """None when the model's forward takes a transformers Cache (under past_key_values or cache), else what it
    carries between steps instead, in one line: XLNet's `mems` (past hidden states), RWKV's `state`, Reformer's
    buckets, xLSTM's cache of its own class, or nothing at all (GPT-1 recomputes the sequence), none of which
    StaticCache holds."""
    forward = model.forward
    parameters = inspect.signature(forward).parameters
    name = next((name for name in ("past_key_values", "cache") if name in parameters), None)
    if name is None:
        return f"{_name(model)}'s forward takes no cache (no past_key_values argument): it {_carried(parameters)}"
    return _state_class_of_its_own(model, forward, name) or _cache_class_of_its_own(model)


def _carried(parameters) -> str:
    """What a forward without a cache argument carries between steps, said from its parameters' names."""
    carried = [p for p in parameters if any(word in p for word in ("mem", "state", "past"))
               and not p.startswith(("output_", "use_"))]
    return f"takes {', '.join(f'`{p}`' for p in carried)} instead" if carried else "keeps nothing between steps"


def _state_class_of_its_own(model: type | torch.nn.Module, forward, name: str) -> str | None:
    """takes_no_cache's answer where the cache argument `name` is annotated with classes none of which is a
    transformers Cache (xLSTM's xLSTMCache)."""
    from transformers.cache_utils import Cache

    try:
        hints = typing.get_type_hints(forward)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: the run says what fails
        return None
    classes = [c for c in typing.get_args(hints.get(name)) or (hints.get(name),) if isinstance(c, type)]
    own = [c for c in classes if c is not type(None) and not issubclass(c, Cache)]
    if own and not any(issubclass(c, Cache) for c in classes if c is not type(None)):
        return (f"{_name(model)} keeps its state in {own[0].__name__}, a class of its own that is not a transformers "
                "Cache")
    return None


def _cache_class_of_its_own(model: type | torch.nn.Module) -> str | None:
    """takes_no_cache's answer for a model on transformers' own list of models that take no standard cache (MiniMax's
    MiniMaxCache, a DynamicCache whose code refuses any other cache object)."""
    from transformers.cache_utils import Cache

    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if not callable(supports) or supports():
        return None
    import sys

    module = sys.modules.get(model.__module__)
    caches = [value.__name__ for value in vars(module).values() if isinstance(value, type)
              and issubclass(value, Cache) and value.__module__ == model.__module__] if module else []
    what = f"its own {caches[0]}" if caches else "a cache of its own"
    return f"{_name(model)} takes {what} alone (transformers' generate() makes it no standard cache)"


def _name(model: type | torch.nn.Module) -> str:
    return model.__name__ if isinstance(model, type) else type(model).__name__


class StaticCacheDecoder(torch.nn.Module):
    """A transformers causal LM with graphmode's prefill/decode entries on its own static-cache path."""

    def __init__(self, model: torch.nn.Module, max_seq_len: int) -> None:
        super().__init__()
        self.model = model
        self.max_seq_len = max_seq_len
        self.cache_argument = cache_argument(model)
        names = forward_parameters(model)
        # Releases before 5.0 index the static cache by cache_position; later ones count the length themselves.
        self.takes_cache_position = "cache_position" in names
        self.takes_position_ids = "position_ids" in names
        self._static_cache = None

    @property
    def config(self):
        return self.model.config

    def forward(self, *args, **kwargs):
        """The model's own call: the original convention, untouched."""
        return self.model(*args, **kwargs)

    def generate(self, *args, **kwargs):
        """The model's own `generate()`, untouched (its dynamic cache, every strategy)."""
        return self.model.generate(*args, **kwargs)

    def _new_static_cache(self, batch: int):
        from transformers import StaticCache

        parameters = inspect.signature(StaticCache.__init__).parameters
        kwargs = {"config": self.model.config, "max_cache_len": self.max_seq_len}
        # 4.4x take the batch and dtype up front; 5.x size the cache at its first write.
        if "max_batch_size" in parameters:
            kwargs["max_batch_size"] = batch
        elif "batch_size" in parameters:
            kwargs["batch_size"] = batch
        if "dtype" in parameters:
            kwargs["dtype"] = next(self.model.parameters()).dtype
        if "device" in parameters:
            kwargs["device"] = next(self.model.parameters()).device
        return _without_ring_layers(StaticCache(**kwargs), self.max_seq_len)

    def _run(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        kwargs = {"input_ids": tokens, self.cache_argument: self._static_cache, "use_cache": True}
        if self.takes_position_ids:
            kwargs["position_ids"] = input_pos.unsqueeze(0).expand(tokens.shape[0], -1)
        if self.takes_cache_position:
            kwargs["cache_position"] = input_pos
        return self.model(**kwargs).logits

    def setup_caches(self, max_batch_size: int = 1, max_seq_length: int | None = None) -> None:
        """The sizing call of graphmode's entries: the static cache of every later Prefill holds `max_seq_length`
        positions (by default the config's `max_position_embeddings`); the batch is each prompt's own."""
        limit = getattr(self.model.config, "max_position_embeddings", None)
        length = max_seq_length if max_seq_length is not None else limit
        if length is None or length < 1 or (limit is not None and length > limit):
            raise ValueError(f"setup_caches(max_seq_length={max_seq_length}): the static path serves 1 to "
                             f"{limit} positions (config.max_position_embeddings)")
        self.max_seq_len = length

    def prefill(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """The prompt, eagerly, into a fresh static cache (a new one per prompt: a reset would keep the old
        batch size)."""
        last = int(input_pos.max()) + 1
        if last > self.max_seq_len:
            raise ValueError(f"the static path is set up for {self.max_seq_len} positions, and this Prefill needs "
                             f"{last}; call `setup_caches(max_seq_length={last})` (or larger) first, or call "
                             "`forward`, which has no such limit")
        self._static_cache = self._new_static_cache(tokens.shape[0])
        return self._run(tokens, input_pos)

    def decode(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """One new token per sequence, written into the static cache at `input_pos`."""
        return self._run(tokens, input_pos)


def _without_ring_layers(cache, max_cache_len: int):
    """The cache with every sliding-window (or chunked) layer a full static layer of `max_cache_len` positions.

    transformers 5's sliding layer keeps its window as a ring and its length as a Python int that the mask sizes are
    read from (`get_mask_sizes`), so a compiled Decode recompiles at every step. A full layer holds every position
    and its mask sizes are fixed; the model's own sliding-window (or chunked) mask, computed from the positions,
    still hides what the window leaves out, so attention sees exactly what it saw. Older releases' caches have no
    layers, and are returned as they are."""
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list):
        return cache
    from transformers import cache_utils
    from transformers.cache_utils import StaticLayer

    # A layer that holds linear-attention state beside its sliding window (Inkling's "hybrid_sliding") becomes its
    # full-attention counterpart, with as many states.
    hybrid_full = getattr(cache_utils, "LinearAttentionAndStaticFullAttentionLayer", None)
    for index, layer in enumerate(layers):
        if type(layer).__name__ == "StaticSlidingWindowLayer":
            layers[index] = StaticLayer(max_cache_len=max_cache_len)
        elif type(layer).__name__ == "LinearAttentionAndStaticSlidingWindowAttentionLayer" and hybrid_full:
            states = getattr(layer, "number_of_states", None)
            layers[index] = hybrid_full(max_cache_len=max_cache_len,
                                        **({"number_of_states": states} if isinstance(states, int) else {}))
        else:
            continue
        # Still a sliding layer to the mask code, which sizes the sliding-window mask from the first layer that says
        # it is one, else from layer 0: in a hybrid stack (RecurrentGemma) layer 0 holds recurrent state, whose
        # length is 0, and the mask would let each query see position 0 alone.
        layers[index].is_sliding = True
    return cache


def tiny_config_overrides(config_class, sizes: dict[str, int] | None = None,
                          values: dict | None = None, default=None) -> dict[str, int]:
    """The --tiny sizes under the names `config_class` uses (GPT-2's n_embd, OPT's ffn_dim, ...), only for the
    sizes the config has; head sizes follow the hidden size so a config with a fixed head_dim stays consistent.
    Expert and MLA sizes shrink too (tiny_moe_mla_overrides), read from `values` (a config.json) over the class's
    defaults. `default`: the config the sizes replace, where it is not the class's own (a composite config's part,
    built with its parent's values)."""
    sizes = dict(TINY_SIZES if sizes is None else sizes)
    default = config_class() if default is None else default
    aliases = getattr(config_class, "attribute_map", {}) or {}

    def has(name: str) -> bool:
        return name in aliases or _global_value(default, name, has) is not has

    overrides: dict[str, int] = {aliases.get(name, name): value for name, value in sizes.items() if has(name)}
    hidden, heads = sizes["hidden_size"], sizes["num_attention_heads"]
    overrides.update(_tiny_head_overrides(config_class, default, hidden // heads))
    _set_tiny_ffn(overrides, default, aliases, sizes["intermediate_size"])
    expand, mamba_heads = _global_value(default, "expand"), _global_value(default, "num_heads")
    if isinstance(expand, int) and isinstance(mamba_heads, int) and isinstance(overrides.get("head_dim"), int) \
            and "num_heads" not in overrides:
        # Mamba-2's heads tile its inner width (num_heads * head_dim == hidden_size * expand, which its config checks),
        # and its groups divide the heads
        overrides["num_heads"] = hidden * expand // overrides["head_dim"]
        groups = _global_value(default, "n_groups")
        if isinstance(groups, int) and overrides["num_heads"] % groups:
            overrides["n_groups"] = 1
    if has("word_embed_proj_dim"):  # OPT projects embeddings when this differs from the hidden size
        overrides["word_embed_proj_dim"] = hidden
    if has("tie_word_embeddings"):
        # A tiny model whose head is its embedding repeats one token forever (the residual keeps the input
        # embedding, which scores highest against itself), and identical tokens would then prove nothing.
        overrides["tie_word_embeddings"] = False
    overrides.update(_tiny_token_id_overrides(default, sizes["vocab_size"]))
    overrides.update(_tiny_layer_pattern(default, sizes["num_hidden_layers"]))
    overrides.update(_tiny_per_layer_config(default, sizes["num_hidden_layers"]))
    overrides.update(tiny_moe_mla_overrides({**default.to_dict(), **(values or {})}, sizes["num_hidden_layers"]))
    if "kv_lora_rank" in overrides and has("num_key_value_heads"):
        # MLA expands its latent into keys and values for every head: as many key/value heads as heads.
        overrides[aliases.get("num_key_value_heads", "num_key_value_heads")] = heads
    overrides.update(_tiny_open_fields({**default.to_dict(), **(values or {})}, sizes))
    overrides.update(_tiny_sub_config_overrides(default, sizes, values or {}))
    overrides.update(_tiny_layer_kinds(config_class, default, overrides, sizes["num_hidden_layers"]))
    overrides.update(_tiny_shared_kv_layers(config_class, default, overrides, sizes["num_hidden_layers"]))
    return overrides


# Qwen4-Exp's QSA indexer, which its attention layers build whether or not the config sets it: 4 query heads and the
# one key head the config requires, heads of the tiny head size (the rotary part must fit in them), and a budget of
# 4 blocks of 4 tokens, so a 64-token cache holds more than the budget and the selection is exercised.
TINY_QSA_INDEXER = {"indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 16,
                    "indexer_compress_ratio": 4}


def _tiny_open_fields(values: dict, sizes: dict[str, int]) -> dict:
    """Fields the class leaves open (its checkpoints set them) that its model cannot be built without, and the
    per-layer input embeddings' sizes (Gemma 3n, Gemma 4), a table of vocab_size_per_layer_input rows that at full
    size outweighs the tiny model a thousand times. `values`: the config's values."""
    return {**_tiny_open_stack_fields(values, sizes), **_tiny_open_attention_fields(values, sizes),
            **_tiny_part_widths(values, sizes)}


def _tiny_open_stack_fields(values: dict, sizes: dict[str, int]) -> dict:
    """_tiny_open_fields' part for the layer stack: the kinds of layer and what each kind reads."""
    overrides: dict = {}
    layer_types = values.get("layer_types")
    if values.get("rope_parameters") == {} and isinstance(layer_types, list) and layer_types:
        # Cohere Compass reads rope_parameters[layer_type] for every kind of layer, and its class defaults to {}.
        overrides["rope_parameters"] = {kind: {"rope_type": "default", "rope_theta": 10000.0}
                                        for kind in dict.fromkeys(layer_types)}
    if all(name in values and values[name] is None for name in TINY_QSA_INDEXER) \
            and "indexed_attention" in (layer_types or []):
        overrides.update(TINY_QSA_INDEXER)
    if values.get("layer_types") is None and "layer_types" in values and isinstance(values.get("conv_L_cache"), int):
        # LFM2-MoE's class leaves its stack to the checkpoint (short convolutions with an attention layer every few),
        # and its layers read config.layer_types[i]: the tiny stack is LFM2's kinds, the attention layer last.
        overrides["layer_types"] = ["conv"] * (sizes["num_hidden_layers"] - 1) + ["full_attention"]
    return overrides


def _tiny_open_attention_fields(values: dict, sizes: dict[str, int]) -> dict:
    """_tiny_open_fields' part for attention: Kolibri's indexer heads, DBRX's rope and clamp."""
    overrides: dict = {}
    heads, kv_heads = sizes["num_attention_heads"], sizes["num_key_value_heads"]
    if isinstance(values.get("index_num_heads"), int) and isinstance(values.get("num_key_value_heads"), int):
        # Kolibri's indexer heads come from the query heads of key head 0: no more than the tiny group holds.
        overrides["index_num_heads"] = max(1, min(values["index_num_heads"], heads // kv_heads))
    if "kv_n_heads" in values and values.get("clip_qkv") is None and "rope_theta" not in values:
        # DBRX's attention reads attn_config.rope_theta and clamps to attn_config.clip_qkv, which its class no longer
        # defines or leaves None (clamp(None, None) fails): DBRX's checkpoints' values
        overrides.update({"clip_qkv": 8.0, "rope_theta": 500000.0})
    return overrides


def _tiny_part_widths(values: dict, sizes: dict[str, int]) -> dict:
    """_tiny_open_fields' part for widths that follow the tiny sizes: adapters, vocabularies, per-layer inputs."""
    overrides: dict = {}
    for name in ("adapter_in_dim", "adapter_out_dim", "adapter_input_size", "adapter_output_size"):
        # dots.ocr 3's vision and audio adapters map the part's hidden width onto the text model's (its config
        # checks the one against the other): both are the tiny hidden size
        if isinstance(values.get(name), int):
            overrides[name] = sizes["hidden_size"]
    if isinstance(values.get("unpadded_vocab_size"), int):
        overrides["unpadded_vocab_size"] = sizes["vocab_size"]  # Inkling's LM head: the vocabulary before padding
    if isinstance(values.get("vocab_size_per_layer_input"), int):
        overrides["vocab_size_per_layer_input"] = sizes["vocab_size"]
    if isinstance(values.get("hidden_size_per_layer_input"), int) and values["hidden_size_per_layer_input"] > 0:
        overrides["hidden_size_per_layer_input"] = sizes["hidden_size"] // sizes["num_attention_heads"]
    return overrides


def _tiny_shared_kv_layers(config_class, default, overrides: dict, layers: int) -> dict:
    """Gemma 3n's last num_kv_shared_layers layers (15 of 35) reuse the keys and values of the last earlier layer
    of their kind, and its config refuses a stack where a kind has no such layer: the tiny stack shares its last
    layer where the kinds allow, else none."""
    shared = _global_value(default, "num_kv_shared_layers")
    if not isinstance(shared, int) or shared <= 0:
        return {}
    for count in range(min(shared, layers - 1), -1, -1):
        try:
            _global_value(config_class(**overrides, num_kv_shared_layers=count), "kv_sharing_modes")
        except Exception:  # noqa: BLE001 - a kind with no layer to share from: fewer shared layers
            continue
        return {"num_kv_shared_layers": count}
    return {}


def _tiny_layer_kinds(config_class, default, overrides: dict, layers: int) -> dict:
    """A hybrid stack (Ling's, Qwen3-Next's, Jamba's: linear-attention or Mamba layers with an attention layer every
    few) cut to its first `layers` layers keeps only its recurrent ones, and with no attention layer left the model's
    own mask code fails (`get_mask_sizes` can only be called on Attention layers): the tiny stack then keeps one layer
    of each kind, the attention layer last. (Zamba's config refuses the cut pattern outright: the same.) A class
    whose defaults hold recurrent layers only while its model builds an attention mask (Bamba, Granite 4.0-H: their
    checkpoints name the attention layers) gets an attention layer too. The pattern is set through whichever field
    the class derives it from: its layer_types, attn_layer_indices, or attn_layer_period and attn_layer_offset."""
    full = _global_value(default, "layer_types")
    if not isinstance(full, (list, tuple)) or not full:
        return {}
    kinds = list(dict.fromkeys(full))
    if kinds == ["linear_attention"] and _model_builds_causal_mask(config_class):
        kinds.append("full_attention")
    if len(kinds) < 2 or len(kinds) > layers:
        return {}
    pattern = [kinds[0]] * (layers - len(kinds)) + kinds
    built = _layer_types(config_class, overrides)
    if built is not None and (_attends(built) or not _attends(kinds)):
        return {}  # (a stack of sliding-window layers keeps its own first layers: its cache is an attention cache)
    aliases = getattr(config_class, "attribute_map", {}) or {}
    candidates = [{aliases.get("layer_types", "layer_types"): pattern}]
    if "full_attention" in pattern:
        attention = [i for i, kind in enumerate(pattern) if kind == "full_attention"]
        candidates += [{"attn_layer_indices": attention},
                       {"attn_layer_period": layers, "attn_layer_offset": attention[0]}]
    # A list of the kinds under names of the class's own, which layer_types is derived from (RecurrentGemma's
    # block_types, ["recurrent", "recurrent", "attention"] repeated): the same pattern in those names.
    for name, value in default.to_dict().items():
        own = list(dict.fromkeys(value)) if isinstance(value, list) and all(isinstance(v, str) for v in value) else []
        if name != "layer_types" and len(own) == len(kinds):
            candidates.append({name: [own[0]] * (layers - len(own)) + own})
    for candidate in candidates:
        if all(_global_value(default, name, candidate) is not candidate for name in candidate) \
                and _layer_types(config_class, {**overrides, **candidate}) == pattern:
            return candidate
    return {}


def _attends(kinds) -> bool:
    """Some layer of these kinds keeps keys and values (full, sliding, chunked attention; Zamba's hybrid layers)."""
    return any(("attention" in kind or "hybrid" in kind) and kind != "linear_attention" for kind in kinds)


def _layer_types(config_class, overrides: dict) -> list | None:
    """The layer kinds of `config_class(**overrides)`; None where that config does not build."""
    try:
        types = _global_value(config_class(**overrides), "layer_types")
    except Exception:  # noqa: BLE001 - a config that refuses these values: the pattern is left to the class
        return None
    return list(types) if isinstance(types, (list, tuple)) else None


def _model_builds_causal_mask(config_class) -> bool:
    """The model code beside `config_class` (transformers' models/NAME/modeling_NAME.py) builds an attention mask
    from its cache, which needs an attention layer in it."""
    import importlib

    module = config_class.__module__.replace(".configuration_", ".modeling_")
    try:
        source = inspect.getsource(importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return False
    return "create_causal_mask(" in source


def _tiny_sub_config_overrides(default, sizes: dict[str, int], values: dict) -> dict[str, dict]:
    """A composite config keeps each part's config in a field of its own (Gemma 3's text_config and vision_config,
    BLT's patcher and encoder, DBRX's ffn_config): each part is shrunk the same way, or a 64-wide text model keeps a
    full-size vision tower and the build runs out of memory. `values`: config.json's values, whose part of each
    field is read as that part's config."""
    from transformers import PretrainedConfig

    overrides = {}
    for name, part in vars(default).items():
        if isinstance(part, PretrainedConfig):
            given = values.get(name) if isinstance(values.get(name), dict) else None
            part_overrides = tiny_config_overrides(type(part), sizes, values=given, default=part)
            if part_overrides:
                overrides[name] = part_overrides
    return overrides


def _tiny_head_overrides(config_class, default, head: int) -> dict[str, int]:
    """The head size fields the config has, set to the tiny head (`head`: hidden size // heads), and a rotary part
    (GPT-J, CodeGen) no larger than it."""
    overrides = {}
    for name in ("head_dim", "attention_head_dim"):
        # Falcon derives head_dim in a read-only property: it follows by itself. A head_dim left None is set too:
        # some models read it as it is (HunYuan's `self.head_dim**-0.5`).
        value = _global_value(default, name, 0)
        if (value is None or (isinstance(value, int) and value > 0)) \
                and not isinstance(getattr(config_class, name, None), property):
            overrides[name] = head
    if isinstance(getattr(default, "rotary_dim", None), int):
        overrides["rotary_dim"] = min(default.rotary_dim, head)
    return overrides


def _global_value(config, name: str, missing=None):
    """The config's value for `name`, or where some layers set their own (transformers' per_layer_config, Gemma 4's
    wider full-attention heads) and reading the global value raises, the class's global one."""
    try:
        return getattr(config, name, missing)
    except RuntimeError:  # AmbiguousGlobalPerLayerAttributeError
        return config.__dict__.get(name, missing)


def _tiny_per_layer_config(default, layers: int) -> dict:
    """Per-layer settings (`per_layer_config`, keyed by layer index) kept for the layers a model of `layers` layers
    has; the config refuses an index beyond its layer count."""
    per_layer = default.to_dict().get("per_layer_config")
    if not isinstance(per_layer, dict) or not per_layer:
        return {}
    return {"per_layer_config": {key: value for key, value in per_layer.items() if int(key) < layers}}


def _set_tiny_ffn(overrides: dict[str, int], default, aliases: dict[str, str], width: int) -> None:
    """The feed-forward width under the other names it goes by, where no earlier name set it and the class does not
    default it to None (4 * hidden). A value that is not None is one the config has (directly or by its alias)."""
    for name in ("ffn_dim", "n_inner", "intermediate_size", "ffn_hidden_size"):
        key = aliases.get(name, name)
        if key not in overrides and _global_value(default, name) is not None:
            overrides[key] = width


def _tiny_layer_pattern(default, layers: int) -> dict:
    """GPT-Neo's per-layer attention kinds, `attention_types = [[["global", "local"], 12]]` (a pattern and its
    repeats), which its config checks against the layer count: the pattern repeated to cover `layers` layers."""
    types = getattr(default, "attention_types", None)
    if not (isinstance(types, list) and len(types) == 1 and isinstance(types[0], list) and len(types[0]) == 2
            and isinstance(types[0][0], list) and types[0][0] and layers % len(types[0][0]) == 0):
        return {}
    return {"attention_types": [[types[0][0], layers // len(types[0][0])]]}


def _tiny_token_id_overrides(default, vocab: int) -> dict[str, int]:
    """Special token ids the class's defaults put at or beyond the tiny vocabulary, moved to its last id (an
    embedding's padding_idx must exist)."""
    overrides = {}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        value = getattr(default, name, None)
        if isinstance(value, int) and value >= vocab:
            overrides[name] = vocab - 1
    return overrides


# --tiny for mixture-of-experts and MLA configs, under the names DeepSeek (V2/V3), Qwen-MoE, Mixtral and OLMoE use.
TINY_EXPERTS = 4
TINY_EXPERTS_PER_TOKEN = 2
TINY_MOE_SIZES = {"moe_intermediate_size": 32, "shared_expert_intermediate_size": 64}
# MLA: a compressed KV latent and a query rank, and per-head sizes whose rope and nope parts make the head of
# hidden_size // num_attention_heads (64 // 4 = 16) and a value head of the same size.
TINY_MLA_SIZES = {"kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                  "v_head_dim": 16}
_EXPERT_COUNTS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")


def tiny_moe_mla_overrides(values: dict, layers: int) -> dict:
    """The --tiny sizes for the expert and MLA fields a config has (`values`: the config's values, from config.json
    or the config class's defaults), for a model of `layers` layers that keeps at least one MoE layer.

    Which layers are MoE: DeepSeek makes layer i MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0,
    Qwen-MoE when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers. So the dense prefix keeps at
    most layers - 1 layers, the frequencies become 1 and mlp_only_layers drops the last layer. Group-limited
    routing (n_group, topk_group) stays consistent: the groups divide the experts and the chosen groups hold at
    least the experts each token picks. A field the config lacks, or leaves None (q_lora_rank in V2-Lite, no
    groups), is left as it is."""
    experts = next((name for name in _EXPERT_COUNTS if isinstance(values.get(name), int) and values[name] > 0), None)
    if experts is None and values.get("moe_intermediate_size") is not None:
        # A class that leaves its expert count to the checkpoint (dots.llm1's n_routed_experts defaults to None)
        # builds no model from its defaults: torch.empty(None, ...) fails in the experts' __init__.
        experts = next((name for name in _EXPERT_COUNTS if name in values and values[name] is None), None)
    overrides = _tiny_expert_overrides(values, experts, layers) if experts is not None else {}
    overrides.update(_tiny_mla_overrides(values))
    overrides.update(_tiny_layer_sections(values, layers))
    return overrides


def _tiny_expert_overrides(values: dict, experts: str, layers: int) -> dict:
    """tiny_moe_mla_overrides' expert part: TINY_EXPERTS experts (`experts`: the field that counts them), the
    layers' MoE pattern, and the expert groups."""
    overrides: dict = {experts: TINY_EXPERTS}

    def per_token(name: str) -> int:
        # A config that routes each token to fewer experts keeps its count (ZAYA's config accepts only 1).
        given = values.get(name)
        return min(given if isinstance(given, int) and given > 0 else TINY_EXPERTS_PER_TOKEN, TINY_EXPERTS_PER_TOKEN,
                   TINY_EXPERTS)

    if "num_experts_per_tok" in values:  # DeepSeek-V2's class leaves it None: its configs always set it
        overrides["num_experts_per_tok"] = per_token("num_experts_per_tok")
    for name in ("moe_k", "num_experts_per_token"):  # ERNIE 4.5's and Ling's names for it
        if isinstance(values.get(name), int):
            overrides[name] = per_token(name)
    for shared in ("n_shared_experts", "moe_num_shared_experts"):
        # (left None by the class with the expert count: the checkpoint sets both)
        if (isinstance(values.get(shared), int) and values[shared] > 0) or (shared in values and values[shared] is None
                                                                           and values.get(experts) is None):
            overrides[shared] = 1
    overrides.update({name: size for name, size in TINY_MOE_SIZES.items() if values.get(name) is not None})
    overrides.update(_tiny_moe_layers(values, layers))
    for groups in ("n_group", "num_expert_group"):  # (Ling's name for it)
        if isinstance(values.get(groups), int) and values[groups] > 1:
            overrides[groups] = 2
            # one chosen group holds TINY_EXPERTS / 2 experts: every token can still pick its experts there
            for per_token in ("num_experts_per_tok", "num_experts_per_token"):
                if per_token in values:
                    overrides[per_token] = min(overrides.get(per_token, TINY_EXPERTS_PER_TOKEN), TINY_EXPERTS // 2)
    if values.get("topk_group") is not None:
        overrides["topk_group"] = 1
    return overrides


def _tiny_moe_layers(values: dict, layers: int) -> dict:
    """The fields that say which layers are MoE, set so a model of `layers` layers keeps at least one (the last)."""
    overrides: dict = {}
    for name in ("first_k_dense_replace", "num_dense_layers"):  # (LFM2-MoE's name for the dense prefix)
        if isinstance(values.get(name), int):
            overrides[name] = min(values[name], layers - 1)
    for name in ("moe_layer_freq", "decoder_sparse_step"):
        if isinstance(values.get(name), int):
            overrides[name] = 1
    if isinstance(values.get("mlp_only_layers"), list):
        overrides["mlp_only_layers"] = [i for i in values["mlp_only_layers"] if i < layers - 1]
    return overrides


def _tiny_layer_sections(values: dict, layers: int) -> dict:
    """A stack in sections, input layers, recurrent layers run n_recurrent_loops times, output layers (Dory), whose
    config only checks that the three counts add up to the layer count: left at full size, the input and output
    sections would take -14 recurrent layers between them and run every layer twice. The tiny stack puts its first
    layers in the loop, so the loop and the cache copies it writes are exercised, and its last layer after it."""
    if not all(isinstance(values.get(name), int) for name in ("n_input_layers", "n_output_layers")):
        return {}
    return {"n_input_layers": 0, "n_recurrent_layers": layers - 1, "n_output_layers": 1}


def _tiny_mla_overrides(values: dict) -> dict:
    """tiny_moe_mla_overrides' MLA part: TINY_MLA_SIZES for the MLA fields the config sets, and the head sizes made
    of them."""
    def has(name: str) -> bool:
        return values.get(name) is not None

    overrides = {name: size for name, size in TINY_MLA_SIZES.items() if has(name)}
    if has("qk_rope_head_dim") and isinstance(values.get("head_dim"), int):
        overrides["head_dim"] = TINY_MLA_SIZES["qk_rope_head_dim"]  # 5.x's DeepSeek config: the rotary part's size
    if has("qk_rope_head_dim") and has("qk_head_dim"):
        overrides["qk_head_dim"] = TINY_MLA_SIZES["qk_rope_head_dim"] + TINY_MLA_SIZES["qk_nope_head_dim"]
    return overrides


def reinitialise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every linear and embedding weight drawn again from one seed, at unit activation scale.

    The usual 0.02 initialisation makes a tiny random model repeat one token forever, so eager and graph would
    agree trivially; N(0, 1) embeddings and N(0, 1/fan_in) projections give tokens that vary. Biases become zero and
    the scales of norms one, as most models' own initialisation makes them: remote code that builds its modules
    with torch's skip_init (ChatGLM) leaves them as uninitialised memory, which a checkpoint would overwrite.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            bias = getattr(module, "bias", None)
            if isinstance(bias, torch.nn.Parameter):
                bias.zero_()
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.nn.Parameter) and weight.dim() == 1:
                weight.fill_(1.0)
            if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
                continue
            if isinstance(module, torch.nn.Embedding):
                weight.copy_(torch.randn(weight.shape, generator=generator))
            elif isinstance(module, torch.nn.Linear):
                weight.copy_(torch.randn(weight.shape, generator=generator) / math.sqrt(weight.shape[1]))
            elif type(module).__name__ == "Conv1D":  # GPT-2's transposed linear: (in, out)
                weight.copy_(torch.randn(weight.shape, generator=generator) / math.sqrt(weight.shape[0]))
    return model


def logits_and_cache(out, cache_argument_name: str):
    """(B, V) last-position logits and the cache from what a causal LM returns: an output object (its cache under
    the name the forward takes it by) or a (logits, cache, ...) tuple."""
    logits = getattr(out, "logits", None)
    if logits is None:
        return out[0][:, -1, :], out[1]
    for name in (cache_argument_name, "past_key_values", "cache"):
        if name in out:
            return logits[:, -1, :], out[name]
    return logits[:, -1, :], None


def import_remote_class(package: str, reference: str):
    """A class named by config.json's auto_map ("modeling_foo.FooForCausalLM", or "repo--modeling_foo.Foo" for
    code in another repository, which a local folder cannot hold) from `package`, the folder's copy."""
    import importlib

    module_name, _, class_name = reference.rpartition(".")
    return getattr(importlib.import_module(f"{package}.{module_name}"), class_name)


def folder_package(folder) -> str:
    """A Hub folder imported as a package under a name of its own, so its files' relative imports (`from
    .configuration_x import ...`) resolve without an __init__.py; the name comes from the folder's path, so an
    original and an adapted copy loaded in one process stay apart."""
    import hashlib
    import sys
    import types
    from pathlib import Path

    folder = Path(folder).resolve()
    name = f"graphmode_hub_{hashlib.sha1(str(folder).encode()).hexdigest()[:12]}"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        package.__file__ = str(folder / "__init__.py")  # lets a caller drop it with the folder's other modules
        sys.modules[name] = package
    return name


def vocabulary_size(config) -> int | None:
    """The vocabulary size the embedding and the LM head are built with: ChatGLM's padded_vocab_size where a config
    has one (its vocab_size keeps the tokenizer's count), else vocab_size."""
    return next((value for value in (getattr(config, name, None) for name in ("padded_vocab_size", "vocab_size"))
                 if isinstance(value, int)), None)


def lm_head(model: torch.nn.Module, vocab: int) -> str | None:
    """The name of `model`'s LM head: the module that ends the model with a weight onto the whole vocabulary,
    (vocab, hidden) as a linear holds it. That is the module its get_output_embeddings() gives, else the last module
    holding a 2-D weight (`lm_head`, ChatGLM's `output_layer`, Baichuan's NormHead); a vocabulary-wide layer inside
    the body (a feed-forward that happens to be as wide) is not one."""
    weighted = [(name, module) for name, module in model.named_modules()
                if isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.dim() == 2]
    try:
        output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    except (AttributeError, NotImplementedError):
        output = None
    for name, module in weighted[::-1]:
        if (module is output or name == weighted[-1][0]) and module.weight.shape[0] == vocab:
            return name
    return None


def language_model_class(package: str, references: list[str], config):
    """The first class among auto_map's model entries (AutoModelForCausalLM first, then AutoModel,
    AutoModelForSeq2SeqLM, ...) whose instance, built on the meta device from `config`, has an LM head: a linear
    onto the vocabulary. GLM-style repositories map only AutoModel to a class with one. Raises naming every
    candidate when none has one."""
    vocab = vocabulary_size(config)
    seen: list[str] = []
    for reference in references:
        model_class = import_remote_class(package, reference)
        try:
            with torch.device("meta"):
                model = model_class(config)
        except Exception:  # code that reads values while it builds (`.item()`) needs real tensors
            model = model_class(config)
        if vocab is not None and lm_head(model, vocab):
            return model_class
        seen.append(reference)
    raise ValueError(f"none of the model classes config.json's auto_map names ({', '.join(seen)}) has an LM head (a "
                     f"linear onto the {vocab}-token vocabulary): graphmode drives language models that return "
                     "next-token logits")
