"""Where each node of a libcst tree sits: its text position, its parent, the line its top-level statement starts on.

`layout_of` generates a tree's code once and records, on the way, each node's parent (the node whose code generation
called its own) and the first line of each top-level statement: what a walk for parents and a generation per
statement would give, in one pass. `position_table` is libcst's PositionProvider at a third of its cost. The
provider generates the code with a state that records a position per node; most of its time goes to a regular
expression split of every token, a `CodePosition` and a `CodeRange` per node, and a generator-based context
manager per statement and expression. `position_table` records the same positions (the same start and end, the
same rule of a syntactic position winning over the whitespace-inclusive one) with counts, tuples and a slotted
context manager. It subclasses libcst's `CodegenState`, as the provider does; tests/test_pipeline_shortcuts.py
holds the two to equal results, so a libcst release that changes the protocol fails there first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import libcst as cst
from libcst._nodes.internal import CodegenState

Point = tuple[int, int]  # (line counted from 1, column counted from 0)
Span = tuple[Point, Point]


@dataclass(frozen=True)
class Layout:
    text: str  # the module's code
    parents: dict[cst.CSTNode, cst.CSTNode] | None  # None when a node sits in two places in the tree
    first_lines: dict[cst.CSTNode, int]  # top-level statement -> line its text (leading lines included) starts on
    # What a later layout may reuse of a top-level statement handed on as the same node: its text (leading lines
    # included) and the parents of the nodes under it; and the module's defaults its text was generated with.
    statement_texts: dict[cst.CSTNode, str]
    statement_parents: dict[cst.CSTNode, dict[cst.CSTNode, cst.CSTNode]]  # (those under its methods aside)
    defaults: tuple[str, str]
    # The methods of each top-level class (`MethodLayout`): what a later layout reuses of a method handed on as the
    # same node in a class a codemod changed, and what a position table of the method alone needs.
    statement_methods: dict[cst.CSTNode, dict[cst.CSTNode, MethodLayout]]
    top: dict[cst.CSTNode, cst.CSTNode]  # the parents of the module's own children (the module)


class MethodLayout(NamedTuple):
    line: int  # where the method starts (leading lines included), in lines after its class's first line
    indent: tuple[str, ...]  # the indent tokens its code was generated under (`method_position_table`)
    text: str
    parents: dict[cst.CSTNode, cst.CSTNode]  # of the nodes under it (those under the statements of its body aside)
    # Each statement of its body (`StatementLayout`): a position in one is read off a table of that statement alone,
    # and a later layout copies one handed on as the same node into a method a codemod changed.
    statements: dict[cst.CSTNode, StatementLayout]


class StatementLayout(NamedTuple):
    line: int  # where the statement starts (leading lines included), in lines after its method's first line
    indent: tuple[str, ...]  # the indent tokens its code was generated under
    text: str
    parents: dict[cst.CSTNode, cst.CSTNode]  # of the nodes under it


class _NoRecord:
    """The context `record_syntactic_position` gives where no position is recorded. libcst's own is a generator-based
    context manager entered for every statement and many expressions: a third of plain code generation's time."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


_NO_RECORD = _NoRecord()


class _TextState(CodegenState):
    """libcst's state for plain code generation (`Module.code`, `code_for_node`), less the cost of recording nothing."""

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None,
                                  end_node: cst.CSTNode | None = None) -> _NoRecord:
        return _NO_RECORD


def code_for_node(node: cst.CSTNode, default_indent: str = " " * 4, default_newline: str = "\n") -> str:
    """`Module.code_for_node` of a module with these defaults (an empty module's, by default): the same text."""
    state = _TextState(default_indent=default_indent, default_newline=default_newline)
    node._codegen(state)
    return "".join(state.tokens)


