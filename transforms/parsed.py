"""One source text parsed once, with what the codemods ask of it computed when first asked.

The codemod chain hands the same `ParsedSource` to every codemod until one of them changes the text; then the
tree that codemod returned becomes the next one's parse (`generated`), and the text is never parsed again. Positions
and parents are what libcst calls metadata; resolving them eagerly costs more than most codemods' own work on a
1,400-line file, and a codemod that finds nothing to do never asks for them.
"""
from __future__ import annotations

import ast
import bisect
import re
import weakref
from collections.abc import Iterator, Mapping
from functools import cached_property

import libcst as cst
from libcst.metadata import CodeRange, ParentNodeProvider, PositionProvider

from graphmode.transforms.analysis.astutil import is_position_param
from graphmode.transforms.analysis.reach import step_qualnames_in
from graphmode.transforms.positions import (Layout, MethodLayout, Span, code_for_node, layout_of,
                                              method_position_table, newlines_in, position_table)
from graphmode.transforms.text_layout import layout_of_parsed


class ParsedSource:
    def __init__(self, text: str, module: cst.Module | None = None) -> None:
        self.text = text
        self._module = module
        self._function_words: dict[str, frozenset[str] | None] = {}
        # The node types under each class and function a codemod's walk asked about (cstutil.types_under): true of
        # a node wherever it sits, so the chain hands the one table from each text to the next.
        self.types_under: dict[cst.CSTNode, frozenset[type]] = {}
        self.class_levels: dict[cst.CSTNode, tuple[frozenset[type], tuple[str, ...]]] = {}  # cstutil.class_level
        # What the `ast` walks found in each statement of the module's body (`_Statement`), by its libcst node: a
        # statement a codemod handed on as the same node has the same text, so the chain hands the table on.
        self.statement_tables: dict[cst.CSTNode, _Statement] = {}
        # What each function calls, by its `ast` node (reach.reachable_functions): a statement the chain hands on as
        # the same node keeps its `ast` nodes (`statement_tables`), so the table goes from each text to the next.
        self.calls: dict[ast.AST, tuple[set[str], set[str]]] = {}
        # `_by_start`'s statements of the module's body parsed alone, and their tables.
        self._numbered_statements: dict[cst.CSTNode, ast.Module] = {}
        self._ast_statement_words: list[frozenset[str]] | None = None  # `words` of each statement of `tree`'s body
        self._statement_tables_by_start: dict[tuple[cst.CSTNode, bool], dict[tuple[int, int], list[ast.AST]]] = {}

    @cached_property
    def module(self) -> cst.Module:
        return self._module if self._module is not None else cst.parse_module(self.text)

    @cached_property
    def positions(self) -> Mapping[cst.CSTNode, CodeRange]:
        return _StatementPositions(self)

    @classmethod
    def generated(cls, module: cst.Module, earlier: ParsedSource | None = None) -> ParsedSource:
        """The text a codemod's tree generates, with that tree as its parse: the next codemod of the chain needs no
        parse of its own. Positions and parents are keyed by node, so a tree that holds one node in two places (a
        rewrite that kept a statement and also copied it) is parsed again from its text instead. `earlier`: the
        source the codemod was given; what it knows of a top-level statement the tree holds as the same node (its
        text, parents and positions) is not computed again."""
        earlier_layout = earlier.__dict__.get("layout") if earlier is not None else None
        generated = layout_of(module, earlier_layout)
        carried = cls(generated.text) if generated.parents is None else cls(generated.text, module)
        if earlier is not None:
            carried.types_under, carried.class_levels = earlier.types_under, earlier.class_levels
            if "module" in earlier.__dict__ and (module.default_indent, module.default_newline) == (
                    earlier.module.default_indent, earlier.module.default_newline):
                carried.statement_tables = earlier.statement_tables
            carried.calls = earlier.calls
        if generated.parents is None:
            return carried
        carried.__dict__["layout"] = generated
        if earlier is not None and "positions" in earlier.__dict__ and earlier_layout is not None \
                and earlier_layout.defaults == generated.defaults:
            carried.positions.carry(earlier.positions, generated.first_lines)
        return carried

    @cached_property
    def layout(self) -> Layout:
        """Parents and the first lines of top-level statements, recorded in one generation of the code; read off the
        text instead where the tree is the text's parse (text_layout)."""
        found = layout_of_parsed(self.module, self.text) if self._module is None else None
        if found is None:
            found = layout_of(self.module)
        assert found.parents is not None, "a parsed tree holds each node once"
        return found

    @property
    def parents(self) -> dict[cst.CSTNode, cst.CSTNode]:
        """What libcst's ParentNodeProvider gives."""
        return self.layout.parents

    def top_level_statement(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The statement of the module's body that holds the node (the node itself, for one of them); None for the
        module and its header and footer lines."""
        parents = self.parents
        while node in parents and parents[node] is not self.module:
            node = parents[node]
        return node if node in self.layout.first_lines else None

    def statement_text(self, statement: cst.CSTNode) -> str | None:
        """The text of one statement of the module's body, its leading lines included, as the layout generated it
        (lines counted as libcst counts them: `str.splitlines` also ends one at a form feed); None for any other
        node."""
        return self.layout.statement_texts.get(statement)

    def method_text(self, method: cst.CSTNode) -> str | None:
        """The code of a method of a class of the module's body as the layout generated it (`MethodLayout.text`: its
        leading lines included, indented under its class); None for any other node."""
        statement = self.top_level_statement(method)
        known = self.layout.statement_methods.get(statement, {}).get(method) if statement is not None else None
        return None if known is None else known.text

    @cached_property
    def tree(self) -> ast.Module:
        """The same text as Python's own AST: a tenth of libcst's cost, for questions about names and calls."""
        return ast.parse(self.text)

    def ast_node(self, start: tuple[int, int], end: tuple[int, int] | None, kinds: type | tuple[type, ...]
                 ) -> ast.AST | None:
        """The outermost node of `tree` of one of `kinds` that starts at `start` (and ends at `end`, when given),
        positions as libcst's PositionProvider gives them (lines from 1, columns in characters from 0); None when
        none does. A codemod reads facts about an original node here instead of printing it and parsing the text."""
        statements = all(issubclass(kind, ast.stmt) for kind in (kinds if isinstance(kinds, tuple) else (kinds,)))
        for node in self._by_start(start[0], statements).get(start, ()):
            if isinstance(node, kinds) and (end is None or self._point(node.end_lineno, node.end_col_offset) == end):
                return node
        return None

    def ast_leading_values(self, start: tuple[int, int], end: tuple[int, int]) -> ast.BoolOp | None:
        """`a and b`, the leading values of an `a and b and c` that starts at `start`, as one `BoolOp` ending at
        `end` (positions as `ast_node` takes them); None when no such chain does. `ast` holds the chain as one
        `BoolOp` of three values, libcst as two nested `BooleanOperation`s, the inner one without an `ast` node."""
        for node in self._by_start(start[0], False).get(start, ()):
            if not isinstance(node, ast.BoolOp):
                continue
            for count in range(2, len(node.values)):
                last = node.values[count - 1]
                if self._point(last.end_lineno, last.end_col_offset) == end:
                    leading = ast.BoolOp(op=node.op, values=node.values[:count])
                    leading.lineno, leading.col_offset = node.lineno, node.col_offset
                    leading.end_lineno, leading.end_col_offset = last.end_lineno, last.end_col_offset
                    return leading
        return None

    def ast_node_around(self, start: tuple[int, int], end: tuple[int, int], kind: type) -> ast.AST | None:
        """The innermost node of `tree` of that kind whose span holds `start` to `end` (positions as `ast_node`
        takes them); None when none does. A walk of the whole tree: for the few nodes whose `ast` span is wider
        than libcst's."""
        around = [node for node in _walk(self.tree) if isinstance(node, kind)
                  and self._point(node.lineno, node.col_offset) <= start
                  and self._point(node.end_lineno, node.end_col_offset) >= end]
        return max(around, key=lambda node: self._point(node.lineno, node.col_offset), default=None)

    def _by_start(self, line: int, statements: bool) -> dict[tuple[int, int], list[ast.AST]]:
        """`_statements_by_start` (`statements`) or `_ast_by_start` where a look-up of a node starting on `line` finds
        it. For a text the chain generated whose whole `ast` nobody asked for yet, the table of the one statement of
        the module's body that holds the line: that statement parsed alone, after as many line breaks as there are
        lines above it, so that its nodes have the whole text's lines and columns (`ast` counts lines as libcst
        does). A parse of the whole text for each codemod that looks a node up cost more than its look-ups."""
        if "tree" in self.__dict__ or "layout" not in self.__dict__:
            return self._statements_by_start if statements else self._ast_by_start
        starts, held = self._statement_starts
        index = bisect.bisect_right(starts, line) - 1
        if index < 0:  # the module's header: no statement's
            return self._statements_by_start if statements else self._ast_by_start
        statement = held[index]
        tables = self._statement_tables_by_start.get((statement, statements))
        if tables is None:
            tree = self._numbered_statements.get(statement)
            if tree is None:
                text = "\n" * (starts[index] - 1) + self.layout.statement_texts[statement]
                tree = self._numbered_statements[statement] = ast.parse(text)
            tables = self._statement_tables_by_start[statement, statements] = self._starts_of(
                _statements(tree) if statements else _walk(tree))
        return tables

    @cached_property
    def _statement_starts(self) -> tuple[list[int], list[cst.CSTNode]]:
        """The first line of each statement of the module's body (its leading lines included), in order, and the
        statements."""
        first_lines = self.layout.first_lines
        return list(first_lines.values()), list(first_lines)

    def _starts_of(self, nodes: list[ast.AST]) -> dict[tuple[int, int], list[ast.AST]]:
        """The nodes that have a position by where they start, in the order given."""
        found: dict[tuple[int, int], list[ast.AST]] = {}
        for node in nodes:
            if getattr(node, "end_lineno", None) is not None:
                found.setdefault(self._point(node.lineno, node.col_offset), []).append(node)
        return found

    @cached_property
    def _ast_by_start(self) -> dict[tuple[int, int], list[ast.AST]]:
        """Nodes of `tree` by where they start, outermost first (`ast.walk` goes breadth first)."""
        return self._starts_of(_walk(self.tree))

    @cached_property
    def _statements_by_start(self) -> dict[tuple[int, int], list[ast.AST]]:
        """The statements of `tree` by where they start, as `_ast_by_start` holds them (no two start at one point): a
        walk of the statements alone, for a codemod that asks about a function (`GraphCodemod.ast_of`), where the
        table of every node costs as much as the codemod's own work."""
        return self._starts_of(_statements(self.tree))

    def _point(self, line: int, byte_column: int) -> tuple[int, int]:
        """`ast`'s (line, column in UTF-8 bytes) as libcst's (line, column in characters)."""
        text = self._ast_lines[line - 1]
        return line, byte_column if text.isascii() else len(text.encode()[:byte_column].decode())

    @cached_property
    def _ast_lines(self) -> list[str]:
        """The lines as `ast` and libcst count them: ended by `\\r\\n`, `\\r` or `\\n` only (`str.splitlines` also
        ends a line at a form feed and other separators)."""
        return re.split(r"\r\n|\r|\n", self.text)

    @cached_property
    def step_functions(self) -> set[str]:
        return step_qualnames_in(self.unnumbered_tree, self.calls)

    @cached_property
    def unnumbered_tree(self) -> ast.Module:
        """`tree` for questions that read no line numbers (which functions a step reaches, the module's imports).
        A text the chain generated whose whole `ast` no one asked for yet is not parsed again: the module is put
        together from its statements' own `ast` nodes (`_statements` parsed only those a codemod changed, each
        alone), the same tree but for line numbers. That was two parses of the whole text per chain on a llama
        file."""
        statements = self._statements
        if statements is None or "tree" in self.__dict__:
            return self.tree
        return ast.Module(body=[node for statement in statements for node in statement.nodes], type_ignores=[])

    @cached_property
    def words(self) -> frozenset[str]:
        """Every identifier, attribute, parameter and keyword name in the text, and `:Kind` for each kind of
        statement or operator (`:Assert`, `:Gt`): the cheap test of whether an idiom can be there."""
        statements = self._statements
        if statements is None:
            # Per `ast` statement: the statement tables built from the same tree later (`_statements`) take theirs
            # from here, where they walked the whole tree a second time.
            self._ast_statement_words = [_words_in(node) for node in self.tree.body]
            return frozenset({":Module"}).union(*self._ast_statement_words)
        return frozenset({":Module"}).union(*(statement.words for statement in statements))

    @property
    def _statements(self) -> list[_Statement] | None:
        """The `ast` walks' findings per statement of the module's body, taken from the table the chain hands on
        where it has the statement; None while the text has no libcst parse yet (a text no codemod walks is not
        parsed by libcst for this). A libcst statement line holds as many `ast` statements as it has small
        statements (`a = 1; b = 2`), a compound statement one."""
        if "_statement_list" in self.__dict__:
            return self.__dict__["_statement_list"]
        if self._module is None and "module" not in self.__dict__:
            return None
        tables = self.statement_tables
        if "tree" not in self.__dict__ and "layout" in self.__dict__:
            # A text the chain generated: the statements a codemod changed are parsed alone (each starts a line at
            # column 0, and its `ast` is the whole text's but for line numbers, which no table here reads), and the
            # whole text only when something asks for its tree.
            texts = self.layout.statement_texts
            found = [tables.get(statement) or tables.setdefault(statement, _Statement(ast.parse(texts[statement]).body))
                     for statement in self.module.body]
            self.__dict__["_statement_list"] = found
            return found
        body = self.tree.body
        found = []
        start = 0
        for statement in self.module.body:
            end = start + (len(statement.body) if type(statement) is cst.SimpleStatementLine else 1)
            table = tables.get(statement)
            if table is None:
                known = self._ast_statement_words
                table = tables[statement] = _Statement(
                    body[start:end], None if known is None else frozenset().union(*known[start:end]))
            found.append(table)
            start = end
        assert start == len(body), "each `ast` statement belongs to one libcst statement"
        self.__dict__["_statement_list"] = found
        return found

    def function_words(self, qualname: str) -> frozenset[str] | None:
        """`words` of the functions with this qualified name (`Class.method`, `outer.inner`: the names of the
        enclosing classes and functions), their decorators, parameters and nested code included; None when no
        function has that name."""
        if qualname not in self._function_words:
            statements = self._statements
            if statements is None:
                nodes = self._functions_by_qualname.get(qualname)
                words = None if nodes is None else frozenset().union(*map(_words_in, nodes))
            else:
                owners = self._function_owners.get(qualname)
                words = None if owners is None else frozenset().union(*(s.function_words(qualname) for s in owners))
            self._function_words[qualname] = words
        return self._function_words[qualname]

    @cached_property
    def _functions_by_qualname(self) -> dict[str, list[ast.AST]]:
        return _functions_by_qualname(self.tree)

    @cached_property
    def _function_owners(self) -> dict[str, list[_Statement]]:
        """The statements of the module's body that define a function of each qualified name (after `_statements`)."""
        owners: dict[str, list[_Statement]] = {}
        for statement in self._statements:
            for qualname in statement.functions_by_qualname:
                owners.setdefault(qualname, []).append(statement)
        return owners

    @cached_property
    def classes_in_functions(self) -> bool:
        """Some class is defined inside a function (a walk that skips function bodies would miss it)."""
        statements = self._statements
        if statements is None:
            return _classes_in_functions(self.tree)
        return any(statement.classes_in_functions for statement in statements)

    @cached_property
    def has_position_param(self) -> bool:
        """Some function takes a Python-int position (astutil's `is_position_param`)."""
        statements = self._statements
        if statements is None:
            return _has_position_param(self.tree)
        return any(statement.has_position_param for statement in statements)

    @cached_property
    def position_functions(self) -> frozenset[str]:
        """Qualified names of the functions with a parameter that carries a Python-int position
        (astutil's `is_position_param`)."""
        statements = self._statements
        if statements is None:
            return _position_functions(self._functions_by_qualname)
        return frozenset().union(*(statement.position_functions for statement in statements))

    def metadata(self) -> "LazyMetadata":
        return LazyMetadata(self)


