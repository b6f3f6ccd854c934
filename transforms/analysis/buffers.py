"""Which names a file makes buffers, and which assignments give a buffer its first value: shared by GM203 and
buffers_in_place, both read off Python's AST."""
from __future__ import annotations

import ast


def registered_buffers(tree: ast.AST) -> frozenset[str]:
    """The names the code makes buffers, in any class: `register_buffer("name", ...)` and `self.name =
    nn.Buffer(...)`."""
    return frozenset(name for node in ast.walk(tree) if (name := _buffer_made(node)) is not None)


def first_value_lines(function: ast.AST) -> frozenset[int]:
    """The lines of `self.name = ...` under `if self.name is None:` in the function: a buffer's first value, bound
    once (nothing was captured against it yet)."""
    found: set[int] = set()
    for node in ast.walk(function):
        tested = _none_tested(node.test) if node.__class__ is ast.If else None
        if tested is not None:
            found.update(inner.lineno for statement in node.body for inner in ast.walk(statement)
                         if inner.__class__ is ast.Assign and len(inner.targets) == 1
                         and ast.unparse(inner.targets[0]) == tested)
    return frozenset(found)


def _buffer_made(node: ast.AST) -> str | None:
    """The buffer's name where `node` is `x.register_buffer("name", ...)` or `x.name = nn.Buffer(...)`."""
    if node.__class__ is ast.Call and _callee(node.func) == "register_buffer" and node.args:
        first = node.args[0]
        return first.value if first.__class__ is ast.Constant and isinstance(first.value, str) else None
    return _buffer_assigned(node) if node.__class__ is ast.Assign else None


def _buffer_assigned(node: ast.Assign) -> str | None:
    target = node.targets[0] if len(node.targets) == 1 else None
    made = node.value.__class__ is ast.Call and _callee(node.value.func) == "Buffer"
    return target.attr if made and target.__class__ is ast.Attribute else None


def _callee(func: ast.expr) -> str | None:
    return func.id if func.__class__ is ast.Name else func.attr if func.__class__ is ast.Attribute else None


def _none_tested(test: ast.expr) -> str | None:
    """The code of `x` where the test is `x is None`."""
    if test.__class__ is ast.Compare and len(test.ops) == 1 and test.ops[0].__class__ is ast.Is \
            and test.comparators[0].__class__ is ast.Constant and test.comparators[0].value is None:
        return ast.unparse(test.left)
    return None
