"""Small libcst helpers shared by the codemods, which rewrite libcst's tree.

Their counterparts on Python's AST, for the rules and the analyses, live in transforms.analysis.astutil; the two
files share no public name (tests/test_no_twins.py). A helper here that answers a question astutil also answers says
why both are kept.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import libcst as cst
import libcst.matchers as m


from graphmode.transforms.analysis.growing_caches import appends_to, cat_pieces
from graphmode.transforms.analysis.host_reads import host_sync
from graphmode.transforms.dispatch import Computed
from graphmode.transforms.positions import code_for_node
from graphmode.transforms.vocabulary import POSITION_PARAM_NAMES, POSITION_TENSOR, TENSOR_FACTORIES, is_position_name

__all__ = ["POSITION_PARAM_NAMES", "POSITION_TENSOR", "TENSOR_FACTORIES"]
_Node = TypeVar("_Node", bound=cst.CSTNode)


def dotted_name(node: cst.CSTNode) -> str | None:
    """`torch.nn.functional.pad` -> "torch.nn.functional.pad"; None for anything not a plain dotted name.

    astutil's `ast_dotted_name` asks the same of Python's AST. Both stay: the codemods ask it of nodes they build
    (no position in the chain's `ast` parse) and, looking for an idiom, of every call in a function, where a
    look-up by position would cost a codegen of the statement; the rules import no libcst."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def torch_call_name(node: cst.CSTNode) -> str | None:
    """For a call like `torch.full(...)`, returns "full"; None when it is not a `torch.X` call. astutil's
    `ast_torch_call_name` asks it of Python's AST, for the reasons `dotted_name` gives."""
    if isinstance(node, cst.Call):
        name = dotted_name(node.func)
        if name and name.startswith("torch.") and name.count(".") == 1:
            return name.split(".", 1)[1]
    return None


def position_params(func: cst.FunctionDef) -> list[cst.Param]:
    """The function's parameters that carry a Python-int position (see POSITION_PARAM_NAMES), in order.

    astutil's `is_position_param` judges one parameter of Python's AST, for the rules and the parsed source's
    `position_functions`; the codemods need the libcst `Param` itself, to rewrite it and its uses."""
    found = []
    for param in func.params.params:
        annotation = param.annotation.annotation if param.annotation else None
        if is_position_name(param.name.value, None if annotation is None else
                            annotation.value if isinstance(annotation, cst.Name) else ""):
            found.append(param)
    return found


def position_param(func: cst.FunctionDef) -> cst.Param | None:
    """The first of `position_params`, or None."""
    return next(iter(position_params(func)), None)


# Whitespace and punctuation: no search here looks for them, and leaving them out halves a walk.
UNWALKED = (cst.BaseParenthesizableWhitespace, cst.EmptyLine, cst.TrailingWhitespace, cst.Newline, cst.Comment,
            cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace,
            cst.RightCurlyBrace, cst.Comma, cst.Dot, cst.Colon, cst.AssignEqual, cst.Semicolon, cst.BaseBinaryOp,
            cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseUnaryOp, cst.BaseAugOp)
# Node types whose fields are not declared in source order: their children in the order a CSTVisitor visits them.
_SOURCE_ORDER: dict[type, tuple[str, ...]] = {
    cst.Arg: ("keyword", "value"),
    cst.ClassDef: ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    cst.FunctionDef: ("decorators", "name", "type_parameters", "params", "returns", "body"),
    cst.ExceptHandler: ("type", "name", "body"),
    cst.ExceptStarHandler: ("type", "name", "body"),
    cst.IfExp: ("body", "test", "orelse"),
}


@functools.cache
def child_fields(node_type: type) -> tuple[str, ...]:
    """A node type's dataclass fields, in source order: every child is held in one, alone or in a sequence."""
    names = [f.name for f in dataclasses.fields(node_type)]
    first = [n for n in _SOURCE_ORDER.get(node_type, ()) if n in names]
    return (*first, *(n for n in names if n not in first))


def _children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The node's children in source order, whitespace and punctuation left out: libcst's `children`, read off
    the fields at a fraction of the cost (tests/test_pipeline_shortcuts.py holds the two to the same order). The
    step of `walk`; astutil's `children` is the same step of `preorder` over Python's AST."""
    found: list[cst.CSTNode] = []
    walked = _WALKED
    for name in _CHILD_FIELDS[type(node)]:
        value = getattr(node, name)
        kind = type(value)
        if kind is tuple or kind is list:
            found.extend([c for c in value if walked[type(c)]])
        elif walked[kind]:
            found.append(value)
    return found


@functools.cache
def _walked(kind: type) -> bool:
    """Whether `walk` goes into a value of this type: a node, not whitespace or punctuation. Asked of the type once:
    an `isinstance` against libcst's abstract classes costs more than the rest of a walk's step."""
    return issubclass(kind, cst.CSTNode) and not issubclass(kind, UNWALKED)


# `_children` asks both for every node and child a walk meets: dict items, not functools.cache calls (a quarter of a
# walk's cost).
_CHILD_FIELDS: dict[type, tuple[str, ...]] = Computed(child_fields)
_WALKED: dict[type, bool] = Computed(_walked)


def walk(node: cst.CSTNode, skip: Callable[[cst.CSTNode], list[cst.CSTNode] | None] | None = None
         ) -> Iterator[cst.CSTNode]:
    """The node and everything under it in the order a CSTVisitor visits them (whitespace and punctuation left
    out). `skip(n)` may name the children of `n` to walk instead of all of them (None: all)."""
    pending = [node]
    while pending:
        current = pending.pop()
        yield current
        chosen = skip(current) if skip is not None else None
        pending.extend(reversed(_children(current) if chosen is None else chosen))


def statements_only(node: cst.CSTNode) -> list[cst.CSTNode] | None:
    """`walk`'s `skip` for a walk after statements (and the blocks and clauses that hold them): it goes no deeper
    than a simple statement line, an expression, parameters or a decorator, which hold none."""
    return [] if _HOLDS_NO_STATEMENT[type(node)] else None


@functools.cache
def _holds_no_statement(kind: type) -> bool:
    return issubclass(kind, (cst.SimpleStatementLine, cst.BaseExpression, cst.Parameters, cst.Decorator))


_HOLDS_NO_STATEMENT: dict[type, bool] = Computed(_holds_no_statement)  # asked at every node of a statements' walk


def with_blocks(node: _Node, blocks: Mapping[cst.CSTNode, cst.CSTNode]) -> _Node:
    """`node` with each key of `blocks` (a block or statement under it, by identity) swapped for its value, as
    `fusion.replaced` swaps them, but only the nodes on the way to one are built again: every other stays the node it
    was (a visit builds every node again). A key under another key goes with the one it is under."""
    new = blocks.get(node)
    if new is not None:
        return new
    if _holds_no_statement(type(node)):
        return node
    changes: dict[str, object] = {}
    for name in child_fields(type(node)):
        value = getattr(node, name)
        kind = type(value)
        if kind is tuple or kind is list:
            items = [with_blocks(c, blocks) if _walked(type(c)) else c for c in value]
            if any(new is not old for new, old in zip(items, value)):
                changes[name] = items
        elif _walked(kind):
            child = with_blocks(value, blocks)
            if child is not value:
                changes[name] = child
    return node.with_changes(**changes) if changes else node


def types_under(node: cst.CSTNode, known: dict[cst.CSTNode, frozenset[type]]) -> frozenset[type]:
    """The types of the nodes strictly under `node` (whitespace and punctuation left out, as `walk` leaves them).
    `known` holds the answer for the classes and functions asked about before: a node never changes, so a table the
    codemod chain hands from one text to the next stays true of every statement the codemods left as it was."""
    found = known.get(node)
    if found is None:
        kinds: set[type] = set()
        add = kinds.add
        pending = _children(node)
        while pending:
            current = pending.pop()
            kind = type(current)
            add(kind)
            if kind is cst.FunctionDef or kind is cst.ClassDef:
                kinds.update(types_under(current, known))
            else:
                pending.extend(_children(current))
        found = known[node] = frozenset(kinds)
    return found


def class_level(cls: cst.ClassDef, known: dict[cst.CSTNode, tuple[frozenset[type], tuple[str, ...]]]
                ) -> tuple[frozenset[type], tuple[str, ...]]:
    """The types of the nodes under a class outside the bodies of its functions (a function's decorators, name,
    parameters and body left out: the function node itself counts), and the qualified names of those functions
    relative to the class (`method`, `Inner.method`). `known`: as `types_under` takes it."""
    found = known.get(cls)
    if found is None:
        kinds: set[type] = set()
        functions: list[str] = []
        pending: list[tuple[cst.CSTNode, str]] = [(child, "") for child in _children(cls)]
        while pending:
            current, prefix = pending.pop()
            kind = type(current)
            kinds.add(kind)
            if kind is cst.FunctionDef:
                functions.append(prefix + current.name.value)
            else:
                inner = f"{prefix}{current.name.value}." if kind is cst.ClassDef else prefix
                pending.extend((child, inner) for child in _children(current))
        found = known[cls] = (frozenset(kinds), tuple(functions))
    return found


def _references_only(node: cst.CSTNode) -> list[cst.CSTNode] | None:
    if isinstance(node, (cst.Attribute, cst.Arg)):
        return [node.value]  # an attribute's name, a keyword's name: not references
    return None


def names_in(node: cst.CSTNode) -> set[str]:
    """Every bare Name referenced anywhere under node (attribute names excluded). astutil's `ast_names_in` asks it
    of Python's AST, for the reasons `dotted_name` gives: here it is asked of statements the codemods build and
    rebuild."""
    return {n.value for n in walk(node, _references_only) if isinstance(n, cst.Name)}


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Every call under node (node included), outermost first, in source order."""
    return [n for n in walk(node) if isinstance(n, cst.Call)]


def nodes_of_type(node: cst.CSTNode, node_type: type[_Node]) -> list[_Node]:
    """Every node of that type under node (node included), in source order: `m.findall` for a bare type."""
    return [n for n in walk(node) if isinstance(n, node_type)]


def contains_call(node: cst.CSTNode, method: str) -> bool:
    """True when `.method()` is called anywhere under node (the one question the codemods ask that astutil's
    `method_call_name` answers for the rules)."""
    return any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == method
               for n in walk(node))