class _Statement:
    """ParsedSource's `ast` walks over the `ast` statements of one statement of the module's body, each done when
    first asked. Qualified names are the module's: a statement of its body is not inside any class or function."""

    def __init__(self, nodes: list[ast.stmt], words: frozenset[str] | None = None) -> None:
        self.nodes = nodes
        self._function_words: dict[str, frozenset[str] | None] = {}
        if words is not None:  # found already by a walk of the same nodes
            self.__dict__["words"] = words

    @cached_property
    def words(self) -> frozenset[str]:
        return frozenset().union(*map(_words_in, self.nodes))

    @cached_property
    def functions_by_qualname(self) -> dict[str, list[ast.AST]]:
        found: dict[str, list[ast.AST]] = {}
        for node in self.nodes:
            for qualname, nodes in _functions_by_qualname(node, within=True).items():
                found.setdefault(qualname, []).extend(nodes)
        return found

    def function_words(self, qualname: str) -> frozenset[str] | None:
        if qualname not in self._function_words:
            nodes = self.functions_by_qualname.get(qualname)
            self._function_words[qualname] = None if nodes is None else frozenset().union(*map(_words_in, nodes))
        return self._function_words[qualname]

    @cached_property
    def classes_in_functions(self) -> bool:
        return any(map(_classes_in_functions, self.nodes))

    @cached_property
    def has_position_param(self) -> bool:
        return any(map(_has_position_param, self.nodes))

    @cached_property
    def position_functions(self) -> frozenset[str]:
        return _position_functions(self.functions_by_qualname)


