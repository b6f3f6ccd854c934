"""Recognising a key/value cache the model grows or sizes: what static_kv_cache and cache_object both read."""
from __future__ import annotations

import libcst as cst

from graphmode.transforms.cstutil import appending_cat, code_of, nodes_of_type


KV_HEAD_ATTRIBUTES = ("n_kv_heads", "num_key_value_heads", "num_kv_heads", "n_heads", "num_heads")
HEAD_DIM_ATTRIBUTES = ("head_dim", "head_size", "d_head")


def cat_of_past(stmt: cst.BaseStatement) -> tuple[str, str, int, int] | None:
    """`k = torch.cat([past[0], k], dim=2)` -> ("k", "past", 0, 2)."""
    found = appending_cat(stmt)
    old = found.past if found else None
    if not (isinstance(old, cst.Subscript) and isinstance(old.value, cst.Name) and len(old.slice) == 1
            and isinstance(old.slice[0].slice, cst.Index) and isinstance(old.slice[0].slice.value, cst.Integer)):
        return None
    return found.target, old.value.value, int(old.slice[0].slice.value.value), found.dim


def size_in_init(init: cst.FunctionDef | None, candidates: tuple[str, ...], code: str | None = None) -> str | None:
    """An expression for a size at the end of `__init__`: `self.<name>` where `__init__` sets one of the candidate
    attributes, else `<param>.<name>` where it reads one off a parameter (`config.num_key_value_heads`, as
    transformers 4.48 and later do, keeping no attribute for the KV head count); None when it does neither.
    `code`: `__init__`'s code where the caller has it (`GraphCodemod.code_to_search`'s serves: it is searched for
    `self.<name> =` and `self.<name>:` only)."""
    if init is None:
        return None
    if code is None:
        code = code_of(init)
    own = next((name for name in candidates if f"self.{name} =" in code or f"self.{name}:" in code), None)
    if own is not None:
        return f"self.{own}"
    params = [p.name.value for p in init.params.params if p.name.value != "self"]
    reads = {(n.value.value, n.attr.value) for n in nodes_of_type(init.body, cst.Attribute)
             if isinstance(n.value, cst.Name)}
    return next((f"{param}.{name}" for name in candidates for param in params if (param, name) in reads), None)
