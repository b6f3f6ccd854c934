"""What every rule shares: a code, a message, the skill that explains it, and `report()`; and the one
walk over a file's tree that runs every rule.

A rule is an `ast` visitor (TorchFix style): `visit_<NodeType>(node)` methods, where `visit_FunctionDef`
also gets `async def`s. All rules of a scan run in one walk (`SourceFile.run`), which keeps the
enclosing functions, classes and eager-only guards on a stack, so rules ask `self.in_step_code(node)`,
`self.enclosing_function(node)` and `self.qualname(node)` about the node being visited (or one of its
children) without a parent map.
"""
from __future__ import annotations

import ast
import bisect
import functools
import keyword
import re
from collections.abc import Callable, Sequence
from typing import ClassVar

from graphmode.transforms.analysis.astutil import CHILD_FIELDS, FUNCTION_TYPES, ast_dotted_name
from graphmode.transforms.analysis.reach import leaves_static_path, model_code_field
from graphmode.transforms.findings import Finding

# `not torch.compiler.is_compiling()` (or `torch._dynamo.is_compiling()`), spaces ignored.
_GUARD_CALLS = frozenset({"torch.compiler.is_compiling", "torch._dynamo.is_compiling"})
_GUARD_TEXTS = frozenset({"nottorch.compiler.is_compiling()", "nottorch._dynamo.is_compiling()"})
_NEWLINE = re.compile(r"\r\n|\r|\n")
_IDENTIFIER_END = re.compile(r"\w+$")


class Span:
    """A reported position that is not a node's own start: 1-based line, 0-based character column."""

    __slots__ = ("lineno", "column")

    def __init__(self, lineno: int, column: int) -> None:
        self.lineno = lineno
        self.column = column


