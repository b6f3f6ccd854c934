"""Which `torch.cat` grows a cache: the one recogniser of the growing-cache family.

GM301 reports a cache grown by concatenation (on Python's `ast`); static_kv_cache, carried_cache and cache_object
rewrite one into a write in place (on libcst's tree, through cstutil's `appending_cat`). Both split the call into
the same neutral parts here (`cat_pieces`: the old part, the new part and the dim) and ask the same two questions of
them, so what the rule calls a growing cache and what the codemods rewrite are decided in one place:

- `grows_past`: the old part is a cache read (a subscript, `past[0]`, or a name with "past" in it), which is what
  GM301 reports wherever the result goes;
- `appends_to`: `X = torch.cat((OLD, X), dim=D)`, the new part is the name assigned, OLD does not read it and D is a
  literal integer, which is the shape the codemods can preallocate and write at the position.

Written over the parts, not either tree, for the reasons transforms.analysis.host_reads gives.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Node = TypeVar("Node")


@dataclass(frozen=True)
class CatPieces(Generic[Node]):
    """`torch.cat((OLD, NEW), dim=D)` in either tree's nodes."""

    old: Node
    new: Node
    dim: int | None  # D when it is one literal integer (by keyword or position), else None


def cat_pieces(pieces: Sequence[Node] | None, dims: Sequence[int | None]) -> CatPieces[Node] | None:
    """The parts of a `torch.cat` whose first argument is a list or tuple (`pieces`, None for anything else) and
    whose further `dim` arguments, read as integers, are `dims`; None unless it joins exactly two pieces."""
    if pieces is None or len(pieces) != 2:
        return None
    old, new = pieces
    return CatPieces(old, new, dims[0] if len(dims) == 1 else None)


def grows_past(old_is_subscript: bool, old_name: str | None) -> bool:
    """GM301's question of the old part: `past[0]`, `past_key`, not a new tensor or a negated slice (rotate_half)."""
    return old_is_subscript or (old_name is not None and "past" in old_name)


def appends_to(target: str, new_name: str | None, names_in_old: Collection[str], dim: int | None) -> bool:
    """The codemods' question: `target = torch.cat((OLD, target), dim=D)` with D known and OLD not reading target."""
    return dim is not None and target not in names_in_old and new_name == target