def _functions_by_qualname(tree: ast.AST, within: bool = False) -> dict[str, list[ast.AST]]:
    """Functions by qualified name under `tree` (`tree` itself too when `within`: a statement of the module's body)."""
    found: dict[str, list[ast.AST]] = {}
    pending: list[tuple[ast.AST, str]] = []
    for child in [tree] if within else _block_children(tree):
        _add_function(child, "", found, pending)
    while pending:
        node, scope = pending.pop()
        for child in _block_children(node):
            _add_function(child, scope, found, pending)
    return found


def _add_function(child: ast.AST, scope: str, found: dict[str, list[ast.AST]],
                  pending: list[tuple[ast.AST, str]]) -> None:
    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        qualname = f"{scope}.{child.name}" if scope else child.name
        if not isinstance(child, ast.ClassDef):
            found.setdefault(qualname, []).append(child)  # a redefinition (a property setter) adds
        pending.append((child, qualname))
    else:
        pending.append((child, scope))


def _classes_in_functions(tree: ast.AST) -> bool:
    pending: list[tuple[ast.AST, bool]] = [(tree, False)]
    while pending:
        node, in_function = pending.pop()
        if in_function and isinstance(node, ast.ClassDef):
            return True
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        pending.extend((child, inside) for child in _block_children(node))
    return False


