"""Small `ast` helpers shared by the rules and the analyses (transforms.analysis), and the tree walks the rules share.

A helper that reads Python's AST lives here; one that reads libcst's tree lives in transforms.cstutil, for the
codemods. The two files share no public name (tests/test_no_twins.py): a question both kinds of tree need answered
is asked under a name saying which tree it reads (`ast_dotted_name` here, `dotted_name` there), and a codemod that
needs a fact the analyses compute on Python's AST reads it off the chain's one parse of the text by position
(`GraphCodemod.ast_of`), not off a print of its libcst node parsed again.

libcst spells `True`, `False` and `None` as names; `ast` makes them constants. Where a libcst rule
tested for a name, these helpers treat those three constants as names too (see `name_of`), so that
the findings do not change.
"""
from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator

from graphmode.transforms.vocabulary import is_position_name

FUNCTION_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef)  # libcst's FunctionDef is both
SCOPE_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

# Fields that never hold a node a rule looks at: names, flags, operators and load/store contexts.
_SCALAR_FIELDS = frozenset(
    {"ctx", "op", "ops", "type_comment", "kind", "conversion", "level", "module", "is_async", "id", "attr",
     "name", "arg", "names", "kwd_attrs", "rest", "simple", "type_ignores", "tag"}
)


def _fields_table() -> dict[type, tuple[str, ...]]:
    table: dict[type, tuple[str, ...]] = {}
    for value in vars(ast).values():
        if isinstance(value, type) and issubclass(value, ast.AST):
            fields = tuple(f for f in value._fields if f not in _SCALAR_FIELDS)
            if value in (ast.Constant, ast.MatchSingleton):
                fields = ()
            table[value] = fields
    return table


# Node class -> the fields that may hold child nodes, in the order `ast` lists them.
CHILD_FIELDS: dict[type, tuple[str, ...]] = _fields_table()


def children(node: ast.AST) -> Iterator[ast.AST]:
    """Child nodes in source order (`ast` field order, corrected where it differs from the source): the step of
    `preorder`. cstutil's `_children` is the same step of its `walk` over libcst's tree; neither tree's fields
    name the other's children."""
    cls = node.__class__
    if cls is ast.IfExp:
        yield node.body
        yield node.test
        yield node.orelse
        return
    if cls is ast.Dict:
        for key, value in zip(node.keys, node.values):
            if key is not None:
                yield key
            yield value
        return
    if cls is ast.Call and node.args and node.keywords:
        yield node.func
        yield from ordered_args(node)
        return
    for field in CHILD_FIELDS[cls]:
        value = getattr(node, field)
        if value.__class__ is list:
            for item in value:
                if item is not None:
                    yield item
        elif value is not None:
            yield value


def preorder(node: ast.AST, skip: tuple[type, ...] = ()) -> Iterator[ast.AST]:
    """node and everything under it, parents first, in source order; subtrees of `skip` types are not entered."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if skip and isinstance(current, skip):
            continue
        stack.extend(reversed(list(children(current))))


def statements(body: Iterable[ast.stmt], into_scopes: bool = True) -> Iterator[ast.stmt]:
    """Every statement of a block and of the blocks nested in it, in source order. With into_scopes
    False, the bodies of nested functions and classes are not entered (the def itself is yielded)."""
    for stmt in body:
        yield stmt
        if not into_scopes and isinstance(stmt, SCOPE_TYPES):
            continue
        for field in ("body", "handlers", "orelse", "finalbody", "cases"):
            block = getattr(stmt, field, None)
            if not block:
                continue
            for item in block:
                if isinstance(item, ast.stmt):
                    yield from statements((item,), into_scopes)
                else:  # an except handler or a match case
                    yield from statements(item.body, into_scopes)


def ordered_args(call: ast.Call) -> list[ast.expr | ast.keyword]:
    """A call's arguments, positional (`ast.Starred` for `*a`) and keyword (`ast.keyword`, `arg` None for
    `**k`), in source order, as libcst's `Call.args` lists them."""
    if not call.keywords:
        return list(call.args)
    if not call.args:
        return list(call.keywords)
    return sorted([*call.args, *call.keywords], key=lambda a: (a.lineno, a.col_offset))


