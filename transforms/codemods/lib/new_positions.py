"""Positions for models that have none: counted where the model counts its past, handed in by compiled Decode.

Many models never name the positions of the tokens they compute. They read the past length off the cache
they are handed (`past_key_values_length = past_key_values[0][0].shape[2]`) and make what they need of it: a
causal mask of `past + new` columns, ALiBi for that many keys, positions from a padding mask's cumsum
(`OPTLearnedPositionalEmbedding`). A static cache needs the positions as a tensor to write at, and a compiled
Decode step must get them from its caller instead of from a length.

So the method that reads the past length gets a `position_ids` parameter, and where its caller passes none
(Prefill, the model's own generate loop), the positions are counted on from that length, as the model itself
counted them:

    if position_ids is None:
        position_ids = torch.arange(past_length, past_length + new_tokens, device=...).unsqueeze(0)

A statement the runtime evidence saw make exactly those positions out of something else (a mask's cumsum
sliced at the past length) takes them instead, and what only fed it goes.

Attention now reads every slot of the static cache in a compiled graph, so a tensor that method makes for the
`past + new` keys (the default 2-D mask of ones, from which Bloom builds ALiBi) is made for the slots attention
reads instead: all of them in a compiled graph, the written ones in eager calls (`graphmode_key_slots`).
"""
from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from graphmode.transforms.codemods.lib.call_graph import THREADED
from graphmode.transforms.cstutil import code_of, names_in, nodes_of_type, single_assignment, torch_call_name

KEY_SLOTS = "graphmode_key_slots"  # its code: helper-code/helpers.py, inserted by name
_FACTORIES = frozenset({"ones", "zeros", "full", "empty"})


@dataclass(frozen=True)
class Derivation:
    after: cst.BaseStatement  # the method's own statement after which the positions are known
    past: str  # the name holding the past length
    new: str  # the name holding the number of new tokens


def derivation(method: cst.FunctionDef) -> Derivation | None:
    """Where `method` knows both the past length, read off a tensor inside a parameter (the cache handed in:
    `P[0][0].shape[2]`, `P[0][0].size(-2)`), and the number of new tokens, unpacked from a shape
    (`batch_size, seq_length = input_ids.shape`); None when it does not read both."""
    params = {p.name.value for p in method.params.params}
    body = list(method.body.body)
    shapes = _shape_names(method)
    past = new = None
    past_at = new_at = -1
    for index, stmt in enumerate(body):
        for assign in nodes_of_type(stmt, cst.Assign):
            target = assign.targets[0].target if len(assign.targets) == 1 else None
            if past is None and isinstance(target, cst.Name) and _reads_length_off(assign.value, params):
                past, past_at = target.value, index
            elif new is None and isinstance(target, cst.Tuple) and len(target.elements) in (2, 3) \
                    and all(isinstance(e.value, cst.Name) for e in target.elements) \
                    and (_is_shape(assign.value) or code_of(assign.value) in shapes):
                new, new_at = target.elements[1].value.value, index
    if past is None or new is None:
        return None
    # The past length is read under a test of the cache (`if past_key_values[0] is not None:`) in some models:
    # the statement holding its last assignment is the one to follow.
    last = max(i for i, stmt in enumerate(body) for a in nodes_of_type(stmt, cst.Assign)
               if len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name)
               and a.targets[0].target.value == past)
    return Derivation(body[max(last, past_at, new_at)], past, new)


def derived_positions(found: Derivation, line_limit: int) -> cst.BaseStatement:
    """The `if position_ids is None:` block, wrapped where one line would pass the file's own line length."""
    count = f"{found.past}, {found.past} + {found.new}, device=next(self.parameters()).device"
    one_line = f"{THREADED} = torch.arange({count}).unsqueeze(0)"
    body = (one_line if len(one_line) + 12 <= line_limit
            else f"{THREADED} = torch.arange(\n        {count}\n    ).unsqueeze(0)")
    return cst.parse_statement(f"if {THREADED} is None:\n    {body}\n").with_changes(leading_lines=[cst.EmptyLine(
        indent=True,
        comment=cst.Comment("# graphmode: positions counted from the cached length if the caller passes none."))])


def key_length_sizes(method: cst.FunctionDef, found: Derivation) -> dict[cst.CSTNode, cst.CSTNode]:
    """Size elements of the tensors `method` creates for the `past + new` keys (any name computed from the past
    length, other than the past length alone) -> the key slots attention reads."""
    dependent = {found.past}
    for assign in nodes_of_type(method.body, cst.Assign):
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        if isinstance(target, cst.Name) and names_in(assign.value) & dependent:
            dependent.add(target.value)
    slots = cst.parse_expression(f"{KEY_SLOTS}(self, {THREADED})")
    sizes: dict[cst.CSTNode, cst.CSTNode] = {}
    for call in nodes_of_type(method.body, cst.Call):
        if torch_call_name(call) not in _FACTORIES:
            continue
        positional = [a.value for a in call.args if a.keyword is None]
        shape = positional[0] if len(positional) == 1 or torch_call_name(call) == "full" else None
        elements = [e.value for e in shape.elements] if isinstance(shape, (cst.Tuple, cst.List)) else positional
        for element in elements:
            used = names_in(element) & dependent
            if used and not (isinstance(element, cst.Name) and element.value == found.past):
                sizes[element] = slots
    return sizes


