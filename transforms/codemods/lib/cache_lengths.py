"""Lengths an attention method reads off the cache it is carried, counted from the positions on the static path.

Some remote code counts the tokens so far from the carried cache's length and makes the new tokens' positions of
that count. Qwen-7B's first modeling_qwen.py:

    kv_seq_len = hidden_states.size()[1]
    if layer_past:
        kv_seq_len += layer_past[0].shape[1]                  # the cache is [batch, seq, heads, dim]
    ...                                                       # a dynamic-NTK alpha set from kv_seq_len
    rotary_pos_emb = self.rotary_emb(kv_seq_len, ntk_alpha=ntk_alpha)   # a table of kv_seq_len rows
    q_pos_emb = q_pos_emb[:, -cur_len:, :, :]                 # its last rows: the new tokens'
    ...
    seq_start = key.size(1) - query.size(1)                   # after the cat: the key length
    seq_end = key.size(1)
    logn_tensor = self.logn_tensor[:, seq_start:seq_end, :, :]

Once the cache is a static buffer, the static path carries none: `kv_seq_len` would count the new tokens alone,
and every Decode token would be rotated as position 0. So the rewrite of the cache and of these lines go together
(`plan_cache_lengths`), or neither does:

- the length becomes `graphmode_key_slots(self, <slots>)`: the slots written so far in an eager call (Prefill, where
  it equals the original count, so an NTK alpha set from it is the same), every slot in a compiled graph (a
  constant, so a branch on it is settled and a table built for it has a fixed size);
- the last rows of a table built for that length (`t[:, -n:]`) become its rows at the positions;
- rows cut at the key length (`B[:, K - Q : K]`, K read off the keys after the cat) become the rows at the
  positions.

Only a length that makes positions is planned: one a table is built for and cut to its last rows, or one that
bounds a slice or is handed on as an offset (`offset=kv_seq_len - cur_len`). One that only sizes a table the model
indexes by its own `position_ids` (GPT-NeoX, Falcon) or a bias it cuts from the end (MPT) is left as it was: the
static path's count serves it. A length that makes positions but is read in another form, or used otherwise than to
build a table, to compare or inside a branch on such a comparison, is not planned: the cache is then left as it is,
and the length's line and the cat's go to a person together.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from graphmode.transforms.codemods.lib.helper_names import POSITION_LIMIT
from graphmode.transforms.codemods.lib.new_positions import KEY_SLOTS
from graphmode.transforms.cstutil import code_of, names_in, nodes_of_type, single_assignment, walk


@dataclass
class CacheLengths:
    """What the static path changes in one method: node -> replacement, with the summary of each edit."""

    replace: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)
    drop: set[cst.CSTNode] = field(default_factory=set)
    helpers: set[str] = field(default_factory=set)  # the helpers the replacements call
    edits: list[tuple[cst.CSTNode, str]] = field(default_factory=list)
    problems: list[tuple[cst.CSTNode, str]] = field(default_factory=list)


def plan_cache_lengths(method: cst.FunctionDef, cache: str, keys: str, dims: set[int], slots: str, where: str,
                       line_of: Callable[[cst.CSTNode], int], served: set[str]) -> CacheLengths:
    """The rewrite of the lengths `method` reads off `cache` (the parameter the pair of cats grows, `keys` the
    name the keys are grown into along the dim `dims` spells, counted from the start or the end), for the static
    path that writes at `slots`; `line_of` gives a node's line, for the problems. Lengths bound to a name in
    `served` are read only where another rewrite already takes the positions instead (offset_windows' calls).

    Only a length that makes positions is planned: one whose table's last rows are cut (`t[:, -n:]`), or one that
    bounds a slice or is handed on as an offset. A length that only sizes a table the model then indexes by its
    `position_ids` (GPT-NeoX, Falcon) or a bias it cuts from the end (MPT) is left as it was."""
    plan = CacheLengths()
    held = _held_by(method, cache)
    reads = [stmt for stmt in _statements(method) if _length_reads(stmt, held) and not _assigns(stmt, served)]
    for read in reads:
        name = _bound(read)
        if name is None:
            continue
        offset = _as_offset(method, name, read)
        if offset is None and not _plan_tables(method, name, slots, CacheLengths()).cut:
            continue  # it makes no positions: the count the static path gives serves what it feeds, as before
        found = _counted_length(read, cache, dims)
        stmt = _guard_of(method, read, cache) if found is not None else None
        if offset is not None or stmt is None:
            use = offset if offset is not None else read
            plan.problems.append((read, f"`{where}` counts `{name}` here from the length of the cache `{cache}`, "
                                        f"which the static path does not carry, and makes positions of it at line "
                                        f"{line_of(use)} (`{_first_line(use)}`) in a form not recognised (expected "
                                        f"`if {cache}: {name} += {cache}[0].shape[d]`, a table built for `{name}` and "
                                        "its last rows cut)"))
            continue
        misuse = _misused(method, name, stmt)
        if misuse is not None:
            plan.problems.append((stmt, f"`{where}` counts `{name}` here from the length of the cache `{cache}`, "
                                        f"which the static path does not carry, and uses it at line {line_of(misuse)} "
                                        f"(`{_first_line(misuse)}`) in a form whose static value is not known (it "
                                        "is taken from the positions only to build a table, to compare, or in a "
                                        "branch on such a comparison)"))
            continue
        start = _count_before(method, stmt, name)
        if start is not None:
            plan.drop.add(start)
        counted = cst.parse_statement(f"{name} = {KEY_SLOTS}(self, {slots})\n").with_changes(
            leading_lines=[*(start or stmt).leading_lines, cst.EmptyLine(indent=True, comment=cst.Comment(
                "# graphmode: the tokens so far, counted from the positions (the static path carries no cache to "
                "measure); every slot in a compiled graph."))])
        plan.replace[stmt] = counted
        plan.helpers.add(KEY_SLOTS)
        plan.edits.append((stmt, f"`{name}`, counted from the length of `{cache}`, taken from the positions "
                                 f"(`{KEY_SLOTS}(self, {slots})`)"))
        whole_read = _plan_tables(method, name, slots, plan).whole_read
        if whole_read is not None:
            plan.problems.append((stmt, f"`{where}` counts `{name}` here from the length of the cache `{cache}` and "
                                        f"builds a table for it, which line {line_of(whole_read)} "
                                        f"(`{_first_line(whole_read)}`) reads whole: a table built for the static "
                                        "path's slots would have more rows than that code expects"))
            continue
        _plan_key_length_rows(method, keys, dims, slots, plan)
    return plan


def _bound(stmt: cst.BaseStatement) -> str | None:
    """The name a statement binds alone (`n = ...`, `n += ...`); None for anything else."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    target = small.targets[0].target if isinstance(small, cst.Assign) and len(small.targets) == 1 else \
        small.target if isinstance(small, cst.AugAssign) else None
    return target.value if isinstance(target, cst.Name) else None


def _reads_directly(node: cst.BaseExpression, name: str) -> bool:
    """`n`, `n - k`, `n + k`: the length itself or shifted, not a value computed from it by a call."""
    if isinstance(node, cst.Name):
        return node.value == name
    return isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)) \
        and (_reads_directly(node.left, name) or _reads_directly(node.right, name))