class SourceFile:
    """One parsed file: its text, its tree, the functions a model step reaches, positions and source
    text of nodes, and the state of the walk (which scopes enclose the node being visited)."""

    def __init__(self, source: str, path: str, tree: ast.Module, step_functions: set[ast.AST]) -> None:
        self.source = source
        self.path = path
        self.tree = tree
        self.step_functions = step_functions  # see transforms.analysis.reach
        self._ascii = source.isascii()
        self._starts: list[int] | None = None
        self._facts: dict[str, object] = {}
        # Walk state, for the node being visited (`current`): enclosing functions and classes
        # (outermost first), enclosing functions only, and per enclosing function the number of
        # eager-only guards between it and the node.
        self.current: ast.AST | None = None
        self.scopes: list[ast.AST] = []
        self.functions: list[ast.AST] = []
        self._guards: list[int] = []
        self._reached = 0  # enclosing functions that a step reaches
        self.in_step = False

    # -- module-wide facts, computed once on first use ------------------------------------------------

    def fact(self, name: str, compute: Callable[[ast.Module], object]) -> object:
        if name not in self._facts:
            self._facts[name] = compute(self.tree)
        return self._facts[name]

    # -- positions and source text ---------------------------------------------------------------------

    def _line_starts(self) -> list[int]:
        if self._starts is None:
            self._starts = [0] + [m.end() for m in _NEWLINE.finditer(self.source)]
        return self._starts

    def column(self, lineno: int, col_offset: int) -> int:
        """The character column of `ast`'s UTF-8 byte offset `col_offset` on line `lineno`."""
        if self._ascii:
            return col_offset
        start = self._line_starts()[lineno - 1]
        text = self.source[start:start + col_offset]  # at least the col_offset bytes' characters
        return len(text.encode("utf-8")[:col_offset].decode("utf-8", "ignore"))

    def offset(self, lineno: int, col_offset: int) -> int:
        """Index into `source` of a node position (line, UTF-8 byte column)."""
        return self._line_starts()[lineno - 1] + self.column(lineno, col_offset)

    def span_at(self, index: int) -> Span:
        starts = self._line_starts()
        line = bisect.bisect_right(starts, index)
        return Span(line, index - starts[line - 1])

    def _skip_back(self, index: int, floor: int) -> int:
        """Back over whitespace, line continuations and comments from index, not past floor; where the
        code before ends."""
        source = self.source
        while index > floor:
            char = source[index - 1]
            if char in " \t\f\\":
                index -= 1
            elif char in "\r\n":
                index -= 1
                start = source.rfind("\n", 0, index) + 1
                start = max(start, source.rfind("\r", 0, index) + 1)
                line = source[start:index]
                if "#" in line:
                    comment = _comment_start(line)
                    if comment >= 0:
                        index = max(start + comment, floor)
            else:
                break
        return index

    def _skip_forward(self, index: int) -> int:
        source = self.source
        end = len(source)
        while index < end:
            char = source[index]
            if char in " \t\f\\\r\n":
                index += 1
            elif char == "#":
                while index < end and source[index] not in "\r\n":
                    index += 1
            else:
                break
        return index

    def own_range(self, node: ast.AST, within: ast.AST | None = None) -> tuple[int, int]:
        """Where node's text starts and ends in `source`, with the parentheses that wrap only it (libcst
        makes them part of the node; `ast` leaves them out), but not a call's own parentheses. `within`
        is a node that holds node and those parentheses (its statement, its call): the search for them
        does not go back past its start."""
        start = self.offset(node.lineno, node.col_offset)
        end = self.offset(node.end_lineno, node.end_col_offset)
        floor = 0 if within is None else self.offset(within.lineno, within.col_offset)
        while True:
            before = self._skip_back(start, floor)
            after = self._skip_forward(end)
            if not self._in_parentheses(before, after, floor) or self._opens_call(before - 1, floor):
                return start, end
            start, end = before - 1, after + 1

    def _in_parentheses(self, before: int, after: int, floor: int) -> bool:
        """Whether a `(` ends at `before` (not back past `floor`) and a `)` starts at `after`."""
        source = self.source
        return before > floor and source[before - 1] == "(" and after < len(source) and source[after] == ")"

    def _opens_call(self, paren: int, floor: int) -> bool:
        """Whether the `(` at `paren` is a call's own: after `f`, `a[0]`, `"..."` (but `if (x)`, `not (x)` are the
        node's own)."""
        source = self.source
        prior = self._skip_back(paren, floor)
        char = source[prior - 1] if prior > floor else ""
        if char and char in ")]'\"":
            return True
        if char.isidentifier() or char.isdigit():
            word = _IDENTIFIER_END.search(source[max(0, prior - 12):prior])
            return word is None or not keyword.iskeyword(word.group())
        return False

    def code_of(self, node: ast.AST, within: ast.AST | None = None) -> str:
        """node's source text as libcst prints it: verbatim, with its own parentheses (see own_range)."""
        start, end = self.own_range(node, within)
        return self.source[start:end]

    def own_start(self, node: ast.AST, within: ast.AST | None = None) -> Span:
        """Where node starts, counting the parentheses that wrap only it (see own_range)."""
        return self.span_at(self.own_range(node, within)[0])

    def decorator_start(self, expression: ast.expr) -> Span:
        """The `@` of the decorator whose expression this is."""
        index = self._skip_back(self.own_range(expression)[0], 0)
        if index > 0 and self.source[index - 1] == "@":
            return self.span_at(index - 1)
        return self.own_start(expression)

    def segment(self, node: ast.AST) -> str:
        """node's source text, without parentheses around it."""
        return self.source[self.offset(node.lineno, node.col_offset):self.offset(node.end_lineno, node.end_col_offset)]

    def is_eager_guard(self, node: ast.If) -> bool:
        """`not torch.compiler.is_compiling()` (or `torch._dynamo.is_compiling()`), spaces ignored; or
        `not isinstance(NAME, torch.Tensor)`, the conversion of a Python value some callers still pass (the
        positions graphmode's static_positions accepts as an int): Decode's entries pass tensors, so the
        compiled graph never holds that branch."""
        test = node.test
        if not (test.__class__ is ast.UnaryOp and test.op.__class__ is ast.Not):
            return False
        call = test.operand
        if _is_tensor_check(call):
            return True
        if not (call.__class__ is ast.Call and not call.args and not call.keywords
                and ast_dotted_name(call.func) in _GUARD_CALLS):
            return False
        return self.code_of(test, node).replace(" ", "") in _GUARD_TEXTS

    # -- the walk ----------------------------------------------------------------------------------------

    def run(self, rules: Sequence[Rule]) -> None:
        """One walk over the tree, calling every rule's `visit_<NodeType>` on every node, parents first.
        Outside step code, rules that report only in step code (STEP_ONLY) are not called."""
        everywhere = _dispatch_table(rules)
        anywhere = _dispatch_table([r for r in rules if not r.STEP_ONLY])
        fields_of = CHILD_FIELDS
        function_types = FUNCTION_TYPES
        step_functions = self.step_functions
        scopes, functions, guards = self.scopes, self.functions, self._guards
        table = anywhere
        class_def, if_stmt, if_exp = ast.ClassDef, ast.If, ast.IfExp
        # Nodes with nothing under them that no rule visits (names, constants, `pass`) are not entered.
        leaves = frozenset(cls for cls, fields in fields_of.items() if not fields and cls not in everywhere)

        def walk(node: ast.AST) -> None:
            nonlocal table
            cls = node.__class__
            handlers = table.get(cls)
            if handlers is not None:
                self.current = node
                for handler in handlers:
                    handler(node)
            entered = None
            if cls in function_types:
                entered = cls
                scopes.append(node)
                functions.append(node)
                guards.append(0)
                if node in step_functions:
                    self._reached += 1
                self.in_step = self._reached > 0
                table = everywhere if self.in_step else anywhere
            elif cls is class_def:
                entered = cls
                scopes.append(node)
            elif cls is if_stmt and self._reached and guards and self.is_eager_guard(node):
                entered = cls
                guards[-1] += 1
                self.in_step = False
                table = anywhere
            # A forked method's own code (transforms/output/static_path.py) is eager: the static path never runs it.
            model_field = model_code_field(node) if (cls is if_stmt or cls is if_exp) and self._reached and guards \
                else None
            for field in fields_of[cls]:
                value = getattr(node, field)
                if value.__class__ is list:
                    if field == model_field:
                        walk_eager(value)
                        continue
                    for index, item in enumerate(value):
                        if item is not None and item.__class__ not in leaves:
                            walk(item)
                            if item.__class__ is if_stmt and self._reached and guards and leaves_static_path(item):
                                walk_eager(value[index + 1:])
                                break
                elif field == model_field:
                    walk_eager([value])
                elif value is not None and value.__class__ not in leaves:
                    walk(value)
            if entered is not None:
                if entered is if_stmt:
                    guards[-1] -= 1
                else:
                    scopes.pop()
                    if entered is not class_def:
                        functions.pop()
                        guards.pop()
                        if node in step_functions:
                            self._reached -= 1
                self.in_step = self._reached > 0 and guards[-1] == 0  # no function left: _reached is 0
                table = everywhere if self.in_step else anywhere

        def walk_eager(items: list[ast.AST]) -> None:
            """Statements of a step function that only its eager callers run, walked as under an eager guard."""
            nonlocal table
            guards[-1] += 1
            self.in_step, table = False, anywhere
            for item in items:
                walk(item)
            guards[-1] -= 1
            self.in_step = self._reached > 0 and guards[-1] == 0
            table = everywhere if self.in_step else anywhere

        walk(self.tree)
        self.current = None