def dead_lengths(method: cst.FunctionDef, found: Derivation, sizes: dict[cst.CSTNode, cst.CSTNode]
                 ) -> set[cst.BaseStatement]:
    """The assignments of lengths computed from the past (`seq_length_with_past = seq_length + past`) that nothing
    reads once the sizes they gave are the key slots: statements to drop (a block they would empty stays)."""
    replaced = {id(n) for size in sizes for n in nodes_of_type(size, cst.Name)}
    assignments: dict[str, list[cst.SimpleStatementLine]] = {}
    for stmt in nodes_of_type(method.body, cst.SimpleStatementLine):
        assigned = single_assignment(stmt)
        if assigned and assigned[0] != found.past and not _may_change_state(assigned[1]):
            assignments.setdefault(assigned[0], []).append(stmt)
    own = {id(n) for stmts in assignments.values() for stmt in stmts for n in nodes_of_type(stmt, cst.Name)}
    # Names read anywhere but in these assignments and the replaced sizes; names the replaced sizes read.
    excluded = replaced | own
    read_elsewhere = {n.value for n in nodes_of_type(method.body, cst.Name) if id(n) not in excluded}
    read_by_sizes = {n.value for size in sizes for n in nodes_of_type(size, cst.Name)}
    dead: set[cst.BaseStatement] = set()
    for name, stmts in assignments.items():
        if name not in read_elsewhere and name in read_by_sizes:
            dead.update(stmts)
    for block in nodes_of_type(method.body, cst.IndentedBlock):
        if block.body and all(s in dead for s in block.body):
            dead -= set(block.body)
    return dead


def _reads_length_off(value: cst.BaseExpression, params: set[str]) -> bool:
    """`P[...][...].shape[d]` or `P[...].size(d)` somewhere in `value`, P a parameter: a length read off a tensor
    the caller handed in inside a container (the cache), not off the inputs themselves."""
    for node in m.findall(value, m.Subscript(value=m.Attribute(attr=m.Name("shape"))) |
                          m.Call(func=m.Attribute(attr=m.Name("size")))):
        holder = node.value.value if isinstance(node, cst.Subscript) else node.func.value
        if isinstance(holder, cst.Subscript):
            root = holder
            while isinstance(root, cst.Subscript):
                root = root.value
            if isinstance(root, cst.Name) and root.value in params:
                return True
    return False


def _is_shape(value: cst.BaseExpression) -> bool:
    """`x.shape`, `x.shape[:2]`, `x.size()`."""
    if isinstance(value, cst.Subscript):
        value = value.value
    if isinstance(value, cst.Attribute):
        return value.attr.value == "shape"
    return m.matches(value, m.Call(func=m.Attribute(attr=m.Name("size")), args=[]))


def _shape_names(method: cst.FunctionDef) -> set[str]:
    """Names bound to a shape in the method (`input_shape = input_ids.size()`)."""
    return {found[0] for stmt in nodes_of_type(method.body, cst.SimpleStatementLine)
            if (found := single_assignment(stmt)) and _is_shape(found[1])}


def take_positions(method: cst.FunctionDef,
                   stmt: cst.BaseStatement) -> tuple[cst.BaseStatement, set[cst.BaseStatement]]:
    """`stmt` (`name = <the positions, made of a mask and a length>`) as `name = position_ids`, and the statements
    of the method before it that only fed it (dead now): plain assignments no later statement reads."""
    name = single_assignment(stmt)[0]
    new = cst.parse_statement(f"{name} = {THREADED}\n").with_changes(leading_lines=[cst.EmptyLine(
        indent=True, comment=cst.Comment("# graphmode: the positions the caller passed (or counted from the cached "
                                         "length)."))])
    body = list(method.body.body)
    at = next(i for i, s in enumerate(body) if s is stmt)
    body[at] = new
    dead: set[cst.BaseStatement] = set()
    changed = True
    while changed:
        changed = False
        for index in range(at - 1, -1, -1):
            candidate = body[index]
            assigned = single_assignment(candidate)
            if candidate in dead or assigned is None or _may_change_state(assigned[1]) \
                    or _read_before_reassigned(assigned[0], [s for s in body[index + 1:] if s not in dead]):
                continue
            dead.add(candidate)
            changed = True
    return new, dead


def _read_before_reassigned(name: str, following: list[cst.BaseStatement]) -> bool:
    for stmt in following:
        assigned = single_assignment(stmt)
        if assigned is not None and assigned[0] == name:
            return name in names_in(assigned[1])
        if name in names_in(stmt):
            return True
    return False


def _may_change_state(value: cst.BaseExpression) -> bool:
    """A call that may write something: an in-place method (`x.add_()`) or a call on `self`."""
    for call in nodes_of_type(value, cst.Call):
        name = code_of(call.func)
        if name.endswith("_") and not name.endswith("__") or name.startswith("self."):
            return True
    return False