def _has_position_param(tree: ast.AST) -> bool:
    return any(is_position_param(node) for node in _walk(tree) if isinstance(node, ast.arg))


def _position_functions(functions: dict[str, list[ast.AST]]) -> frozenset[str]:
    found = set()
    for qualname, nodes in functions.items():
        for node in nodes:
            if any(is_position_param(arg) for arg in ast.walk(node.args) if isinstance(arg, ast.arg)):
                found.add(qualname)
    return frozenset(found)


def _words_in(tree: ast.AST) -> frozenset[str]:
    # What `ast.walk` visits (every AST value of a field, and the AST items of a list field, `ctx` included), in
    # another order, without its generators: the words are a set. Half of `ast.walk`'s cost on a 1,400-line file.
    found: set[str] = set()
    add = found.add
    pending = [tree]
    pop, push, extend = pending.pop, pending.append, pending.extend
    while pending:
        node = pop()
        kind = type(node)
        add(_KIND_WORDS.get(kind) or _kind_word(kind))
        if kind is ast.Name:
            add(node.id)
        elif kind is ast.Attribute:
            add(node.attr)
        elif kind is ast.FunctionDef or kind is ast.AsyncFunctionDef or kind is ast.ClassDef:
            add(node.name)
        elif kind is ast.arg:
            add(node.arg)
        elif kind is ast.keyword and node.arg:
            add(node.arg)
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, ast.AST):
                push(value)
            elif isinstance(value, list):
                extend([item for item in value if isinstance(item, ast.AST)])
    return frozenset(found)


