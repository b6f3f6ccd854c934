"""The names real inference code uses, shared by the rules (stdlib ast) and the codemods (libcst).

Plain data and pure functions: importing this loads neither parser.
"""
from __future__ import annotations

import re

# Parameter names that, in real inference code, carry the position of the first new token as a Python int.
POSITION_PARAM_NAMES = frozenset(
    {"start_pos", "cur_pos", "past_length", "past_len", "past_key_values_length", "position_offset",
     "seq_len_offset", "start_position", "offset"}
)
_POSITION_LIKE = re.compile(r"(^|_)(pos|position|offset|past_len|past_length)$")
TENSOR_FACTORIES = frozenset(
    {"zeros", "ones", "full", "empty", "arange", "triu", "tril", "tensor", "zeros_like", "ones_like",
     "full_like", "empty_like", "linspace", "eye"}
)
# The name the position tensor takes once Python-int positions are rewritten.
POSITION_TENSOR = "input_pos"


def is_position_name(name: str, annotation: str | None) -> bool:
    """Whether a parameter carries a Python-int position: `name` is its name, `annotation` the bare name
    it is annotated with, "" for any other annotation, None when there is none."""
    if annotation == "int":
        return name in POSITION_PARAM_NAMES or bool(_POSITION_LIKE.search(name))
    return name in POSITION_PARAM_NAMES and annotation is None

# transformers' Cache API (4.36 and later): the cache is an object passed in and out of forward, written with
# `past_key_value.update(key, value, layer_idx, cache_kwargs)` and measured with these methods.
CACHE_OBJECT_WRITE = "update"
CACHE_OBJECT_LENGTHS = frozenset({"get_usable_length", "get_seq_length"})
# transformers' helpers (modeling_attn_mask_utils) that build the additive 4-D causal mask for
# (batch, 1, new tokens, past + new tokens) from a 2-D padding mask and the past length.
LIBRARY_MASK_HELPERS = frozenset({"_prepare_4d_causal_attention_mask", "_prepare_4d_causal_attention_mask_for_sdpa"})
# Parameter names of the token input, for entry points that take every argument by keyword.
TOKEN_PARAM_NAMES = frozenset({"input_ids", "tokens", "token_ids", "idx"})
# Older Hugging Face models (4.35 and before) build the same mask in a method of the model, defined in the file.
SAME_FILE_MASK_HELPERS = frozenset({"_prepare_decoder_attention_mask"})
# Since 4.38 the model's own method builds it from the cache slots:
# `self._update_causal_mask(attention_mask, inputs_embeds, cache_position, past_key_values, output_attentions)`.
CACHE_POSITION_MASK_HELPERS = frozenset({"_update_causal_mask"})
# Since 4.53 a library function builds it, every argument by keyword (masking_utils):
# `create_causal_mask(config=, input_embeds=, attention_mask=, cache_position=, past_key_values=, position_ids=)`.
KEYWORD_MASK_HELPERS = frozenset({"create_causal_mask"})
# Its sliding-window twin, same keywords; the window is the config's (`config.sliding_window`). 5.x models with an
# optional window pick one of the two first: `mask_function = create_causal_mask if self.config.sliding_window is
# None else create_sliding_window_causal_mask`, then `mask_function(config=..., ...)` (Mistral, Qwen2).
SLIDING_KEYWORD_MASK_HELPERS = frozenset({"create_sliding_window_causal_mask"})
# Parameters that carry positions as a tensor already (Hugging Face): (batch, new tokens) ids, or cache slots.
TENSOR_POSITION_PARAMS = frozenset({"position_ids", "cache_position"})