def first_arg(call: ast.Call) -> ast.expr | ast.keyword | None:
    """The first argument in source order, or None."""
    if call.args and call.keywords:
        a, k = call.args[0], call.keywords[0]
        return a if (a.lineno, a.col_offset) < (k.lineno, k.col_offset) else k
    if call.args:
        return call.args[0]
    return call.keywords[0] if call.keywords else None


def arg_value(arg: ast.expr | ast.keyword) -> ast.expr:
    """What libcst calls `Arg.value`: the expression, without `*`, `**` or `name=`."""
    if isinstance(arg, (ast.keyword, ast.Starred)):
        return arg.value
    return arg


def is_positional(arg: ast.expr | ast.keyword) -> bool:
    """libcst's `arg.keyword is None`: positional, `*a` and `**k` alike."""
    return not isinstance(arg, ast.keyword) or arg.arg is None


def is_starred(arg: ast.expr | ast.keyword) -> bool:
    """libcst's `arg.star`: `*a` or `**k`."""
    return isinstance(arg, ast.Starred) or (isinstance(arg, ast.keyword) and arg.arg is None)


def name_of(node: ast.AST | None) -> str | None:
    """The name of what libcst parses as a `Name`: a name, or the constants True, False and None."""
    if node.__class__ is ast.Name:
        return node.id
    if node.__class__ is ast.Constant and (node.value is None or node.value is True or node.value is False):
        return str(node.value)
    return None


def ast_dotted_name(node: ast.AST) -> str | None:
    """`torch.nn.functional.pad` -> "torch.nn.functional.pad"; None for anything not a plain dotted name.

    cstutil's `dotted_name` asks the same of a libcst node. Both stay: the rules read Python's AST and import no
    libcst (transforms.scan), and the codemods ask it of nodes they build, which have no place in this parse; a
    position look-up (`GraphCodemod.ast_of`) would also cost a codegen of the statement, for a question about a
    name."""
    if node.__class__ is ast.Attribute:
        base = ast_dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return name_of(node)


def ast_torch_call_name(node: ast.AST) -> str | None:
    """For a call like `torch.full(...)`, returns "full"; None when it is not a `torch.X` call. cstutil's
    `torch_call_name` asks it of libcst's tree, for the reasons `ast_dotted_name` gives."""
    if node.__class__ is ast.Call:
        func = node.func
        if func.__class__ is ast.Attribute and func.value.__class__ is ast.Name and func.value.id == "torch":
            return func.attr
    return None


def method_call_name(node: ast.AST) -> str | None:
    """For `x.item()` returns "item"; None when the call is not an attribute call. The only one: the codemods
    ask only whether a method is called under a node (cstutil's `contains_call`)."""
    if node.__class__ is ast.Call and node.func.__class__ is ast.Attribute:
        return node.func.attr
    return None


def is_position_param(param: ast.arg) -> bool:
    """A parameter that carries a Python-int position (see POSITION_PARAM_NAMES). The parsed source's
    `has_position_param` and `position_functions` use it too; cstutil's `position_params` answers for a libcst
    function, whose parameters the codemods rewrite."""
    annotation = param.annotation
    if annotation is None:
        return is_position_name(param.arg, None)
    return is_position_name(param.arg, annotation.id if annotation.__class__ is ast.Name else "")


def ast_names_in(node: ast.AST) -> set[str]:
    """Every bare name referenced anywhere under node (attribute and keyword names excluded; lambda
    parameters and True/False/None included, as libcst has them).

    cstutil's `names_in` asks the same of libcst's tree, for the reasons `ast_dotted_name` gives: the codemods ask
    it of the statements they build and rebuild. On a def, a class, an import or an
    `except ... as` the two differ: libcst spells those names as `Name` nodes, `ast` as strings."""
    found: set[str] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        cls = current.__class__
        if cls is ast.Name:
            found.add(current.id)
            continue
        if cls is ast.Constant:
            name = name_of(current)
            if name is not None:
                found.add(name)
            continue
        if cls is ast.arg:
            found.add(current.arg)
        for field in CHILD_FIELDS[cls]:
            value = getattr(current, field)
            if value.__class__ is list:
                stack.extend(v for v in value if v is not None)
            elif value is not None:
                stack.append(value)
    return found