def _walk(tree: ast.AST) -> list[ast.AST]:
    """`ast.walk` (breadth first, in the same order) as a list, without its generators."""
    found = [tree]
    for node in found:  # the list grows as it is read: each node's children go to its end
        found.extend(_child_nodes(node))
    return found


def _statements(tree: ast.Module) -> list[ast.stmt]:
    """Every statement of the tree, breadth first, as `_walk` meets them: the bodies of statements, of their
    `except` clauses and of their `case` clauses hold them all."""
    found: list[ast.stmt] = list(tree.body)
    for node in found:  # the list grows as it is read
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            for item in getattr(node, name, ()):
                found.extend([item] if isinstance(item, ast.stmt) else item.body)
    return found


_BLOCK_FIELDS = frozenset({"body", "handlers", "orelse", "finalbody", "cases"})


def _block_children(node: ast.AST) -> list[ast.AST]:
    """`_child_nodes` less every expression, which holds no statement (a lambda's body is one): the statements of the
    node's blocks and its `except` and `case` clauses, in the same order. A function or a class is a statement, so a
    walk after them needs no more; the expressions are nine nodes in ten."""
    found: list[ast.AST] = []
    for name in node._fields:
        if name in _BLOCK_FIELDS:
            value = getattr(node, name, None)
            if type(value) is list:
                found.extend(value)
    return found