def _is_tensor_check(call: ast.expr) -> bool:
    """`isinstance(NAME, torch.Tensor)`."""
    return call.__class__ is ast.Call and ast_dotted_name(call.func) == "isinstance" and len(call.args) == 2 \
        and call.args[0].__class__ is ast.Name and ast_dotted_name(call.args[1]) == "torch.Tensor"


def _dispatch_table(rules: Sequence[Rule]) -> dict[type, tuple[Callable[[ast.AST], None], ...]]:
    """Node class -> the rules' visit methods for it, in rule order."""
    table: dict[type, list[Callable[[ast.AST], None]]] = {}
    for rule in rules:
        for attribute, classes in _visits(type(rule)):
            handler = getattr(rule, attribute)
            for cls in classes:
                table.setdefault(cls, []).append(handler)
    return {cls: tuple(handlers) for cls, handlers in table.items()}


@functools.cache
def _visits(rule: type[Rule]) -> tuple[tuple[str, tuple[type, ...]], ...]:
    """A rule class's `visit_<NodeType>` methods and the node classes each is for."""
    found = []
    for attribute in dir(rule):
        if attribute.startswith("visit_"):
            cls = getattr(ast, attribute[len("visit_"):])
            found.append((attribute, FUNCTION_TYPES if cls is ast.FunctionDef else (cls,)))
    return tuple(found)


