"""Replaces a key/value cache grown with `torch.cat` by preallocated buffers written in place.

Recognises, in a method that takes a position,

    if past_key_value is not None:
        k = torch.cat([past_key_value[0], k], dim=2)
        v = torch.cat([past_key_value[1], v], dim=2)

(with or without the guard) and turns it into `k, v = self.kv_cache.update(input_pos, k, v)`, where
`self.kv_cache` is a `StaticKVCache` created in `__init__` and sized by the entry's `setup_caches`.
Attention then runs over the whole buffer; the causal mask hides what is not written yet.
"""
from __future__ import annotations

import libcst as cst

from graphmode.transforms.codemods.lib.helper_code import helper_statements
from graphmode.transforms.codemods.lib.helper_names import CACHE_CLASS
from graphmode.transforms.codemods.lib.kv_caches import HEAD_DIM_ATTRIBUTES, KV_HEAD_ATTRIBUTES, cat_of_past, \
    size_in_init
from graphmode.transforms.codemods.lib.module import (
    BufferCodemod,
    append_to_init,
    defined_at_top,
    insert_after_imports,
    replace_method,
)
from graphmode.transforms.cstutil import POSITION_TENSOR, find_method, position_param
from graphmode.transforms.vocabulary import TENSOR_POSITION_PARAMS


def _find_cat_pair(body: list[cst.BaseStatement]) -> tuple[int, list[tuple[str, str, int, int]]] | None:
    """Index of the statement holding the pair, and the two `(target, past, index, dim)`."""
    for i, stmt in enumerate(body):
        inner = list(stmt.body.body) if isinstance(stmt, cst.If) and stmt.orelse is None \
            and isinstance(stmt.body, cst.IndentedBlock) else body[i : i + 2]
        cats = [cat_of_past(s) for s in inner]
        if len(cats) == 2 and all(cats) and cats[0][1] == cats[1][1] and {cats[0][2], cats[1][2]} == {0, 1}:
            if isinstance(stmt, cst.If) or i + 1 < len(body):
                return i, sorted(cats, key=lambda c: c[2])
    return None


class StaticKVCacheCodemod(BufferCodemod):
    NAME = "static_kv_cache"
    SIZES_BUFFERS = True
    TITLE = "Preallocate the KV cache and write it in place"
    DESCRIPTION = (
        f"Replaces the cache grown with `torch.cat` by a `{CACHE_CLASS}` module holding "
        "`(batch, heads, length, head_dim)` buffers (sized by the entry's `setup_caches`), written with `index_copy_` "
        "at the position tensor. Attention runs over the whole buffer and the causal mask hides unwritten slots, so "
        "every Decode step has the same shapes and addresses. The `past_key_value` arguments are no longer read; "
        "the returned cache is the buffer itself."
    )
    SKILL = "static-kv-cache"
    FIXES = frozenset({"GM301"})

    @classmethod
    def idiom_in(cls, words, options) -> bool:
        return "cat" in words
    REQUIRES = ("static_positions", "static_mask")

    def rewrite_method(self, cls, updated_node, method, body):
        found = _find_cat_pair(body)
        if found is None:
            return None
        index, (keys, values) = found
        if keys[3] not in (1, 2, -2, -3):
            self.record_manual(body[index], "the cache grows along a dimension other than 1 or 2")
            return None
        seq_dim = keys[3] if keys[3] > 0 else keys[3] + 4
        init = find_method(cls, "__init__")
        heads = size_in_init(init, KV_HEAD_ATTRIBUTES)
        head_dim = size_in_init(init, HEAD_DIM_ATTRIBUTES)
        tensor_positions = any(p.name.value in TENSOR_POSITION_PARAMS for p in method.params.params)
        if position_param(method) is None and tensor_positions:
            return None  # positions already come as a tensor (Hugging Face style): cache_object's
        if position_param(method) is None or heads is None or head_dim is None:
            self.record_manual(body[index], "a growing KV cache, but the method takes no position or __init__ "
                                            "names no head count and head size (self.n_kv_heads or "
                                            "config.num_key_value_heads, self.head_dim)")
            return None
        update = cst.parse_statement(
            f"{keys[0]}, {values[0]} = self.kv_cache.update({POSITION_TENSOR}, {keys[0]}, {values[0]})\n"
        ).with_changes(leading_lines=[
            # A comment above the cat that tells of the concatenation (which is gone) goes; others (a layout) stay.
            *(line for line in body[index].leading_lines if not _tells_of_growth(line.comment)),
            cst.EmptyLine(indent=True, comment=cst.Comment(
                "# graphmode: written in place; attention reads all slots.")),
        ])
        width = 1 if isinstance(body[index], cst.If) else 2
        self.record_edit(body[index], f"`{keys[1]}` concatenation replaced by `self.kv_cache.update`")
        new_body = [*body[:index], update, *body[index + width :]]
        updated_node = replace_method(updated_node, method.name.value,
                                      method.with_changes(body=method.body.with_changes(body=new_body)))
        create = cst.parse_statement(
            f"self.kv_cache = {CACHE_CLASS}({heads}, {head_dim}, seq_dim={seq_dim})\n"
        )
        updated_node = append_to_init(updated_node, [create],
                                      "keys and values for every position, sized by setup_caches.")
        return updated_node

    def finish_module(self, module: cst.Module) -> cst.Module:
        if not defined_at_top(module, CACHE_CLASS):
            module = insert_after_imports(module, helper_statements(CACHE_CLASS))
        return module  # no size constants: `setup_caches` sizes the cache


_GROWTH_WORDS = ("append", "concat", "cat(", "grow", "extend", "so far")


def _tells_of_growth(comment: cst.Comment | None) -> bool:
    """Whether a comment speaks of the cache growing ("append this step's keys to everything seen so far")."""
    return comment is not None and any(word in comment.value.lower() for word in _GROWTH_WORDS)