def _as_offset(method: cst.FunctionDef, name: str, read: cst.BaseStatement) -> cst.CSTNode | None:
    """The first statement after `read` that bounds a slice with the length (`t[n - k : n]`) or hands it on as an
    offset (`f(k, offset=n - k)`): positions counted from it, which a compiled graph cannot count from a cache it
    is not handed."""
    skipped = set(walk(read))
    for stmt in _statements(method):
        if stmt in skipped or isinstance(stmt, (cst.If, cst.While)) or name not in names_in(stmt):
            continue
        for cut in nodes_of_type(stmt, cst.Slice):
            if any(bound is not None and _reads_directly(bound, name) for bound in (cut.lower, cut.upper)):
                return stmt
        for arg in (a for call in nodes_of_type(stmt, cst.Call) for a in call.args):
            if arg.keyword is not None and "offset" in arg.keyword.value and _reads_directly(arg.value, name):
                return stmt
    return None


def _count_before(method: cst.FunctionDef, guard: cst.If, name: str) -> cst.SimpleStatementLine | None:
    """The statement right before the guard that starts the count (`n = x.size(1)`), which the count taken from
    the positions replaces too; None when there is none."""
    for block in [method.body, *nodes_of_type(method.body, cst.IndentedBlock)]:
        body = list(block.body)
        if guard in body and body.index(guard) > 0:
            before = body[body.index(guard) - 1]
            assigned = single_assignment(before)
            if assigned is not None and assigned[0] == name and name not in names_in(assigned[1]):
                return before
    return None


