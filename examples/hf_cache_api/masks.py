"""Builders of the 4-D additive causal mask (a library module, like transformers' modeling_attn_mask_utils).

Not in the harness's SOURCES. The model calls them on every forward with the past length it read
from the cache, so the mask they return is (batch, 1, new tokens, past + new tokens): 0 where a
query may attend, the dtype's minimum where it may not.
"""
from __future__ import annotations

import torch


def _causal_visibility(query_length, past_key_values_length, sliding_window, device):
    """(query_length, past + query_length) booleans: True where the query may see the key."""
    key_length = past_key_values_length + query_length
    query_positions = torch.arange(past_key_values_length, key_length, device=device)[:, None]
    key_positions = torch.arange(key_length, device=device)[None, :]
    visible = key_positions <= query_positions
    if sliding_window is not None:
        visible &= key_positions > query_positions - sliding_window
    return visible


def _prepare_4d_causal_attention_mask(attention_mask, input_shape, inputs_embeds, past_key_values_length,
                                      sliding_window=None):
    """The additive causal mask for the new tokens, combined with a 2-D padding mask when one is given.

    attention_mask: None or (batch, past + new) with 1 for real tokens and 0 for padding.
    input_shape: (batch, new tokens). Keys past the window (`sliding_window` keys up to the query) are hidden too.
    """
    batch_size, query_length = input_shape
    dtype, device = inputs_embeds.dtype, inputs_embeds.device
    visible = _causal_visibility(query_length, past_key_values_length, sliding_window, device)
    visible = visible[None, None].expand(batch_size, 1, query_length, past_key_values_length + query_length)
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[-1] != past_key_values_length + query_length:
            raise ValueError(f"the padding mask must be (batch, {past_key_values_length + query_length}), "
                             f"got {tuple(attention_mask.shape)}")
        visible = visible & attention_mask[:, None, None, :].bool()
    hidden = torch.full(visible.shape, torch.finfo(dtype).min, dtype=dtype, device=device)
    return hidden.masked_fill(visible, 0.0)


def _prepare_4d_causal_attention_mask_for_sdpa(attention_mask, input_shape, inputs_embeds, past_key_values_length,
                                               sliding_window=None):
    """As `_prepare_4d_causal_attention_mask`, but None where SDPA's own `is_causal` does the same job.

    Without padding and without a window, one new token may see everything, and a prompt with no past
    is plain causal attention: the caller then passes no mask and lets SDPA apply causality.
    """
    query_length = input_shape[-1]
    no_padding = attention_mask is None or bool(torch.all(attention_mask == 1))
    if no_padding and sliding_window is None and (query_length == 1 or past_key_values_length == 0):
        return None
    return _prepare_4d_causal_attention_mask(attention_mask, input_shape, inputs_embeds, past_key_values_length,
                                             sliding_window=sliding_window)
