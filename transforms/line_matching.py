"""difflib's matching of two lists of lines, found faster where the lists share long runs.

The chain maps every text's lines back to the original's through `difflib.SequenceMatcher(None, old, new,
autojunk=False)`, and the edits' line numbers depend on which of two equal lines it pairs, so the pairs here are
exactly difflib's. difflib splits the texts at the longest run of equal lines (`find_longest_match`: of the longest,
the one that starts first in `old`, then first in `new`) and does the same on each side of it. Its search reads
every pair of equal lines in the range, and a source file's blank lines come in hundreds (237 in transformers
4.36.2's modeling_llama.py: 56,000 pairs of them alone).

`_longest_run` finds the same run without reading every pair. When a run of `step` equal lines is known to exist
in a range (the lines the range's two sides begin or end with, or one that a sparser sampling found), every run at
least that long holds a line of `old` whose index is `step - 1` past the range's start modulo `step`; extending each
equal pair at those lines alone finds every such run whole, so the longest of them, with difflib's order among
equally long ones, is difflib's. A range where no run of `_SHORTEST_SAMPLED_RUN` lines is found is searched by
difflib itself.
"""
from __future__ import annotations

import difflib
from bisect import bisect_left
from collections.abc import Hashable, Sequence

# Below this many known equal lines, sampling reads nearly as many pairs as difflib's own search: difflib searches.
_SHORTEST_SAMPLED_RUN = 4


def carried_numbers(old: Sequence[Hashable], new: Sequence[Hashable], numbers: Sequence[int | None]
                    ) -> list[int | None]:
    """For each line of `new`, the number in `numbers` of the line of `old` that difflib pairs it with; None for a
    line difflib pairs with none (one written, or moved past other lines)."""
    mapped: list[int | None] = [None] * len(new)
    for i, j, size in matching_blocks(old, new):
        for offset in range(size):
            mapped[j + offset] = numbers[i + offset]
    return mapped


def matching_blocks(a: Sequence[Hashable], b: Sequence[Hashable]) -> list[tuple[int, int, int]]:
    """The runs of equal items `difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()` gives, in
    its order, without its closing empty run and without merging runs that follow one another (the same pairs)."""
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    found: list[tuple[int, int, int]] = []
    pending = [(0, len(a), 0, len(b))]
    while pending:
        alo, ahi, blo, bhi = pending.pop()
        i, j, size = _longest_run(matcher, a, b, alo, ahi, blo, bhi)
        if size:
            found.append((i, j, size))
            if alo < i and blo < j:
                pending.append((alo, i, blo, j))
            if i + size < ahi and j + size < bhi:
                pending.append((i + size, ahi, j + size, bhi))
    found.sort()
    return found


def _longest_run(matcher: difflib.SequenceMatcher, a: Sequence[Hashable], b: Sequence[Hashable],
                 alo: int, ahi: int, blo: int, bhi: int) -> tuple[int, int, int]:
    """`matcher.find_longest_match(alo, ahi, blo, bhi)` (no junk: the longest run, the first in `a`, then in `b`)."""
    head = 0
    while alo + head < ahi and blo + head < bhi and a[alo + head] == b[blo + head]:
        head += 1
    tail = 0
    while ahi - tail > alo + head and bhi - tail > blo + head and a[ahi - 1 - tail] == b[bhi - 1 - tail]:
        tail += 1
    # A run of max(head, tail) lines exists. Where the sides neither begin nor end alike, a quarter of the shorter
    # side is tried first: a codemod rewrites a few places, and between two of them lie long runs.
    step = max(head, tail) if max(head, tail) >= _SHORTEST_SAMPLED_RUN else min(ahi - alo, bhi - blo) // 4
    while step >= _SHORTEST_SAMPLED_RUN:
        best = _longest_run_at_least(matcher.b2j, a, b, alo, ahi, blo, bhi, step)
        if best[2] >= step:  # every run this long was read, so the longest is among them
            return best
        step = max(best[2], step // 2)  # a run of best[2] exists: a step that short finds the longest
    return tuple(matcher.find_longest_match(alo, ahi, blo, bhi))


def _longest_run_at_least(b2j: dict[Hashable, list[int]], a: Sequence[Hashable], b: Sequence[Hashable],
                          alo: int, ahi: int, blo: int, bhi: int, step: int) -> tuple[int, int, int]:
    """The longest run of the range that holds one of the sampled lines of `a` (every `step`-th), in difflib's order:
    the longest run of the range when that is at least `step` long. `b2j`: each item of `b` -> its indexes,
    ascending (difflib's table, which without junk drops nothing)."""
    best = (alo, blo, 0)
    for i in range(alo + step - 1, ahi, step):
        places = b2j.get(a[i], ())
        for at in range(bisect_left(places, blo), len(places)):
            j = places[at]
            if j >= bhi:
                break
            start_i, start_j = i, j
            while start_i > alo and start_j > blo and start_i > i - step and a[start_i - 1] == b[start_j - 1]:
                start_i, start_j = start_i - 1, start_j - 1
            if start_i == i - step:
                continue  # the run holds the sampled line before this one, and was read from there whole
            end_i, end_j = i + 1, j + 1
            while end_i < ahi and end_j < bhi and a[end_i] == b[end_j]:
                end_i, end_j = end_i + 1, end_j + 1
            size = end_i - start_i
            if size > best[2] or size == best[2] and (start_i, start_j) < best[:2]:
                best = (start_i, start_j, size)
    return best
