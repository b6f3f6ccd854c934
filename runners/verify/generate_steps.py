"""One Prefill and one Decode step driven the way the model's own `generate()` drives it.

`generate()` never calls `forward` with bare token ids: it keeps the whole sequence so far and a dict of model
keywords (the attention mask, the cache, `cache_position`, and whatever the model's own code adds), asks the
model's `prepare_inputs_for_generation` for `forward`'s arguments, and after every step updates the keywords
(`_update_model_kwargs_for_generation`). Models written for it depend on that: one asserts a mask, another makes
2-D position ids or slices the new token out of the whole sequence in its own `prepare_inputs_for_generation`. So
the `--hf` harnesses do the same, and re-implement none of it:

- the attention mask is all ones over the prompt (batch 1, no padding) and grows by one column per Decode step;
- `prepare_inputs_for_generation` is called where the model has one (its own, or transformers' default), with
  the keywords its signature takes; where it has none, or transformers' stub refuses, `forward` gets the new
  tokens, the cache, and the mask where it names one;
- the keywords are updated by the model's own `_update_model_kwargs_for_generation` where its code defines one
  (ChatGLM's sets `is_first_forward`), else as `generate()` does by default: the cache from the output, a column
  of ones on the mask, `cache_position` one further.

The step state is that keyword dict plus the sequence so far; nothing in graphmode looks inside it.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch

from graphmode.runners.hf_driver import cache_argument, logits_and_cache, vocabulary_size

SEQUENCE = "input_ids"  # the whole sequence so far, as generate() keeps it


def generate_prefill(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The prompt, as generate()'s first step: (last position's logits, the step state)."""
    keywords: dict[str, Any] = {"attention_mask": torch.ones_like(tokens), "use_cache": True}
    if _takes(_prepare_inputs(model), "cache_position"):
        keywords["cache_position"] = torch.arange(tokens.shape[1], device=tokens.device)
    logits, state = _step(model, tokens, keywords, new_tokens=tokens.shape[1], first=True)
    name = cache_argument(model)
    if state.get(name) is None:
        # An output without a cache (RecurrentGemma's): the prompt again, into the cache generate() makes first,
        # which the model writes in place. Only then: BLT's own cache works where generate()'s fails.
        cache = _generate_default_cache(model)
        if cache is not None:
            logits, state = _step(model, tokens, {**keywords, name: cache}, new_tokens=tokens.shape[1], first=True)
    vocab = vocabulary_size(model.config) if hasattr(model, "config") else None
    if vocab is not None and logits.shape[-1] != vocab:
        raise ValueError(f"{type(_model(model)).__name__} returns {logits.shape[-1]} values per position, not logits "
                         f"over the {vocab}-token vocabulary: graphmode drives language models (a class with an LM "
                         "head)")
    return logits, state


def _generate_default_cache(model: torch.nn.Module):
    """The cache generate() makes before its first step, for transformers' own models (the ones StaticCacheDecoder
    wraps): with no cache_implementation set, a DynamicCache of the model's text config, where the model takes one
    (`_supports_default_dynamic_cache`). The model writes into it in place; a model that returns no cache in its
    output (RecurrentGemma) keeps its keys and values only there, and without it every Decode step would start from
    an empty cache. None where generate() makes none, or this transformers has no such cache (before 5.0)."""
    from graphmode.runners.hf_driver import StaticCacheDecoder

    if not isinstance(model, StaticCacheDecoder):
        return None
    inner = model.model
    try:
        from transformers import DynamicCache

        supported = inner._supports_default_dynamic_cache()
        implementation = getattr(getattr(inner, "generation_config", None), "cache_implementation", None)
        if not supported or implementation not in (None, "dynamic") \
                or "config" not in inspect.signature(DynamicCache.__init__).parameters:
            return None
        return DynamicCache(config=inner.config.get_text_config(decoder=True))
    except (ImportError, AttributeError, TypeError):
        return None


