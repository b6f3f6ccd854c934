"""One source text parsed once, with what the codemods ask of it computed when first asked.

The codemod chain hands the same `ParsedSource` to every codemod until one of them changes the text. Positions
and parents are what libcst calls metadata; resolving them eagerly costs more than most codemods' own work on a
1,400-line file, and a codemod that finds nothing to do never asks for them.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from functools import cached_property

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, ParentNodeProvider, PositionProvider

from graphmode.transforms.analysis.reach import step_qualnames
from graphmode.transforms.cstutil import child_fields
from graphmode.transforms.vocabulary import is_position_name


class ParsedSource:
    def __init__(self, text: str, module: cst.Module | None = None) -> None:
        self.text = text
        self._module = module
        self._function_words: dict[str, frozenset[str] | None] = {}

    @cached_property
    def module(self) -> cst.Module:
        return self._module if self._module is not None else cst.parse_module(self.text)

    @cached_property
    def positions(self) -> Mapping[cst.CSTNode, CodeRange]:
        return _StatementPositions(self)

    @cached_property
    def parents(self) -> dict[cst.CSTNode, cst.CSTNode]:
        """What libcst's ParentNodeProvider gives, read off the nodes' fields: a third of a visitor's cost."""
        parents: dict[cst.CSTNode, cst.CSTNode] = {}
        pending: list[cst.CSTNode] = [self.module]
        while pending:
            node = pending.pop()
            for name in child_fields(type(node)):
                value = getattr(node, name)
                if isinstance(value, cst.CSTNode):
                    parents[value] = node
                    pending.append(value)
                elif type(value) is tuple or type(value) is list:
                    for child in value:
                        if isinstance(child, cst.CSTNode):
                            parents[child] = node
                            pending.append(child)
        return parents

    @cached_property
    def tree(self) -> ast.Module:
        """The same text as Python's own AST: a tenth of libcst's cost, for questions about names and calls."""
        return ast.parse(self.text)

    @cached_property
    def step_functions(self) -> set[str]:
        return step_qualnames(self.text)

    @cached_property
    def words(self) -> frozenset[str]:
        """Every identifier, attribute, parameter and keyword name in the text, and `:Kind` for each kind of
        statement or operator (`:Assert`, `:Gt`): the cheap test of whether an idiom can be there."""
        return _words_in(self.tree)

    def function_words(self, qualname: str) -> frozenset[str] | None:
        """`words` of the functions with this qualified name (`Class.method`, `outer.inner`: the names of the
        enclosing classes and functions), their decorators, parameters and nested code included; None when no
        function has that name."""
        if qualname not in self._function_words:
            nodes = self._functions_by_qualname.get(qualname)
            self._function_words[qualname] = None if nodes is None else frozenset().union(*map(_words_in, nodes))
        return self._function_words[qualname]

    @cached_property
    def _functions_by_qualname(self) -> dict[str, list[ast.AST]]:
        found: dict[str, list[ast.AST]] = {}
        pending: list[tuple[ast.AST, str]] = [(self.tree, "")]
        while pending:
            node, scope = pending.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    qualname = f"{scope}.{child.name}" if scope else child.name
                    if not isinstance(child, ast.ClassDef):
                        found.setdefault(qualname, []).append(child)  # a redefinition (a property setter) adds
                    pending.append((child, qualname))
                else:
                    pending.append((child, scope))
        return found

    @cached_property
    def classes_in_functions(self) -> bool:
        """Some class is defined inside a function (a walk that skips function bodies would miss it)."""
        pending: list[tuple[ast.AST, bool]] = [(self.tree, False)]
        while pending:
            node, in_function = pending.pop()
            if in_function and isinstance(node, ast.ClassDef):
                return True
            inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            pending.extend((child, inside) for child in ast.iter_child_nodes(node))
        return False

    @cached_property
    def has_position_param(self) -> bool:
        """Some function takes a Python-int position (`cstutil.is_position_param`, on Python's AST)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.arg):
                annotation = node.annotation
                written = None if annotation is None else annotation.id if isinstance(annotation, ast.Name) else ""
                if is_position_name(node.arg, written):
                    return True
        return False

    def metadata(self) -> "LazyMetadata":
        return LazyMetadata(self)


def _words_in(tree: ast.AST) -> frozenset[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        found.add(f":{type(node).__name__}")
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
    return frozenset(found)


class LazyMetadata(Mapping):
    """What `MetadataDependent.get_metadata` reads (`self.metadata[provider][node]`), each table built on first use."""

    def __init__(self, source: ParsedSource) -> None:
        self._source = source

    def __getitem__(self, key: object) -> Mapping:
        if key is PositionProvider:
            return self._source.positions
        if key is ParentNodeProvider:
            return self._source.parents
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return key is PositionProvider or key is ParentNodeProvider

    def __iter__(self) -> Iterator:
        return iter((PositionProvider, ParentNodeProvider))

    def __len__(self) -> int:
        return 2


class _StatementPositions(Mapping):
    """libcst's PositionProvider, computed one top-level statement at a time when a node in it is first asked about.

    Tracking positions costs five times plain code generation, and the codemods ask about a few nodes in a few
    classes: the other statements are only generated as text, to count their lines."""

    def __init__(self, source: ParsedSource) -> None:
        self._source = source
        self._done: dict[cst.CSTNode, Mapping[cst.CSTNode, CodeRange]] = {}  # top-level statement -> its table
        self._whole: Mapping[cst.CSTNode, CodeRange] | None = None

    @cached_property
    def _first_lines(self) -> dict[cst.CSTNode, int]:
        """The line each top-level statement's text (its leading comments and blank lines included) starts on."""
        module = self._source.module
        line = 1 + sum(1 for _ in module.header)
        first: dict[cst.CSTNode, int] = {}
        for statement in module.body:
            first[statement] = line
            line += module.code_for_node(statement).count("\n")
        return first

    def _statement_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        parents = self._source.parents
        while node in parents and parents[node] is not self._source.module:
            node = parents[node]
        return node if node in self._first_lines else None

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        statement = self._statement_of(node)
        if statement is None:  # the module itself, its header or footer: the whole table
            if self._whole is None:
                self._whole = MetadataWrapper(self._source.module, unsafe_skip_copy=True).resolve(PositionProvider)
            return self._whole[node]
        if statement not in self._done:
            module = self._source.module
            alone = module.with_changes(header=(), body=(statement,), footer=())
            self._done[statement] = MetadataWrapper(alone, unsafe_skip_copy=True).resolve(PositionProvider)
        found = self._done[statement][node]
        shift = self._first_lines[statement] - 1
        return CodeRange((found.start.line + shift, found.start.column), (found.end.line + shift, found.end.column))

    def __iter__(self) -> Iterator:
        raise TypeError("positions are computed per node; iterate the tree instead")

    def __len__(self) -> int:
        raise TypeError("positions are computed per node")
