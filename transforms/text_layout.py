"""The layout of a tree parsed from a text, read off that text instead of generating the tree's code again.

libcst gives back the text it parsed, character for character, so the code `positions.layout_of` would generate for
the chain's first tree is the file itself. What the layout records besides (each node's parent, where each statement
of the module's body starts, the methods of its classes and the statements of their bodies) needs the lines each part
spans, and those are counted in the tree: a line ends at a `Newline` node or inside a token that holds line breaks
(a string, or a backslash continuation in whitespace). A walk that counts them and notes parents costs about half a
generation of the code, and the chain's first layout was an eighth of its time. tests/test_pipeline_shortcuts.py holds
the result to `layout_of`'s.
"""
from __future__ import annotations

import dataclasses
import re

import libcst as cst

from graphmode.transforms.dispatch import Computed
from graphmode.transforms.positions import Layout, MethodLayout, StatementLayout, all_parents, newlines_in

_Parents = dict[cst.CSTNode, cst.CSTNode]


def layout_of_parsed(module: cst.Module, text: str) -> Layout | None:
    """`positions.layout_of(module)` for a module libcst parsed from `text`; None where the code is not the text line
    for line (a module without a trailing newline, whose last one libcst leaves out; a byte-order mark, which it
    drops) or holds what no node counts (an empty block, which generates `pass`)."""
    if not module.has_trailing_newline or not module.body or text.startswith("\ufeff"):
        return None
    reader = _Reader(text)
    top: _Parents = {}
    reader.line += _tally_lines(module.header, module, top)
    first_lines: dict[cst.CSTNode, int] = {}
    statement_texts: dict[cst.CSTNode, str] = {}
    statement_parents: dict[cst.CSTNode, _Parents] = {}
    statement_methods: dict[cst.CSTNode, dict[cst.CSTNode, MethodLayout]] = {}
    for statement in module.body:
        top[statement] = module
        first = first_lines[statement] = reader.line
        below = statement_parents[statement] = {}
        if type(statement) is cst.ClassDef and type(statement.body) is cst.IndentedBlock:
            methods = _class(statement, below, reader, module.default_indent)
            if methods is None:
                return None
            if methods:
                statement_methods[statement] = methods
        else:
            reader.line += _tally(statement, below)
        statement_texts[statement] = reader.text(first, reader.line)
    reader.line += _tally_lines(module.footer, module, top)
    if reader.line != reader.lines:  # the counts missed a line: the text is not what they assume
        return None
    return Layout(text, all_parents(top, statement_parents, statement_methods), first_lines, statement_texts,
                  statement_parents, (module.default_indent, module.default_newline), statement_methods, top)


class _Reader:
    """The text by lines (ended as libcst ends them: `\\r\\n`, `\\r` or `\\n`), and the line the count has reached."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._starts = [0, *(found.end() for found in re.finditer(r"\r\n|\r|\n", text))]
        self.lines = len(self._starts)  # the line after the last line break
        self.line = 1

    def text(self, first: int, end: int) -> str:
        """Lines `first` up to `end` (not included), counted from 1."""
        # A count past the text's end is a count gone wrong, which `layout_of_parsed` finds at the end.
        return self._text[self._starts[min(first, self.lines) - 1]:self._starts[min(end, self.lines) - 1]]


def _class(cls: cst.ClassDef, below: _Parents, reader: _Reader, default_indent: str
           ) -> dict[cst.CSTNode, MethodLayout] | None:
    """Counts the lines of a top-level class, member by member, and lays out its methods (the parents of the nodes
    outside them go into `below`); None where a block is empty."""
    block = cls.body
    first = reader.line
    footer = _tally_above_body(cls, below, reader)
    if not block.body:
        return None
    indent = (block.indent or default_indent,)
    methods: dict[cst.CSTNode, MethodLayout] = {}
    for member in block.body:
        below[member] = block
        if type(member) is cst.FunctionDef:
            method = _method(member, reader, indent, first, default_indent)
            if method is None:
                return None
            methods[member] = method
        else:
            reader.line += _tally(member, below)
    reader.line += footer
    return methods


def _method(method: cst.FunctionDef, reader: _Reader, indent: tuple[str, ...], class_line: int,
            default_indent: str) -> MethodLayout | None:
    """Counts the lines of a method of a top-level class, statement by statement of its body; None where its body is
    an empty block."""
    first = reader.line
    parents: _Parents = {}
    statements: dict[cst.CSTNode, StatementLayout] = {}
    if type(method.body) is not cst.IndentedBlock:
        reader.line += _tally(method, parents)
    else:
        block = method.body
        footer = _tally_above_body(method, parents, reader)
        if not block.body:
            return None
        inner = (*indent, block.indent or default_indent)
        for statement in block.body:
            parents[statement] = block
            start = reader.line
            own: _Parents = {}
            reader.line += _tally(statement, own)
            statements[statement] = StatementLayout(start - first, inner, reader.text(start, reader.line), own)
        reader.line += footer
    return MethodLayout(first - class_line, indent, reader.text(first, reader.line), parents, statements)


def _tally_above_body(node: cst.ClassDef | cst.FunctionDef, into: _Parents, reader: _Reader) -> int:
    """Counts the lines of a class's or a function's code above the statements of its block (its parents into
    `into`); the lines of the block's footer, which come after the statements, are returned to be counted there."""
    block = node.body
    reader.line += _tally_fields(node, into, skip=("body",))
    into[block] = node
    reader.line += _tally_fields(block, into, skip=("body", "footer"))
    for line in block.footer:
        into[line] = block
    return sum(_tally(line, into) for line in block.footer)


def _tally_lines(lines: list[cst.CSTNode], module: cst.Module, top: _Parents) -> int:
    """`_tally` of the module's header or footer lines, whose parent is the module."""
    for line in lines:
        top[line] = module
    return sum(_tally(line, top) for line in lines)


def _tally_fields(node: cst.CSTNode, into: _Parents, skip: tuple[str, ...]) -> int:
    """`_tally` of the node's children but those in the fields `skip`; their parents (the node for each child) go
    into `into` too."""
    count = 0  # a class, a function or a block: no line break of its own, only its children's
    for name in _FIELDS[type(node)]:
        if name in skip:
            continue
        value = getattr(node, name)
        for child in (value if type(value) in (tuple, list) else (value,)):
            if _IS_NODE[type(child)]:
                into[child] = node
                count += _tally(child, into)
    return count


def _tally(root: cst.CSTNode, into: _Parents) -> int:
    """The line breaks in the code of `root` and everything under it; the parents of the nodes under it go into
    `into`."""
    count = 0
    pending = [root]
    fields, is_node = _FIELDS, _IS_NODE
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is cst.Newline:
            count += 1
        else:
            value = getattr(node, "value", None)
            if type(value) is str and ("\n" in value or "\r" in value):
                count += newlines_in(value)
        for name in fields[kind]:
            value = getattr(node, name)
            if type(value) is tuple or type(value) is list:
                for child in value:
                    if is_node[type(child)]:
                        into[child] = node
                        pending.append(child)
            elif is_node[type(value)]:
                into[value] = node
                pending.append(value)
    return count


_FIELDS: dict[type, tuple[str, ...]] = Computed(lambda kind: tuple(field.name for field in dataclasses.fields(kind)))
_IS_NODE: dict[type, bool] = Computed(lambda kind: issubclass(kind, cst.CSTNode))