def _child_nodes(node: ast.AST) -> list[ast.AST]:
    """`ast.iter_child_nodes` as a list, in the same order, without its generators."""
    found: list[ast.AST] = []
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, ast.AST):
            found.append(value)
        elif isinstance(value, list):
            found.extend([item for item in value if isinstance(item, ast.AST)])
    return found


_KIND_WORDS: dict[type, str] = {}


def _kind_word(kind: type) -> str:
    _KIND_WORDS[kind] = f":{kind.__name__}"
    return _KIND_WORDS[kind]


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
    """libcst's PositionProvider, computed one top-level statement at a time when a node in it is first asked about;
    in a method of a class, one statement of the method's body at a time.

    Tracking positions costs three times plain code generation even done cheaply (transforms.positions), and the
    codemods ask about a few nodes in a few classes: the other statements are only generated as text, to count
    their lines."""

    def __init__(self, source: ParsedSource) -> None:
        # A weak reference: the source holds its positions, and a cycle of the two would keep the source's tree (some
        # 100,000 objects) alive until the cyclic collector ran, which the chain pauses; found and freed after it, the
        # trees of a chain were a tenth of its time.
        self._source = weakref.proxy(source)
        self._done: dict[cst.CSTNode, dict[cst.CSTNode, Span]] = {}  # top-level statement -> its table
        # (method, indent tokens) -> the table of the method alone (positions.method_position_table)
        self._methods: dict[tuple[cst.CSTNode, tuple[str, ...]], dict[cst.CSTNode, Span]] = {}
        self._whole: dict[cst.CSTNode, Span] | None = None

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        statement = self._source.top_level_statement(node)
        if statement is None:  # the module itself, its header or footer: the whole table
            if self._whole is None:
                self._whole = position_table(self._source.module)
            return CodeRange(*self._whole[node])
        methods = self._source.layout.statement_methods.get(statement)
        if statement not in self._done and methods:
            # A node in a method of a class: the table of the method alone, or of the statement of its body that holds
            # the node (a codemod asks about a few methods of a class, and a few statements of each).
            method, in_body = self._method_holding(node, methods)
            if node is method and (span := self._method_span(method, methods[method])) is not None:
                start, end = span
                shift = self._source.layout.first_lines[statement] - 1
                return CodeRange((start[0] + shift, start[1]), (end[0] + shift, end[1]))
            if method is not None:
                known = methods[method]
                # A node in a statement of the method's body: the table of that statement alone (a codemod asks about
                # a few statements of a method, and asks again after each codemod that rewrote the method).
                part, line, indent = (method, known.line, known.indent) if in_body not in known.statements else \
                    (in_body, known.line + known.statements[in_body].line, known.statements[in_body].indent)
                (start_line, start_column), (end_line, end_column) = self._table(part, indent)[node]
                shift = self._source.layout.first_lines[statement] + line - 1
                return CodeRange((start_line + shift, start_column), (end_line + shift, end_column))
        if statement not in self._done:
            module = self._source.module
            self._done[statement] = position_table(module.with_changes(header=(), body=(statement,), footer=()))
        (start_line, start_column), (end_line, end_column) = self._done[statement][node]
        shift = self._source.layout.first_lines[statement] - 1
        return CodeRange((start_line + shift, start_column), (end_line + shift, end_column))

    def _table(self, part: cst.CSTNode, indent: tuple[str, ...]) -> dict[cst.CSTNode, Span]:
        """The position table of a method or of a statement of its body, generated alone under its indent tokens."""
        table = self._methods.get((part, indent))
        if table is None:
            module = self._source.module
            table = self._methods[part, indent] = method_position_table(
                part, indent, (module.default_indent, module.default_newline))
        return table

    def _method_span(self, method: cst.FunctionDef, known: MethodLayout) -> Span | None:
        """A method's own position, lines counted from its class's first line, without the table of the whole method
        (a codemod that records an edit of a whole method asks only this): libcst's starts after the indent of the
        `def` line and ends where the body's last statement does. None where a comment block ends the body."""
        body = method.body
        if type(body) is not cst.IndentedBlock or body.footer or not body.body:
            return None
        module = self._source.module
        above = len(method.leading_lines) + len(method.lines_after_decorators) + sum(
            newlines_in(code_for_node(decorator, module.default_indent, module.default_newline))
            for decorator in method.decorators)
        last = body.body[-1]
        end_line, end_column = self._table(last, known.statements[last].indent)[last][1]
        start = (known.line + above + 1, len("".join(known.indent)))
        return start, (known.line + known.statements[last].line + end_line, end_column)

    def carry(self, earlier: _StatementPositions, statements: Mapping[cst.CSTNode, int]) -> None:
        """Takes the tables `earlier` computed for the statements this source holds as the same nodes: a statement's
        table is of the statement generated alone, so it holds wherever the statement sits."""
        self._done.update((statement, table) for statement, table in earlier._done.items() if statement in statements)
        self._methods = earlier._methods  # a method's table holds wherever it sits under the same indent

    def _method_holding(self, node: cst.CSTNode, methods: Mapping[cst.CSTNode, object]
                        ) -> tuple[cst.CSTNode | None, cst.CSTNode | None]:
        """The method of `methods` that holds the node (None when none does), and the node two levels under it on the
        way (a statement of its body, where the node is in one)."""
        parents = self._source.parents
        below: list[cst.CSTNode | None] = [None, None]
        while node not in methods:
            below.append(node)
            node = parents.get(node)
            if node is None:
                return None, None
        return node, below[-2]

    def __iter__(self) -> Iterator:
        raise TypeError("positions are computed per node; iterate the tree instead")

    def __len__(self) -> int:
        raise TypeError("positions are computed per node")