def _assigns(stmt: cst.BaseStatement, names: set[str]) -> bool:
    """`stmt` binds one of `names` (`n = ...`, `n += ...`)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else \
        [small.target] if isinstance(small, cst.AugAssign) else []
    return any(isinstance(t, cst.Name) and t.value in names for t in targets)


def _first_line(node: cst.CSTNode) -> str:
    return code_of(node).strip().splitlines()[0]


def _statements(method: cst.FunctionDef) -> list[cst.BaseStatement]:
    """The method's statements at every depth, an `if` as one (its test) apart from the statements under it."""
    found = []
    for node in walk(method.body):
        if isinstance(node, cst.SimpleStatementLine) or isinstance(node, (cst.If, cst.While)):
            found.append(node)
    return found


def _held_by(method: cst.FunctionDef, cache: str) -> set[str]:
    """`cache` and the names bound to its tensors alone (`past_key, past_value = layer_past[0], layer_past[1]`)."""
    held = {cache}
    for stmt in nodes_of_type(method.body, cst.SimpleStatementLine):
        if len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Assign) or names_in(stmt.body[0].value) != {cache}:
            continue
        value = stmt.body[0].value
        parts = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        if not all(isinstance(p, (cst.Name, cst.Subscript)) for p in parts):
            continue
        for target in stmt.body[0].targets:
            held |= {n.value for n in nodes_of_type(target.target, cst.Name)}
    return held


def _measures(node: cst.CSTNode, held: set[str]) -> bool:
    """`X.shape` or `X.size(...)` with X read off a name in `held` (`len(cache)` counts its tensors, not slots)."""
    if not (isinstance(node, cst.Attribute) and node.attr.value in ("shape", "size")):
        return False
    base = node.value
    while isinstance(base, cst.Subscript):
        base = base.value
    return isinstance(base, cst.Name) and base.value in held


def _length_reads(stmt: cst.BaseStatement, held: set[str]) -> bool:
    """Whether the statement itself (an `if` or `while` by its test) measures a tensor of the cache."""
    part = stmt.test if isinstance(stmt, (cst.If, cst.While)) else stmt
    return any(_measures(node, held) for node in walk(part))