def _comment_start(line: str) -> int:
    """Index of the `#` that starts a comment on this physical line, or -1 (strings are skipped)."""
    quote = ""
    index = 0
    while index < len(line):
        char = line[index]
        if quote:
            if char == "\\":
                index += 1
            elif line.startswith(quote, index):
                index += len(quote) - 1
                quote = ""
        elif char in "'\"":
            quote = char * 3 if line.startswith(char * 3, index) else char
            index += len(quote) - 1
        elif char == "#":
            return index
        index += 1
    return -1


class Rule:
    CODE: ClassVar[str]
    MESSAGE: ClassVar[str]
    SKILL: ClassVar[str]
    # Which codemods fix a rule is stated once, by each codemod's FIXES (transforms.scan.may_fix reads them).
    # True when the rule reports only where `in_step_code(node)` holds for the visited node: the walk
    # then skips it outside step code.
    STEP_ONLY: ClassVar[bool] = False
    # What the traced run (runners.evidence.collect) can say of this rule's hazard. TRACED: it can see the hazard or
    # rule it out on a line Decode runs, so a finding of this code on such a line without it is dropped. EXPLAINED_BY:
    # the codes whose static finding on a line already explains what the trace saw there (no second finding).
    TRACED: ClassVar[bool] = False
    EXPLAINED_BY: ClassVar[frozenset[str]] = frozenset()
    # Fixit-style examples, each scanned as a whole file of its own (tests/test_rule_examples.py): snippets
    # this rule must not report, and snippets it must report at least once. They document where the rule's
    # edges lie (what it deliberately leaves alone), so they are written indented and dedented before use.
    VALID: ClassVar[tuple[str, ...]]
    INVALID: ClassVar[tuple[str, ...]]

    def __init__(self, file: SourceFile) -> None:
        self.file = file
        self.path = file.path
        self.findings: list[Finding] = []

    def report(self, node: ast.AST | Span, message: str | None = None) -> None:
        """A finding at node: the node being visited, or one of its children (a parameter, an argument)."""
        if isinstance(node, Span):
            line, column = node.lineno, node.column
        else:
            line, column = node.lineno, self.file.column(node.lineno, node.col_offset)
        self.findings.append(
            Finding(
                code=self.CODE,
                path=self.path,
                line=line,
                column=column + 1,
                message=message or self.MESSAGE,
                skill=self.SKILL,
                function=self.qualname(node),
            )
        )

    def _enclosing(self, node: ast.AST | Span) -> list[ast.AST]:
        """Enclosing functions and classes, outermost first."""
        current = self.file.current
        if node is not current and isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [*self.file.scopes, current]
        return self.file.scopes

    def qualname(self, node: ast.AST | Span) -> str:
        return ".".join(scope.name for scope in self._enclosing(node))

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        for scope in reversed(self._enclosing(node)):
            if isinstance(scope, FUNCTION_TYPES):
                return scope
        return None

    def in_step_code(self, node: ast.AST) -> bool:
        """Inside a function a model step reaches (see transforms.analysis.reach), and not under an
        `if not torch.compiler.is_compiling():` guard (eager-only code)."""
        file = self.file
        current = file.current
        if node is current:
            return file.in_step
        # A child of the node being visited: that node, when a function or a guard, encloses it too.
        if isinstance(current, FUNCTION_TYPES):
            return file._reached > 0 or current in file.step_functions
        if isinstance(current, ast.If) and file.in_step and file.is_eager_guard(current):
            return False
        return file.in_step