class _FunctionPartsState(_TextState):
    """_TextState that notes where the tokens of a function's body, and of each statement of the body, begin and end,
    and which tokens are the body's own indentation (the first of the indent tokens, wherever a statement of the body
    indents a line: generated alone, the statement has no such level)."""

    def __init__(self, function: cst.FunctionDef) -> None:
        super().__init__(default_indent=" " * 4, default_newline="\n")
        self.body = function.body
        self.statements = set(function.body.body) if isinstance(function.body, cst.IndentedBlock) else set()
        self.body_span = (0, 0)
        self.statement_spans: dict[cst.CSTNode, tuple[int, int]] = {}
        self.body_indents: set[int] = set()  # indices of the tokens that are the body's own indentation
        self._statement: cst.CSTNode | None = None
        self._start = 0

    def before_codegen(self, node: cst.CSTNode) -> None:
        if node is self.body:
            self.body_span = (len(self.tokens), 0)
        elif self._statement is None and node in self.statements:
            self._statement, self._start = node, len(self.tokens)

    def after_codegen(self, node: cst.CSTNode) -> None:
        if node is self.body:
            self.body_span = (self.body_span[0], len(self.tokens))
        elif node is self._statement:
            self.statement_spans[node] = (self._start, len(self.tokens))
            self._statement = None

    def add_indent_tokens(self) -> None:
        if self._statement is not None and self.indent_tokens:
            self.body_indents.add(len(self.tokens))
        super().add_indent_tokens()


def function_parts_code(function: cst.FunctionDef) -> tuple[str, str, dict[cst.CSTNode, str]]:
    """`code_for_node` of the function, of its body and of each statement of its body, from one generation. A
    function generated alone starts at no indentation, as its body alone does, and the body's code depends on nothing
    else of the state; a statement of the body generated alone is its tokens there less the body's own indentation,
    the first indent token on each line it indents (libcst adds the indent tokens of every block a line is in, the
    outermost first). tests/test_pipeline_shortcuts.py holds the three to the separate generations."""
    state = _FunctionPartsState(function)
    function._codegen(state)
    tokens, skipped = state.tokens, state.body_indents
    statements = {statement: "".join(tokens[i] for i in range(start, end) if i not in skipped)
                  for statement, (start, end) in state.statement_spans.items()}
    return "".join(tokens), "".join(tokens[slice(*state.body_span)]), statements


def module_code(module: cst.Module) -> str:
    """`module.code`: the same text."""
    return code_for_node(module, module.default_indent, module.default_newline)


def layout_of(module: cst.Module, earlier: Layout | None = None) -> Layout:
    """The module's layout. A top-level statement that `earlier` (the layout of the tree a codemod was given) holds
    as the same node is not generated again: its text and parents are the same (nodes never change; the codemods
    hand an untouched statement on as it was, base.GraphCodemod.on_leave)."""
    state = _LayoutState(module)
    defaults = (module.default_indent, module.default_newline)
    if earlier is None or earlier.defaults != defaults or not module.has_trailing_newline:
        module._codegen(state)
    else:
        _codegen_reusing(module, state, [earlier])
    parts = _parent_tables(state.statement_parents, state.statement_methods)
    parents = _merged(state.top, parts, earlier)
    # A node held in two places has one entry for both: the union is smaller than the tables together.
    duplicated = state.duplicated or len(parents) != len(state.top) + sum(map(len, parts))
    return Layout("".join(state.tokens), None if duplicated else parents, state.first_lines, state.statement_texts,
                  state.statement_parents, defaults, state.statement_methods, state.top)


def module_code_reusing(module: cst.Module, layouts: list[Layout]) -> str:
    """`module_code(module)`, with the code of what `layouts` generated copied where the module holds the same node:
    its statements, the methods of its classes and the statements of their bodies."""
    defaults = (module.default_indent, module.default_newline)
    usable = [layout for layout in layouts if layout.defaults == defaults]
    if not usable or not module.has_trailing_newline:
        return module_code(module)
    state = _ReusingTextState(*defaults)
    _codegen_reusing(module, state, usable)
    return "".join(state.tokens)