def _counted_length(stmt: cst.BaseStatement, cache: str, dims: set[int]) -> str | None:
    """`n += cache[0].shape[d]` (or `.size(d)`), d the growing dim: the keys' length added to a count -> "n"."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1 \
            or not isinstance(stmt.body[0], cst.AugAssign) or not isinstance(stmt.body[0].operator, cst.AddAssign) \
            or not isinstance(stmt.body[0].target, cst.Name):
        return None
    text = code_of(stmt.body[0].value).replace(" ", "")
    if text not in {form.format(cache=cache, dim=dim) for dim in dims
                    for form in ("{cache}[0].shape[{dim}]", "{cache}[0].size({dim})")}:
        return None
    return stmt.body[0].target.value


def _guard_of(method: cst.FunctionDef, stmt: cst.BaseStatement, cache: str) -> cst.If | None:
    """The `if cache:` / `if cache is not None:` whose block holds `stmt` alone (comments aside), with no else."""
    for node in nodes_of_type(method.body, cst.If):
        test = code_of(node.test).strip()
        if test in (cache, f"{cache} is not None") and node.orelse is None \
                and isinstance(node.body, cst.IndentedBlock) and list(node.body.body) == [stmt]:
            return node
    return None


def _misused(method: cst.FunctionDef, name: str, stmt: cst.BaseStatement) -> cst.CSTNode | None:
    """The first statement that reads `name` in a form the static length does not serve; None when every read is
    an argument of a call (a table built for that length), in a comparison, or under an `if` that compares it."""
    skipped = set(walk(stmt))
    guarded_by_test: set[cst.CSTNode] = set()
    for node in nodes_of_type(method.body, cst.If):
        if name in names_in(node.test):
            guarded_by_test |= set(walk(node.body))
    for node in walk(method.body):
        if node in skipped or not isinstance(node, (cst.SimpleStatementLine, cst.If, cst.While)):
            continue
        part = node.test if isinstance(node, (cst.If, cst.While)) else node
        if name not in names_in(part) or node in guarded_by_test:
            continue
        if isinstance(node, (cst.If, cst.While)):
            continue  # a test: a compiled graph settles it on the static length
        if single_assignment(node) is not None and single_assignment(node)[0] == name \
                and name not in names_in(single_assignment(node)[1]):
            continue  # the count before the cache's length is added (`n = x.size(1)`)
        if all(_as_call_argument(node, read) for read in nodes_of_type(node, cst.Name) if read.value == name):
            continue
        return node
    return None


def _as_call_argument(stmt: cst.CSTNode, read: cst.Name) -> bool:
    """`read` is a whole argument of a call in `stmt`, `f(n, ...)` or `f(..., length=n)`, and the statement binds
    what the call builds (a table for that length, which `_plan_tables` follows)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return False
    return any(arg.value is read for call in nodes_of_type(stmt, cst.Call) for arg in call.args)


def _views(value: cst.BaseExpression, tables: set[str], length: str) -> bool:
    """A table built for the length (`f(length, ...)`), or a view of one: a name holding it, a tuple of them,
    `(t,) * 2`, `t.to(...)`."""
    if isinstance(value, cst.Name):
        return value.value in tables
    if isinstance(value, cst.Call):
        if any(isinstance(a.value, cst.Name) and a.value.value == length for a in value.args):
            return True
        return isinstance(value.func, cst.Attribute) and _views(value.func.value, tables, length)
    if isinstance(value, cst.Tuple):
        return bool(value.elements) and all(_views(e.value, tables, length) for e in value.elements)
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply):
        return _views(value.left, tables, length) and isinstance(value.right, cst.Integer)
    return False


def _last_rows(element: cst.SubscriptElement) -> bool:
    """`-n:`: the last n rows."""
    cut = element.slice
    return isinstance(cut, cst.Slice) and cut.upper is None and cut.step is None \
        and isinstance(cut.lower, cst.UnaryOperation) and isinstance(cut.lower.operator, cst.Minus)


def _cut(value: cst.BaseExpression, tables: set[str]) -> int | None:
    """`t[:, -n:]` of a name holding a whole table -> the index of its `-n:` element; None for anything else."""
    if not (isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name) and value.value.value in tables):
        return None
    cuts = [i for i, element in enumerate(value.slice) if _last_rows(element)]
    return cuts[0] if len(cuts) == 1 else None


@dataclass
class _Tables:
    cut: bool = False  # a table's last rows were cut
    whole_read: cst.CSTNode | None = None  # the first statement that reads a whole table otherwise