def host_sync_call(node: cst.CSTNode) -> str | None:
    """The host sync node is, by its method's name (`t.item()` -> "item"), else None. Which calls are host syncs is
    transforms.analysis.host_reads' to say, for GM101 too."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        positional = sum(arg.keyword is None for arg in node.args)
        return host_sync(node.func.attr.value, positional, len(node.args) - positional)
    return None


def reads_host_value(node: cst.CSTNode) -> bool:
    """True when a host sync (`host_sync_call`) is called anywhere under node."""
    return any(host_sync_call(n) for n in walk(node))


def find_method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    for stmt in cls.body.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return stmt
    return None


def code_of(node: cst.CSTNode) -> str:
    return code_for_node(node)


def single_assignment(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """`name = value` on a line of its own -> (name, value); None for anything else."""
    if (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Assign)
        and len(stmt.body[0].targets) == 1
        and isinstance(stmt.body[0].targets[0].target, cst.Name)
    ):
        return stmt.body[0].targets[0].target.value, stmt.body[0].value
    return None


def string_tuple(names: list[str]) -> str:
    """The code of a tuple of these strings: `("a",)`, `("a", "b")`."""
    quoted = [f'"{name}"' for name in names]
    return f"({quoted[0]},)" if len(quoted) == 1 else f"({', '.join(quoted)})"


def is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _plus_position(node: cst.BaseExpression | None, name: str) -> bool:
    """`P + n` or `n + P`, where P is the Name `name`."""
    return m.matches(node, m.BinaryOperation(left=m.Name(name), operator=m.Add())
                     | m.BinaryOperation(operator=m.Add(), right=m.Name(name)))


def is_position_window(element: cst.SubscriptElement, name: str) -> bool:
    """`P : P + n` (or `P : n + P`): the slots of the tokens being computed, at Python-int position P."""
    part = element.slice
    return (isinstance(part, cst.Slice) and part.step is None and isinstance(part.lower, cst.Name)
            and part.lower.value == name and _plus_position(part.upper, name))


def is_position_prefix(element: cst.SubscriptElement, name: str) -> bool:
    """`: P + n` (or `0 : P + n`): everything written so far, up to and including the new tokens."""
    part = element.slice
    return (isinstance(part, cst.Slice) and part.step is None and _plus_position(part.upper, name)
            and (part.lower is None or (isinstance(part.lower, cst.Integer) and part.lower.value == "0")))


def is_full_slice(element: cst.SubscriptElement) -> bool:
    """`:` on its own."""
    part = element.slice
    return isinstance(part, cst.Slice) and part.lower is None and part.upper is None and part.step is None


def self_attribute_name(node: cst.CSTNode) -> str | None:
    """`self.X` -> "X"; None for anything else."""
    return node.attr.value if m.matches(node, m.Attribute(value=m.Name("self"))) else None


def only_raises(stmt: cst.CSTNode) -> bool:
    """`if <check>: raise ...` without else: a check, not a path."""
    return isinstance(stmt, cst.If) and stmt.orelse is None and isinstance(stmt.body, cst.IndentedBlock) and all(
        isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, cst.Raise) for x in s.body)
        for s in stmt.body.body)


def none_test(test: cst.BaseExpression) -> tuple[str, bool] | None:
    """`name is None` -> (name, True), `name is not None` -> (name, False); None for anything else."""
    if not (isinstance(test, cst.Comparison) and isinstance(test.left, cst.Name) and len(test.comparisons) == 1):
        return None
    target = test.comparisons[0]
    if not (isinstance(target.comparator, cst.Name) and target.comparator.value == "None"):
        return None
    if isinstance(target.operator, cst.Is):
        return test.left.value, True
    if isinstance(target.operator, cst.IsNot):
        return test.left.value, False
    return None


@dataclass(frozen=True)
class AppendingCat:
    """`X = torch.cat((OLD, X), dim=D)`: X grows by itself appended to OLD (the shape of a growing cache)."""

    stmt: cst.SimpleStatementLine
    target: str
    past: cst.BaseExpression  # OLD
    dim: int
    # Only X's last row along D is appended (`X[-1, ...].unsqueeze(0)`, `X[-1:]`): the same as X wherever one token
    # is new, as in every Decode step.
    last_row: bool = False


def integer_value(node: cst.BaseExpression) -> int | None:
    """`2` -> 2, `-2` -> -2; None for anything else."""
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) \
            and isinstance(node.expression, cst.Integer):
        return -int(node.expression.value)
    return None


def _last_row_of(piece: cst.BaseExpression, dim: int) -> str | None:
    """The name X when `piece` is X's last row along non-negative `dim`, its rank kept: `X[-1, ...].unsqueeze(0)`,
    `X[:, -1].unsqueeze(1)`, `X[-1:]`, `X[:, -1:, ...]`; None for anything else."""
    unsqueezed = isinstance(piece, cst.Call) and isinstance(piece.func, cst.Attribute) \
        and piece.func.attr.value == "unsqueeze" and len(piece.args) == 1 and integer_value(piece.args[0].value) == dim
    subscript = piece.func.value if unsqueezed else piece
    if not (isinstance(subscript, cst.Subscript) and isinstance(subscript.value, cst.Name)) \
            or len(subscript.slice) <= dim:
        return None
    elements = list(subscript.slice)
    row = elements[dim].slice
    if unsqueezed:
        last = isinstance(row, cst.Index) and integer_value(row.value) == -1
    else:
        last = isinstance(row, cst.Slice) and row.lower is not None and integer_value(row.lower) == -1 \
            and row.upper is None and row.step is None
    rest = elements[:dim] + elements[dim + 1:]
    whole = all(is_full_slice(e) or (isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Ellipsis))
                for e in rest)
    return subscript.value.value if last and whole else None


def appending_cat(stmt: cst.CSTNode, last_row: bool = False) -> AppendingCat | None:
    """The statement as an AppendingCat (list or tuple of two pieces, dim by keyword or position), or None. With
    `last_row`, also where only the last row of the tensor assigned is appended (`AppendingCat.last_row`)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return None
    assign = stmt.body[0]
    call = assign.value
    if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name) or torch_call_name(call) != "cat":
        return None
    target = assign.targets[0].target.value
    pieces = call.args[0].value if call.args else None
    dims = [integer_value(a.value) for a in call.args[1:] if a.keyword is None or a.keyword.value == "dim"]
    # What a growing cache is, GM301's too, is decided in transforms.analysis.growing_caches.
    parts = cat_pieces([e.value for e in pieces.elements] if isinstance(pieces, (cst.List, cst.Tuple)) else None, dims)
    if parts is None or parts.dim is None:
        return None
    old, new, dim = parts.old, parts.new, parts.dim
    old_names = names_in(old)
    if appends_to(target, new.value if isinstance(new, cst.Name) else None, old_names, dim):
        return AppendingCat(stmt, target, old, dim)
    if last_row and dim >= 0 and appends_to(target, _last_row_of(new, dim), old_names, dim):
        return AppendingCat(stmt, target, old, dim, last_row=True)
    return None


def qualified_functions(module: cst.Module) -> Iterator[tuple[str, cst.FunctionDef]]:
    """Top-level functions and the methods of top-level (and nested) classes, by qualified name."""
    def walk_body(body, prefix: str):
        for stmt in body:
            if isinstance(stmt, cst.FunctionDef):
                yield prefix + stmt.name.value, stmt
            elif isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
                yield from walk_body(stmt.body.body, f"{prefix}{stmt.name.value}.")
    yield from walk_body(module.body, "")


def short_code(code: str, limit: int = 60) -> str:
    """Source code on one line, cut to `limit` characters with "...": a construct named in an item's words."""
    code = " ".join(code.split())
    return code if len(code) <= limit else code[:limit - 3] + "..."