def _codegen_reusing(module: cst.Module, state: _LayoutState | _ReusingTextState, earlier: list[Layout]) -> None:
    """libcst's Module._codegen with the statements the `earlier` layouts hold copied (tests/test_pipeline_shortcuts.py
    holds the text to libcst's). A module without a trailing newline drops its last token: not for this."""
    state.before_codegen(module)
    for line in module.header:
        line._codegen(state)
    methods, statements = _known_parts(earlier)
    for statement in module.body:
        found = next((layout for layout in earlier if statement in layout.statement_texts), None)
        if found is not None:
            state.add_generated(statement, found.statement_texts[statement], found.statement_parents[statement],
                                found.statement_methods.get(statement))
        else:
            _statement_codegen(statement, state, methods, statements)
    for line in module.footer:
        line._codegen(state)
    if not state.tokens:
        state.add_token(state.default_newline)
    state.after_codegen(module)


def _known_parts(earlier: list[Layout]
                 ) -> tuple[dict[cst.CSTNode, MethodLayout], dict[cst.CSTNode, StatementLayout]]:
    """The methods the layouts generated, and the statements of their bodies."""
    methods = {method: layout for found in earlier for known in found.statement_methods.values()
               for method, layout in known.items()}
    statements = {statement: layout for method in methods.values() for statement, layout in method.statements.items()}
    return methods, statements


def _statement_codegen(statement: cst.CSTNode, state: _LayoutState | _ReusingTextState,
                       methods: dict[cst.CSTNode, MethodLayout],
                       statements: dict[cst.CSTNode, StatementLayout]) -> None:
    """A statement of the module's body no earlier layout generated: a class a codemod changed takes its other methods
    from them, and in those it changed, the statements it kept."""
    if type(statement) is cst.ClassDef and type(statement.body) is cst.IndentedBlock and any(
            member in methods or _holds_known(member, statements) for member in statement.body.body):
        _class_codegen(statement, state, methods, statements)
    else:
        statement._codegen(state)


class _ReusingTextState(_TextState):
    """_TextState that takes the code an earlier layout generated (`_codegen_reusing`)."""

    def add_method(self, method: cst.CSTNode, known: MethodLayout) -> None:
        self.tokens.append(known.text)

    def add_statement(self, statement: cst.CSTNode, known: StatementLayout) -> None:
        self.tokens.append(known.text)

    def add_generated(self, statement: cst.CSTNode, text: str, below: object, methods: object) -> None:
        self.tokens.append(text)


def all_parents(top: dict[cst.CSTNode, cst.CSTNode],
                statement_parents: dict[cst.CSTNode, dict[cst.CSTNode, cst.CSTNode]],
                statement_methods: dict[cst.CSTNode, dict[cst.CSTNode, MethodLayout]]
                ) -> dict[cst.CSTNode, cst.CSTNode]:
    """`Layout.parents` from a layout's other tables."""
    return _merged(top, _parent_tables(statement_parents, statement_methods), None)


def _parent_tables(statement_parents: dict[cst.CSTNode, dict[cst.CSTNode, cst.CSTNode]],
                   statement_methods: dict[cst.CSTNode, dict[cst.CSTNode, MethodLayout]]
                   ) -> list[dict[cst.CSTNode, cst.CSTNode]]:
    """The parents tables of a layout's statements and methods: together, every node's parent but the module's own
    children's."""
    methods = [method for known in statement_methods.values() for method in known.values()]
    return [*statement_parents.values(), *(method.parents for method in methods),
            *(statement.parents for method in methods for statement in method.statements.values())]


def _merged(top: dict[cst.CSTNode, cst.CSTNode], parts: list[dict[cst.CSTNode, cst.CSTNode]],
            earlier: Layout | None) -> dict[cst.CSTNode, cst.CSTNode]:
    """`top` and `parts` in one table. From an earlier layout's table where there is one: the tables of what a
    codemod handed on as it was are the same objects, so only the nodes of the tables it dropped are taken out and
    those of its new ones put in (merging every table again was a twentieth of the chain)."""
    if earlier is None or earlier.parents is None:
        merged = dict(top)
        for part in parts:
            merged.update(part)
        return merged
    return _merged_from(earlier, top, parts)


