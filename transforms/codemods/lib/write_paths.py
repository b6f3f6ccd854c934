"""Where a cache write goes when the growing pair sits inside branches.

Attention often grows the cache in one branch and computes the same keys and values without it in another:

    elif past_key_value is not None:            # OPT, BART-style decoders
        key_states = self._shape(self.k_proj(hidden_states), -1, bsz)
        key_states = torch.cat([past_key_value[0], key_states], dim=2)
        ...
    else:
        key_states = self._shape(self.k_proj(hidden_states), -1, bsz)

    if past_key_value is not None:              # MPT
        if len(past_key_value) != 0:
            key_states = torch.cat([past_key_value[0], key_states], dim=2)
        past_key_value = (key_states, value_states)
    else:
        past_key_value = (key_states, value_states)

A static cache must be written on every path that computes this layer's keys, Prefill's (no cache yet)
included. The write replaces the pair; then, going out one `if` at a time, every other branch whose statements
are the writing branch's without the write (and without the reads of the old cache that are now dead) gets the
write at the same place. A chain whose branches all end up the same is replaced by that one body. Branches that
compute something else (cross-attention reading encoder states) stay as they were, and so does every `if`
further out. The comparison is of the code itself (Python's ast: comments and layout do not count).

An `if` on a flag of the module (`if self.config.use_quantized_cache:`, `if self.use_cache_quantization:`) that the
traced run saw take the branch with the pair at every Decode step is settled: the static copy keeps that branch's
statements alone, as the flag cannot change under it (the caller says which tests are such flags, `settled`).
"""
from __future__ import annotations

import ast
from collections.abc import Callable

import libcst as cst

from graphmode.transforms.cstutil import code_of, names_in


Settled = Callable[[cst.If], bool]


def place_write(body: list[cst.BaseStatement], pair: tuple[cst.BaseStatement, cst.BaseStatement],
                write: cst.BaseStatement, unpacks: set[cst.BaseStatement], settled: Settled | None = None
                ) -> dict[cst.BaseStatement, list[cst.BaseStatement]] | None:
    """Statements of the method body -> what replaces each, so that `write` replaces the pair and runs on the
    paths described above; None when no other branch computes the same keys (the cache would go unwritten
    when it is absent). `unpacks`: statements that only read the old cache into names. `settled(if_)`: whether the
    `if` tests a flag, whose branch holding the pair is then kept alone."""
    if _index(body, pair[0]) is not None and _index(body, pair[1]) is not None:
        return {pair[0]: [write], pair[1]: []}
    for stmt in body:
        found = _in_statement(stmt, pair, write, unpacks, settled)
        if found is not None:
            replacement, _ = found
            return None if replacement is None else {stmt: replacement}
    return None


def _is_write(stmt: cst.BaseStatement, write: cst.BaseStatement) -> bool:
    """The write itself, or a copy of it with other comments above (an `if` it replaced left them there)."""
    return stmt is write or stmt.with_changes(leading_lines=()).deep_equals(write.with_changes(leading_lines=()))


def _index(block: list[cst.BaseStatement], node: cst.CSTNode) -> int | None:
    return next((i for i, s in enumerate(block) if s is node), None)


def _in_statement(stmt, pair, write, unpacks, settled=None) -> tuple[list[cst.BaseStatement] | None, bool] | None:
    """None: the pair is not under `stmt`. Else (replacement statements or None when it cannot be placed,
    whether the write is at the level of `stmt` on every path)."""
    if stmt is pair[0]:
        return [write], True
    if stmt is pair[1]:
        return [], True
    if not isinstance(stmt, cst.If):
        return None
    branches = _branches(stmt)
    for index, block in enumerate(branches):
        result = _in_block(block, pair, write, unpacks, settled)
        if result is None:
            continue
        new_block, placed = result
        if new_block is None:
            return None, False
        if settled is not None and _two_way(stmt) and settled(stmt):
            return _settled(stmt, index, new_block), placed
        bodies = [list(b) for b in branches]
        bodies[index] = new_block
        if not placed:
            return [_rebuild(stmt, bodies)], False
        without = [s for s in new_block if not _is_write(s, write)]
        at = next(i for i, s in enumerate(new_block) if _is_write(s, write))
        matched = [i == index or _same(b, without) for i, b in enumerate(bodies)]
        if not any(m for i, m in enumerate(matched) if i != index):
            return None, False
        for i, block_i in enumerate(bodies):
            if i != index and matched[i]:
                bodies[i] = [*block_i[:at], write, *block_i[at:]]
        if all(matched):
            first, *rest = new_block
            leading = [*stmt.leading_lines, *getattr(first, "leading_lines", ())]
            return [first.with_changes(leading_lines=leading), *rest], True
        return [_rebuild(stmt, bodies)], False
    return None