def generate_decode(model: torch.nn.Module, token: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
    """One new token per sequence after the cached ones, as each later step of generate()."""
    keywords = {name: value for name, value in state.items() if name != SEQUENCE}
    sequence = torch.cat([state[SEQUENCE], token], dim=1)
    return _step(model, sequence, keywords, new_tokens=token.shape[1], first=False)


def _step(model: torch.nn.Module, sequence: torch.Tensor, keywords: dict, new_tokens: int,
          first: bool) -> tuple[torch.Tensor, dict]:
    name = cache_argument(model)
    inputs = _prepared(model, sequence, keywords, new_tokens, first)
    if inputs is None:
        inputs = _plain_inputs(model, sequence, keywords, new_tokens, name)
    out = model(**inputs)
    logits, cache = logits_and_cache(out, name)
    keywords = _updated(model, out, keywords, cache, name)
    return logits, {**keywords, SEQUENCE: sequence}


def _model(model: torch.nn.Module) -> torch.nn.Module:
    """The model whose generation methods count: graphmode's StaticCacheDecoder wraps transformers' own."""
    from graphmode.runners.hf_driver import StaticCacheDecoder

    return model.model if isinstance(model, StaticCacheDecoder) else model


def _prepare_inputs(model: torch.nn.Module) -> Callable[..., dict] | None:
    method = getattr(_model(model), "prepare_inputs_for_generation", None)
    return method if callable(method) else None


def _takes(function: Callable | None, name: str) -> bool:
    return function is not None and name in inspect.signature(function).parameters


def _prepared(model: torch.nn.Module, sequence: torch.Tensor, keywords: dict, new_tokens: int,
              first: bool) -> dict | None:
    """`forward`'s arguments from the model's prepare_inputs_for_generation, called with what its signature takes
    (5.x names the step's length `next_sequence_length` and the first step `is_first_iteration`); None where the
    model has none or transformers' stub (before 4.45) refuses."""
    prepare = _prepare_inputs(model)
    if prepare is None:
        return None
    parameters = inspect.signature(prepare).parameters
    open_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    passed = {name: value for name, value in keywords.items() if name in parameters or open_keywords}
    # A model's own method that takes **kwargs hands them on to transformers' (Phi-3's does): what that one names,
    # it gets too. Without the step's length, 5.x's slices no token off the sequence, and every step would run the
    # whole sequence again over the cache.
    handed_on = _base_parameters() if open_keywords else frozenset()
    if "next_sequence_length" in parameters or "next_sequence_length" in handed_on:
        passed["next_sequence_length"] = new_tokens
    if "is_first_iteration" in parameters or "is_first_iteration" in handed_on:
        passed["is_first_iteration"] = first
    try:
        return dict(prepare(sequence, **passed))
    except NotImplementedError:
        return None


@functools.cache
def _base_parameters() -> frozenset[str]:
    """The parameters of transformers' own prepare_inputs_for_generation (GenerationMixin's); none before it had one."""
    try:
        from transformers.generation.utils import GenerationMixin
    except ImportError:
        return frozenset()
    method = getattr(GenerationMixin, "prepare_inputs_for_generation", None)
    return frozenset(inspect.signature(method).parameters) if callable(method) else frozenset()


def _plain_inputs(model: torch.nn.Module, sequence: torch.Tensor, keywords: dict, new_tokens: int,
                  name: str) -> dict:
    """What the harness passed before prepare_inputs_for_generation was called: the new tokens and the cache (the
    model counts positions from its length), plus the mask and cache_position where `forward` names them."""
    parameters = inspect.signature(model.forward).parameters
    inputs = {"input_ids": sequence[:, -new_tokens:], "use_cache": True}
    if keywords.get(name) is not None:
        inputs[name] = keywords[name]
    inputs.update({key: keywords[key] for key in ("attention_mask", "cache_position")
                   if key in parameters and key in keywords})
    return inputs


def _updated(model: torch.nn.Module, out: Any, keywords: dict, cache: Any, name: str) -> dict:
    """The keywords for the next step: the model's own `_update_model_kwargs_for_generation` where its code (not
    transformers') defines one, else generate()'s default update."""
    own = _own_update(model)
    if own is not None:
        parameters = inspect.signature(own).parameters
        extra = {"is_encoder_decoder": False} if "is_encoder_decoder" in parameters else {}
        return dict(own(out, dict(keywords), **extra))
    # (an output without a cache leaves the one passed in, which the model wrote in place, as generate() keeps it)
    keywords = {**keywords, name: cache if cache is not None else keywords.get(name)}
    mask = keywords.get("attention_mask")
    if mask is not None:
        keywords["attention_mask"] = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
    if keywords.get("cache_position") is not None:
        keywords["cache_position"] = keywords["cache_position"][-1:] + 1
    return keywords


def _own_update(model: torch.nn.Module) -> Callable[..., dict] | None:
    inner = _model(model)
    for klass in type(inner).__mro__:
        if "_update_model_kwargs_for_generation" in vars(klass):
            return None if klass.__module__.startswith(("transformers.", "torch.")) else \
                inner._update_model_kwargs_for_generation
    return None