def _merged_from(earlier: Layout, top: dict[cst.CSTNode, cst.CSTNode], parts: list[dict[cst.CSTNode, cst.CSTNode]]
                 ) -> dict[cst.CSTNode, cst.CSTNode]:
    """`_merged` from the earlier layout's table."""
    merged = dict(earlier.parents)
    now = {id(part) for part in parts}
    earlier_parts = _parent_tables(earlier.statement_parents, earlier.statement_methods)
    for part in [earlier.top, *earlier_parts]:
        if id(part) not in now:  # earlier's tables are disjoint (it held each node once): each node goes once
            for node in part:
                del merged[node]
    then = {id(part) for part in earlier_parts}
    merged.update(top)
    for part in parts:
        if id(part) not in then:
            merged.update(part)
    return merged


def _holds_known(member: cst.CSTNode, statements: dict[cst.CSTNode, StatementLayout]) -> bool:
    """The member of a class is a method whose body holds a statement an earlier layout generated."""
    return type(member) is cst.FunctionDef and type(member.body) is cst.IndentedBlock \
        and any(statement in statements for statement in member.body.body)


def _class_codegen(cls: cst.ClassDef, state: _LayoutState | _ReusingTextState,
                   methods: dict[cst.CSTNode, MethodLayout], statements: dict[cst.CSTNode, StatementLayout]) -> None:
    """`cls._codegen(state)` with the methods an earlier layout generated under the same indent copied from it, and
    the statements it generated in the others (`_method_codegen`). The class's own code is libcst's ClassDef and
    IndentedBlock `_codegen_impl` (tests/test_pipeline_shortcuts.py holds the text and parents to a generation of the
    whole class)."""
    state.before_codegen(cls)
    _lines_above_codegen(cls, state)
    state.add_indent_tokens()
    state.add_token("class")
    cls.whitespace_after_class._codegen(state)
    cls.name._codegen(state)
    cls.whitespace_after_name._codegen(state)
    if cls.type_parameters is not None:
        cls.type_parameters._codegen(state)
    cls.whitespace_after_type_parameters._codegen(state)
    if isinstance(cls.lpar, cst.MaybeSentinel):
        if cls.bases or cls.keywords:
            state.add_token("(")
    elif isinstance(cls.lpar, cst.LeftParen):
        cls.lpar._codegen(state)
    arguments = [*cls.bases, *cls.keywords]
    for index, argument in enumerate(arguments):
        argument._codegen(state, default_comma=index != len(arguments) - 1)
    if isinstance(cls.rpar, cst.MaybeSentinel):
        if cls.bases or cls.keywords:
            state.add_token(")")
    elif isinstance(cls.rpar, cst.RightParen):
        cls.rpar._codegen(state)
    cls.whitespace_before_colon._codegen(state)
    state.add_token(":")
    block = cls.body
    indent = _block_start_codegen(block, state)
    for statement in block.body:  # not empty: it holds a method
        known = methods.get(statement)
        if known is not None and known.indent == indent:
            state.add_method(statement, known)
        elif _holds_known(statement, statements):
            _method_codegen(statement, state, statements)
        else:
            statement._codegen(state)
    _block_end_codegen(block, state)
    state.after_codegen(cls)


