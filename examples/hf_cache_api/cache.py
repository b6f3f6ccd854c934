"""The KV cache object the example model writes through (a library module, like transformers' cache_utils).

Not in the harness's SOURCES: graphmode never rewrites it. The model only sees the API
(`update`, `get_usable_length`, `from_legacy_cache`, `to_legacy_cache`), as a Hugging Face 4.36 model does.
"""
from __future__ import annotations

import torch


class Cache:
    """What every cache offers; the storage is up to the subclass."""

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        """Stores the new keys and values of `layer_idx` and returns all of that layer's keys and values."""
        raise NotImplementedError

    def get_seq_length(self, layer_idx=0):
        """How many positions `layer_idx` holds."""
        raise NotImplementedError

    def get_max_length(self):
        """The most positions the cache can hold, or None when it has no limit."""
        return None

    def get_usable_length(self, new_seq_length, layer_idx=0):
        """How many held positions the next `new_seq_length` tokens can attend to (all, without a limit)."""
        held = self.get_seq_length(layer_idx)
        limit = self.get_max_length()
        if limit is not None and held + new_seq_length > limit:
            return limit - new_seq_length
        return held


class DynamicCache(Cache):
    """Per-layer key and value tensors (batch, kv heads, length, head dim) that grow with every call."""

    def __init__(self):
        self.key_cache: list[torch.Tensor] = []
        self.value_cache: list[torch.Tensor] = []
        self.seen_tokens = 0  # a Python int: every token any call has passed in

    def __len__(self):
        return len(self.key_cache)

    def __getitem__(self, layer_idx):
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        if layer_idx == 0:
            self.seen_tokens += key_states.shape[-2]
        if layer_idx == len(self.key_cache):
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], key_states], dim=-2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], value_states], dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def get_seq_length(self, layer_idx=0):
        if layer_idx >= len(self.key_cache):
            return 0
        return self.key_cache[layer_idx].shape[-2]

    def to_legacy_cache(self):
        """The tuple form: one (keys, values) pair per layer."""
        return tuple((keys, values) for keys, values in zip(self.key_cache, self.value_cache))

    @classmethod
    def from_legacy_cache(cls, past_key_values=None):
        """A cache holding the pairs of the tuple form (empty for None)."""
        cache = cls()
        for layer_idx, (keys, values) in enumerate(past_key_values or ()):
            cache.update(keys, values, layer_idx)
        return cache