def _plan_tables(method: cst.FunctionDef, length: str, slots: str, plan: CacheLengths) -> _Tables:
    """Tables built for the length, followed in source order: the call that builds one is given every slot the
    static path holds (`graphmode_position_limit`), so Prefill builds it once at its full size and no compiled step
    grows it; its last rows (`t[:, -n:]`) become its rows at the positions. Says whether rows were cut, and the first
    statement that reads a whole table otherwise (the static path would hand it more rows than the model's own code
    expects)."""
    found = _Tables()
    whole: set[str] = set()  # names holding a whole table at this point of the method
    for stmt in _statements(method):
        if isinstance(stmt, (cst.If, cst.While)):
            continue  # a test (`is not None`, `isinstance`) reads no rows
        small = stmt.body[0] if len(stmt.body) == 1 else None
        bound = {n.value for t in small.targets for n in nodes_of_type(t.target, cst.Name)} \
            if isinstance(small, cst.Assign) else set()
        if isinstance(small, cst.Assign) and _views(small.value, whole, length):
            for call in nodes_of_type(small.value, cst.Call):
                for arg in call.args:
                    if isinstance(arg.value, cst.Name) and arg.value.value == length:
                        plan.replace[arg] = arg.with_changes(value=cst.parse_expression(f"{POSITION_LIMIT}(self)"))
                        plan.helpers.add(POSITION_LIMIT)
                        plan.edits.append((call, f"`{code_of(call.func)}` builds its table for every slot the static "
                                                 f"path holds (`{POSITION_LIMIT}(self)`) instead of `{length}`: once, "
                                                 "in Prefill; its rows are taken at the positions"))
            whole |= bound
            continue
        index = _cut(small.value, whole) if isinstance(small, cst.Assign) else None
        if index is not None:
            subscript = small.value
            elements = list(subscript.slice)
            count = code_of(elements[index].slice.lower.expression)
            elements[index] = elements[index].with_changes(slice=cst.Index(cst.parse_expression(slots)))
            plan.replace[subscript] = subscript.with_changes(slice=elements)
            plan.edits.append((subscript, f"the rows of `{subscript.value.value}` (a table built for `{length}`) at "
                                          f"the positions (`{slots}`) instead of its last `{count}`"))
            found.cut = True
        elif names_in(stmt) & whole and found.whole_read is None:
            found.whole_read = stmt
        whole -= bound
    return found


def _key_length(value: cst.BaseExpression, keys: str, dims: set[int]) -> bool:
    """`keys.size(d)` or `keys.shape[d]`, d the growing dim."""
    text = code_of(value).replace(" ", "")
    return any(text in {f"{keys}.size({dim})", f"{keys}.shape[{dim}]"} for dim in dims)


def _plan_key_length_rows(method: cst.FunctionDef, keys: str, dims: set[int], slots: str, plan: CacheLengths) -> None:
    """`self.B[:, start:end]` with `start = K - Q` and `end = K` (K the keys' length after the cat, bound to names or
    written in place) -> `self.B[:, slots]`: a compiled graph's keys are every slot, the new tokens' rows are at the
    positions."""
    bound = {}
    for stmt in nodes_of_type(method.body, cst.SimpleStatementLine):
        assigned = single_assignment(stmt)
        if assigned is not None:
            bound.setdefault(assigned[0], []).append(assigned[1])

    def resolved(node: cst.BaseExpression | None) -> cst.BaseExpression | None:
        if isinstance(node, cst.Name) and len(bound.get(node.value, [])) == 1:
            return bound[node.value][0]
        return node

    for subscript in nodes_of_type(method.body, cst.Subscript):
        if not (isinstance(subscript.value, cst.Attribute) and code_of(subscript.value.value).strip() == "self"):
            continue
        for index, element in enumerate(subscript.slice):
            cut = element.slice
            if not isinstance(cut, cst.Slice) or cut.step is not None:
                continue
            start, end = resolved(cut.lower), resolved(cut.upper)
            if end is None or start is None or not _key_length(end, keys, dims) \
                    or not (isinstance(start, cst.BinaryOperation) and isinstance(start.operator, cst.Subtract)
                            and _key_length(start.left, keys, dims)):
                continue
            elements = list(subscript.slice)
            elements[index] = element.with_changes(slice=cst.Index(cst.parse_expression(slots)))
            plan.replace[subscript] = subscript.with_changes(slice=elements)
            plan.edits.append((subscript, f"the rows of `{code_of(subscript.value)}` at the positions (`{slots}`) "
                                          f"instead of cut at the key length `{code_of(cut.upper)}`"))
            break