def _method_codegen(method: cst.FunctionDef, state: _LayoutState | _ReusingTextState,
                    statements: dict[cst.CSTNode, StatementLayout]
                    ) -> None:
    """`method._codegen(state)` with the statements of its body an earlier layout generated under the same indent
    copied from it: a codemod that rewrites one statement of a long `forward` hands the others on as they were. The
    method's own code is libcst's FunctionDef and IndentedBlock `_codegen_impl` (tests/test_pipeline_shortcuts.py
    holds the text and parents to a generation of the whole method)."""
    state.before_codegen(method)
    _lines_above_codegen(method, state)
    _def_line_codegen(method, state)
    block = method.body
    indent = _block_start_codegen(block, state)
    for statement in block.body:  # not empty: it holds a statement an earlier layout generated
        known = statements.get(statement)
        if known is not None and known.indent == indent:
            state.add_statement(statement, known)
        else:
            statement._codegen(state)
    _block_end_codegen(block, state)
    state.after_codegen(method)


def _lines_above_codegen(node: cst.ClassDef | cst.FunctionDef, state: CodegenState) -> None:
    """A class's or a function's blank lines and comments above it, and its decorators, as libcst generates them."""
    for line in node.leading_lines:
        line._codegen(state)
    for decorator in node.decorators:
        decorator._codegen(state)
    for line in node.lines_after_decorators:
        line._codegen(state)


def _block_start_codegen(block: cst.IndentedBlock, state: CodegenState) -> tuple[str, ...]:
    """libcst's IndentedBlock `_codegen_impl` up to its statements; the indent tokens they are generated under."""
    state.before_codegen(block)
    block.header._codegen(state)
    state.increase_indent(state.default_indent if block.indent is None else block.indent)
    return tuple(state.indent_tokens)


def _block_end_codegen(block: cst.IndentedBlock, state: CodegenState) -> None:
    """libcst's IndentedBlock `_codegen_impl` after its statements."""
    for line in block.footer:
        line._codegen(state)
    state.decrease_indent()
    state.after_codegen(block)


def _def_line_codegen(method: cst.FunctionDef, state: CodegenState) -> None:
    """libcst's FunctionDef `_codegen_impl` from the indent of the `def` line up to its colon."""
    state.add_indent_tokens()
    if method.asynchronous is not None:
        method.asynchronous._codegen(state)
    state.add_token("def")
    method.whitespace_after_def._codegen(state)
    method.name._codegen(state)
    method.whitespace_after_name._codegen(state)
    if method.type_parameters is not None:
        method.type_parameters._codegen(state)
    method.whitespace_after_type_parameters._codegen(state)
    state.add_token("(")
    method.whitespace_before_params._codegen(state)
    method.params._codegen(state)
    state.add_token(")")
    if method.returns is not None:
        method.returns._codegen(state, default_indicator="->")
    method.whitespace_before_colon._codegen(state)
    state.add_token(":")


def _is_method(node: cst.CSTNode, cls: cst.CSTNode, parent: cst.CSTNode) -> bool:
    """A node three levels under the module is a method of a top-level class."""
    return type(node) is cst.FunctionDef and type(cls) is cst.ClassDef and type(parent) is cst.IndentedBlock


def _in_block(node: cst.CSTNode, parent: cst.CSTNode) -> bool:
    """The node is a statement of the block it is in."""
    return type(parent) is cst.IndentedBlock and isinstance(node, cst.BaseStatement)


def newlines_in(value: str) -> int:
    return value.count("\n") + value.count("\r") - value.count("\r\n")  # libcst's newlines: \r\n, \r and \n