def _in_block(block: list[cst.BaseStatement], pair, write, unpacks, settled=None):
    """(the block rewritten or None when the write cannot be placed, whether it is at the block's level), or
    None when the pair is not in the block."""
    for position, stmt in enumerate(block):
        found = _in_statement(stmt, pair, write, unpacks, settled)
        if found is None:
            continue
        replacement, everywhere = found
        if replacement is None:
            return None, False
        new = [*block[:position], *replacement, *block[position + 1:]]
        if stmt is pair[0] or stmt is pair[1]:
            # Both halves of the pair are in this block: finish both before judging the block.
            other = pair[1] if stmt is pair[0] else pair[0]
            new = [s for s in new if s is not other]
            if _index(new, write) is None:
                new.insert(position, write)
            new = _without_dead_unpacks(new, unpacks)
        elif any(_is_write(s, write) for s in replacement):  # a settled flag brought the write up to this block
            new = _without_dead_unpacks(new, unpacks)
        return new, everywhere
    return None


def _without_dead_unpacks(block: list[cst.BaseStatement], unpacks: set[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """Drops the reads of the old cache (`past_key, past_value = layer_past`) nothing in the block reads now."""
    kept = []
    for stmt in block:
        if stmt in unpacks:
            bound = _bound_names(stmt)
            if not any(bound & names_in(other) for other in block if other is not stmt):
                continue
        kept.append(stmt)
    return kept


def _bound_names(stmt: cst.BaseStatement) -> set[str]:
    names: set[str] = set()
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    names |= names_in(target.target)
    return names


def _two_way(stmt: cst.If) -> bool:
    """An `if` with an `else` or none, no `elif`: one test decides which branch runs."""
    return not isinstance(stmt.orelse, cst.If)


def _settled(stmt: cst.If, index: int, block: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The branch's statements in place of the whole `if`, under a comment that names the test."""
    first, *rest = block
    test = code_of(stmt.test).strip()
    why = "a flag parameter; the static path always writes its cache" if isinstance(stmt.test, cst.Name) \
        else "a module flag; the trace took this branch"
    note = cst.EmptyLine(indent=True, comment=cst.Comment(
        f"# graphmode: `{test}` settled {'true' if index == 0 else 'false'} ({why})."))
    return [first.with_changes(leading_lines=[*stmt.leading_lines, note, *getattr(first, "leading_lines", ())]), *rest]


def _branches(stmt: cst.If) -> list[list[cst.BaseStatement]]:
    """The bodies of an if/elif/else chain, with an empty one for a missing `else`."""
    bodies: list[list[cst.BaseStatement]] = []
    current: cst.If | cst.Else | None = stmt
    while isinstance(current, cst.If):
        bodies.append(list(current.body.body))
        current = current.orelse
    bodies.append(list(current.body.body) if isinstance(current, cst.Else) else [])
    return bodies


def _rebuild(stmt: cst.If, bodies: list[list[cst.BaseStatement]]) -> cst.If:
    """The chain with new bodies; a missing `else` is added when its body is no longer empty."""
    head, *rest = bodies
    orelse = stmt.orelse
    if isinstance(orelse, cst.If):
        orelse = _rebuild(orelse, rest)
    elif isinstance(orelse, cst.Else):
        orelse = orelse.with_changes(body=orelse.body.with_changes(body=rest[0]))
    elif rest[0]:
        orelse = cst.Else(body=cst.IndentedBlock(body=rest[0]))
    return stmt.with_changes(body=stmt.body.with_changes(body=head), orelse=orelse)


def _same(a: list[cst.BaseStatement], b: list[cst.BaseStatement]) -> bool:
    return _normal(a) == _normal(b)


def _normal(block: list[cst.BaseStatement]) -> list[str]:
    # Printed and parsed again, not looked up in the chain's `ast` parse by position: the blocks compared hold
    # statements built here (the write, the `if`s `_rebuild` gives new bodies), which have no position in the source.
    return [ast.dump(ast.parse(code_of(s.with_changes(leading_lines=())).strip())) for s in block]