class _LayoutState(_TextState):
    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.module = module
        self.top: dict[cst.CSTNode, cst.CSTNode] = {}  # parents of the module's own children
        self.statement_parents: dict[cst.CSTNode, dict[cst.CSTNode, cst.CSTNode]] = {}  # and of those under each
        self.statement_texts: dict[cst.CSTNode, str] = {}
        self.first_lines: dict[cst.CSTNode, int] = {}
        self.statement_methods: dict[cst.CSTNode, dict[cst.CSTNode, MethodLayout]] = {}
        self.duplicated = False
        self.line = 1
        self._generating: list[cst.CSTNode] = []
        self._into = self.top  # where the parents of the nodes being generated go
        self._statement_start = 0  # the token the statement being generated starts at
        self._method: cst.CSTNode | None = None  # the method of a top-level class being generated
        self._method_start = (0, 0, ())  # its first line, first token and indent tokens
        self._method_statements: dict[cst.CSTNode, StatementLayout] = {}  # MethodLayout.statements
        self._method_parents: dict[cst.CSTNode, cst.CSTNode] = {}  # MethodLayout.parents
        self._body_statement: cst.CSTNode | None = None  # the statement of that method's body being generated
        self._body_statement_start = (0, 0, ())  # its first line, first token and indent tokens

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        if "\n" in value or "\r" in value:
            self.line += newlines_in(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        # Called for every node of the tree: one look-up of each table, and a node already held is seen by the size.
        # Only a node less than six levels down (the module's statements, a class's methods, their statements) is
        # looked at further.
        generating, parents = self._generating, self._into
        depth = len(generating)
        if depth:
            parent = generating[-1]
            held = len(parents)
            parents[node] = parent
            if len(parents) == held:
                self.duplicated = True
            if depth < 6:
                self._note_start(node, depth, parent)
        generating.append(node)

    def _note_start(self, node: cst.CSTNode, depth: int, parent: cst.CSTNode) -> None:
        """Where a statement of the module's body, a method of a top-level class or a statement of its body starts, and
        the table its nodes' parents go into."""
        if depth == 1 and isinstance(node, cst.BaseStatement):  # a statement of the module's body
            self.first_lines[node] = self.line
            self._into = self.statement_parents[node] = {}
            self._statement_start = len(self.tokens)
        elif depth == 3 and _is_method(node, self._generating[1], parent):
            self._method, self._method_start = node, (self.line, len(self.tokens), tuple(self.indent_tokens))
            self._into = self._method_parents = {}  # a method's parents on their own
            self._method_statements = {}
        elif depth == 5 and self._generating[3] is self._method and _in_block(node, parent):
            self._body_statement = node  # a statement of the body of that method
            self._body_statement_start = (self.line, len(self.tokens), tuple(self.indent_tokens))
            self._into = {}

    def after_codegen(self, node: cst.CSTNode) -> None:
        generating = self._generating
        generating.pop()
        if node is self._method:
            line, start, indent = self._method_start
            statement = generating[1]
            self.statement_methods.setdefault(statement, {})[node] = MethodLayout(
                line - self.first_lines[statement], indent, "".join(self.tokens[start:]), self._into,
                self._method_statements)
            self._into, self._method = self.statement_parents[statement], None
        elif node is self._body_statement:
            line, start, indent = self._body_statement_start
            self._method_statements[node] = StatementLayout(line - self._method_start[0], indent,
                                                            "".join(self.tokens[start:]), self._into)
            self._into, self._body_statement = self._method_parents, None
        elif len(generating) == 1 and self._into is not self.top:  # the end of a statement of the module's body
            self.statement_texts[node] = "".join(self.tokens[self._statement_start:])
            self._into = self.top

    def add_method(self, method: cst.CSTNode, known: MethodLayout) -> None:
        """A method of the top-level class being generated, as an earlier layout generated it under the same indent."""
        statement = self._generating[1]
        parents = self._into
        held = len(parents)
        parents[method] = self._generating[-1]
        if len(parents) == held:
            self.duplicated = True
        self.statement_methods.setdefault(statement, {})[method] = known._replace(
            line=self.line - self.first_lines[statement])
        self.add_token(known.text)

    def add_statement(self, statement: cst.CSTNode, known: StatementLayout) -> None:
        """A statement of the body of the method being generated, as an earlier layout generated it under the same
        indent."""
        parents = self._into
        held = len(parents)
        parents[statement] = self._generating[-1]
        if len(parents) == held:
            self.duplicated = True
        self._method_statements[statement] = known._replace(line=self.line - self._method_start[0])
        self.add_token(known.text)

    def add_generated(self, statement: cst.CSTNode, text: str, below: dict[cst.CSTNode, cst.CSTNode],
                      methods: dict[cst.CSTNode, MethodLayout] | None) -> None:
        """A statement of the module's body as an earlier layout generated it: its text, the parents under it and
        where its methods start."""
        if methods is not None:
            self.statement_methods[statement] = methods
        held = len(self.top)
        self.top[statement] = self.module
        if len(self.top) == held:
            self.duplicated = True
        self.first_lines[statement] = self.line
        self.statement_parents[statement] = below
        self.statement_texts[statement] = text
        self.add_token(text)


def position_table(module: cst.Module) -> dict[cst.CSTNode, Span]:
    """Every node of the module with its (start, end), as `PositionProvider` would give them."""
    state = _PositionState(module.default_indent, module.default_newline)
    module._codegen(state)
    return state.table


def method_position_table(method: cst.FunctionDef, indent: tuple[str, ...], defaults: tuple[str, str]
                          ) -> dict[cst.CSTNode, Span]:
    """`position_table` of the nodes of one method, generated alone under the indent tokens its class gives it (what
    `Layout.statement_methods` records), with lines counted from the method's own first line: a node's line in the
    module is its line here plus the method's first line less one, its column the same. The same for one statement
    of a method's body under its own indent tokens (`MethodLayout.statements`)."""
    state = _PositionState(*defaults)
    state.indent_tokens.extend(indent)
    method._codegen(state)
    return state.table


def positions_and_parents(module: cst.Module) -> tuple[dict[cst.CSTNode, Span], dict[cst.CSTNode, cst.CSTNode],
                                                        list[cst.CSTNode]]:
    """`position_table`, the parents `layout_of` gives, and the nodes that sit in more than one place in the tree, from
    one generation of the code. A node's parent is that of its last place, as libcst's ParentNodeProvider gives it;
    its position is that of its first place, where libcst's PositionProvider gives the last: equal for every node
    that sits in one place."""
    state = _PositionAndParentState(module.default_indent, module.default_newline)
    module._codegen(state)
    return state.table, state.parents, state.duplicated


class _PositionState(CodegenState):
    def __init__(self, default_indent: str, default_newline: str) -> None:
        super().__init__(default_indent=default_indent, default_newline=default_newline)
        self.table: dict[cst.CSTNode, Span] = {}
        self.line = 1
        self.column = 0
        self._starts: list[Point] = []

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        if "\n" in value or "\r" in value:
            self.line += newlines_in(value)
            self.column = len(value) - max(value.rfind("\n"), value.rfind("\r")) - 1
        else:
            self.column += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._starts.pop()
        if node not in self.table:  # a syntactic position recorded inside the node's codegen wins
            self.table[node] = (start, (self.line, self.column))

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None,
                                  end_node: cst.CSTNode | None = None) -> _Syntactic:
        return _Syntactic(self, node, start_node, end_node)


class _Syntactic:
    """The span of the code generated inside the `with`, or hoisted from the start and end nodes libcst names."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: _PositionState, node: cst.CSTNode, start_node: cst.CSTNode | None,
                 end_node: cst.CSTNode | None) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(self, *exc: object) -> bool:
        state, table = self.state, self.state.table
        start = table[self.start_node][0] if self.start_node is not None else self.start
        end = table[self.end_node][1] if self.end_node is not None else (state.line, state.column)
        table[self.node] = (start, end)
        return False


class _PositionAndParentState(_PositionState):
    def __init__(self, default_indent: str, default_newline: str) -> None:
        super().__init__(default_indent, default_newline)
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self.duplicated: list[cst.CSTNode] = []
        self._generating: list[cst.CSTNode] = []

    def before_codegen(self, node: cst.CSTNode) -> None:
        super().before_codegen(node)
        generating, parents = self._generating, self.parents
        if generating:
            held = len(parents)
            parents[node] = generating[-1]
            if len(parents) == held:
                self.duplicated.append(node)
        generating.append(node)

    def after_codegen(self, node: cst.CSTNode) -> None:
        super().after_codegen(node)
        self._generating.pop()
