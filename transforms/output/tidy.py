"""The last pass over an adapted file: what the codemods left behind that nobody reads, taken out of graphmode's code.

A codemod rewrites the lines its idiom covers and leaves the rest of a function as it was, so a static twin can keep
a local the rewrite no longer reads (`kv_seq_len = self.kv_cache.max_seq_len` once attention reads every slot), a
or a branch whose two arms became the same. A person would not write them; a linter flags them.

Only code graphmode wrote is touched: functions whose docstring says "(added by graphmode)" (the static twins, the
entries, the helpers). The model's own functions stay as they are, byte for byte:
the adapted file still does everything the original does.
"""
from __future__ import annotations

import libcst as cst
from libcst.metadata import FunctionScope, MetadataWrapper, ParentNodeProvider, ScopeProvider

from graphmode.transforms.cstutil import code_of, is_docstring, nodes_of_type, walk
from graphmode.transforms.dispatch import Transformer

MARKER = "(added by graphmode)"
# Calls whose result is a fact about their arguments and that change nothing: an assignment of one may go.
# (`get_usable_length` and `get_seq_length` are transformers' cache queries: the static twin reads the buffers instead.)
_PURE_METHODS = frozenset({"size", "dim", "numel", "get_usable_length", "get_seq_length"})
_PURE_FUNCTIONS = frozenset({"len", "max", "min", "isinstance"})


def tidy(module: cst.Module) -> cst.Module:
    """`module` with dead locals and identical branches taken out of graphmode's functions."""
    return module.visit(_TidyFunctions())


def added_by_graphmode(function: cst.FunctionDef) -> bool:
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else []
    if not body or not is_docstring(body[0]):
        return False
    docstring = body[0].body[0].value
    return isinstance(docstring, cst.SimpleString) and MARKER in docstring.value or (
        isinstance(docstring, cst.ConcatenatedString) and MARKER in code_of(docstring))


class _TidyFunctions(Transformer):
    # Only functions change, so the walk enters no line of simple statements and no function that defines none:
    # rebuilding them would only cost time.
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return any(isinstance(n, (cst.FunctionDef, cst.ClassDef)) for n in walk(node.body, _statements_only))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if not added_by_graphmode(updated_node):
            return updated_node
        while True:  # a local removed can leave another one unread
            merger = _MergeIdenticalBranches()
            has_else = any(isinstance(n, cst.If) and isinstance(n.orelse, cst.Else)
                           for n in walk(updated_node.body, _statements_only))
            tidier = updated_node.visit(merger) if has_else else updated_node  # else nothing to merge
            dead, collected = _unread(tidier)
            if not (merger.merged or dead or collected):
                return updated_node  # the visit rebuilt the same tree: no need to compare it
            if collected:
                tidier = tidier.visit(_DropAppends(collected))
            if dead | collected:
                tidier = tidier.visit(_DropAssignments(dead | collected))
            if tidier.deep_equals(updated_node):
                return updated_node
            updated_node = tidier


def _statements_only(node: cst.CSTNode) -> list[cst.CSTNode] | None:
    """For `walk`: statements and the blocks around them, no expression (a function or an `if` is never in one)."""
    return [] if isinstance(node, (cst.SimpleStatementLine, cst.BaseExpression)) else None


def _unread(function: cst.FunctionDef, shortcut: bool = True) -> tuple[set[str], set[str]]:
    """`_unread_locals` and `_unread_lists` of the function, from one scope analysis, or none without it when each
    name the function gives a value with no effect is read after (`_each_read_after`: most functions, and every
    function on the round that finds its locals all read). The analysis keys its tables by node, so a function that
    holds one node in two places is analysed on a copy (libcst's default); copying the others would only cost time.
    """
    if shortcut and _each_read_after(function):
        return set(), set()
    wrapper = MetadataWrapper(cst.Module(body=[function]), unsafe_skip_copy=_each_node_once(function))
    scopes = wrapper.resolve(ScopeProvider)
    copy = wrapper.module.body[0]
    scope = scopes[copy.body.body[0]]
    if not isinstance(scope, FunctionScope):
        return set(), set()
    return _unread_locals(function, copy, scope), _unread_lists(copy, scope, wrapper)


class _Unsure(Exception):
    """The function holds something `_each_read_after` does not follow; the scope analysis decides."""


# Nodes the walk for reads does not enter: their own scopes (names there are parameters and targets of their own).
_OWN_SCOPES = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _each_read_after(function: cst.FunctionDef) -> bool:
    """Whether every name the function's own statements assign a value with no effect (a `_pairs` target) is read in
    a later statement: then libcst's scope analysis finds a reference of that assignment (it counts a read after an
    assignment, in visiting order, as one), so `_unread_locals` names nothing, and, with no `name = []`,
    `_unread_lists` names nothing. Only reads that are surely the function's own count (a value, a test, an iterable,
    never a target, an attribute's name, a keyword, or what a lambda or comprehension reads); a function with a nested
    function or class, an import, `global`, `nonlocal`, `match` or `name = []` is left to the analysis (False).
    tests/test_tidy.py holds it to the analysis on every function graphmode writes for the fixtures and examples."""
    assigned: dict[str, int] = {}  # name -> the statement (counted in visiting order) first assigning it
    last_read: dict[str, int] = {}  # name -> the last statement reading it
    count = 0

    def read(node: cst.CSTNode | None, at: int) -> None:
        if node is None:
            return
        for found in walk(node, _reads_only):
            if isinstance(found, cst.Name):
                last_read[found.value] = at

    def small(stmt: cst.BaseSmallStatement, at: int) -> None:
        if isinstance(stmt, (cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal)):
            raise _Unsure
        if isinstance(stmt, cst.Assign):
            for target, value in _pairs(stmt):
                if isinstance(value, cst.List) and not value.elements:
                    raise _Unsure
                if _pure(value):
                    assigned.setdefault(target.value, at)
            read(stmt.value, at)
        elif isinstance(stmt, (cst.Expr, cst.Return, cst.AugAssign, cst.AnnAssign)):
            read(stmt.value, at)
        elif isinstance(stmt, cst.Assert):
            read(stmt.test, at)
            read(stmt.msg, at)
        elif isinstance(stmt, cst.Raise):
            read(stmt.exc, at)
            read(stmt.cause, at)

    def block(body: cst.BaseSuite) -> None:
        statements = body.body
        if isinstance(body, cst.SimpleStatementSuite):
            statements = [cst.SimpleStatementLine(body=body.body)]
        for stmt in statements:
            statement(stmt)

    def statement(stmt: cst.BaseStatement) -> None:
        nonlocal count
        count += 1
        at = count
        if isinstance(stmt, cst.SimpleStatementLine):
            for part in stmt.body:
                small(part, at)
        elif isinstance(stmt, (cst.If, cst.While)):
            read(stmt.test, at)
            block(stmt.body)
            if isinstance(stmt.orelse, cst.If):
                statement(stmt.orelse)
            elif stmt.orelse is not None:
                block(stmt.orelse.body)
        elif isinstance(stmt, cst.For):
            read(stmt.iter, at)
            block(stmt.body)
            if stmt.orelse is not None:
                block(stmt.orelse.body)
        elif isinstance(stmt, cst.With):
            for item in stmt.items:
                read(item.item, at)
            block(stmt.body)
        elif isinstance(stmt, cst.Try):
            block(stmt.body)
            for handler in stmt.handlers:
                count += 1
                read(handler.type, count)
                block(handler.body)
            for part in (stmt.orelse, stmt.finalbody):
                if part is not None:
                    block(part.body)
        else:
            raise _Unsure

    try:
        block(function.body)
    except _Unsure:
        return False
    return all(last_read.get(name, 0) > at for name, at in assigned.items())


def _reads_only(node: cst.CSTNode) -> list[cst.CSTNode] | None:
    if isinstance(node, (cst.Attribute, cst.Arg)):
        return [node.value]  # an attribute's name, a keyword's name: not reads
    if isinstance(node, _OWN_SCOPES):
        return []
    return None


def _each_node_once(function: cst.FunctionDef) -> bool:
    seen: set[int] = set()
    for node in walk(function):
        if id(node) in seen:
            return False
        seen.add(id(node))
    return True


def _unread_locals(function: cst.FunctionDef, copy: cst.FunctionDef, scope: FunctionScope) -> set[str]:
    """Names of the function's own scope that nothing reads (libcst's scope analysis: a read in a nested function,
    a comprehension or a `global` counts), each assigned only by plain `name = value` lines of values with no
    effect. `copy` is the function as the analysis of `scope` holds it."""
    pure_targets = {id(target) for a in nodes_of_type(copy.body, cst.Assign) for target, value in _pairs(a)
                    if _pure(value)}
    plain = {}  # name -> whether every binding of it pairs it with a value that has no effect, and none is read
    for assignment in scope.assignments:
        node = assignment.node
        ok = isinstance(node, cst.Name) and id(node) in pure_targets
        plain[assignment.name] = plain.get(assignment.name, True) and ok and not assignment.references
    params = {p.name.value for p in nodes_of_type(function.params, cst.Param)}
    return {name for name, unread in plain.items() if unread} - params


def _unread_lists(copy: cst.FunctionDef, scope: FunctionScope, wrapper: MetadataWrapper) -> set[str]:
    """Lists the function builds and never reads: `name = []`, then only `name.append(value)` lines (values with no
    effect), as a collection of results the rewrite no longer returns."""
    empty_lists = {id(target) for a in nodes_of_type(copy.body, cst.Assign) for target, value in _pairs(a)
                   if isinstance(value, cst.List) and not value.elements}
    if not empty_lists:
        return set()
    parents = wrapper.resolve(ParentNodeProvider)
    found: dict[str, bool] = {}
    for assignment in scope.assignments:
        ok = id(assignment.node) in empty_lists and all(
            _only_appended(access.node, parents) for access in assignment.references)
        found[assignment.name] = found.get(assignment.name, True) and ok
    return {name for name, unread in found.items() if unread}


def _only_appended(node: cst.CSTNode, parents) -> bool:
    """Whether `node` is `name` in a statement `name.append(value)` whose value has no effect."""
    attribute = parents.get(node)
    call = parents.get(attribute)
    expr = parents.get(call)
    return (isinstance(attribute, cst.Attribute) and attribute.attr.value == "append" and isinstance(call, cst.Call)
            and call.func is attribute and isinstance(expr, cst.Expr) and len(call.args) == 1
            and _pure(call.args[0].value))


class _DropAppends(Transformer):
    """Removes the `name.append(value)` lines of the lists given."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        kept = [s for s in updated_node.body if not self._append(s)]
        return updated_node.with_changes(body=kept) if kept else updated_node

    def _append(self, stmt: cst.BaseStatement) -> bool:
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Expr)):
            return False
        call = stmt.body[0].value
        return (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "append"
                and isinstance(call.func.value, cst.Name) and call.func.value.value in self.names)


def _pairs(assign: cst.Assign) -> list[tuple[cst.Name, cst.BaseExpression]]:
    """(name, value) for each name an assignment gives a value of its own: `name = value`, or the names of
    `a, b = x, y`; [] for anything else. Unpacking one value (`bsz, seqlen = x.shape`) stays whole: it also checks a
    shape, and a person writes it to name the sizes (linters leave it too)."""
    if len(assign.targets) != 1:
        return []
    target, value = assign.targets[0].target, assign.value
    if isinstance(target, cst.Name):
        return [(target, value)]
    if (isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple)
            and len(target.elements) == len(value.elements)
            and all(isinstance(e, cst.Element) for e in (*target.elements, *value.elements))
            and all(isinstance(e.value, cst.Name) for e in target.elements)):
        return [(t.value, v.value) for t, v in zip(target.elements, value.elements)]
    return []


def _pure(node: cst.BaseExpression) -> bool:
    """Whether evaluating `node` changes nothing: names, attributes, subscripts, literals, arithmetic and a few
    calls that only describe their arguments."""
    if isinstance(node, (cst.Name, cst.Integer, cst.Float, cst.SimpleString, cst.Ellipsis)):
        return True
    if isinstance(node, cst.Attribute):
        return _pure(node.value)
    if isinstance(node, cst.Subscript):
        return _pure(node.value) and all(_pure_slice(e.slice) for e in node.slice)
    if isinstance(node, cst.BinaryOperation):
        return _pure(node.left) and _pure(node.right)
    if isinstance(node, cst.UnaryOperation):
        return _pure(node.expression)
    if isinstance(node, cst.IfExp):
        return _pure(node.test) and _pure(node.body) and _pure(node.orelse)
    if isinstance(node, cst.Comparison):
        return _pure(node.left) and all(_pure(c.comparator) for c in node.comparisons)
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(isinstance(e, cst.Element) and _pure(e.value) for e in node.elements)
    if isinstance(node, cst.Call):
        func = node.func
        known = (isinstance(func, cst.Attribute) and func.attr.value in _PURE_METHODS and _pure(func.value)) or (
            isinstance(func, cst.Name) and func.value in _PURE_FUNCTIONS)
        return known and all(a.star == "" and _pure(a.value) for a in node.args)
    return False


def _pure_slice(part: cst.BaseSlice) -> bool:
    if isinstance(part, cst.Index):
        return _pure(part.value)
    return all(bound is None or _pure(bound) for bound in (part.lower, part.upper, part.step))


class _DropAssignments(Transformer):
    """Takes the names given out of the assignments that give them values (the whole line when nothing is left, with
    the comments above it: they describe that line); a block that would be left empty keeps its lines."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.BaseStatement | cst.RemovalSentinel:
        # `if test:` around nothing but dead lines, with no else and a test that changes nothing, goes with them.
        if (updated_node.orelse is None and _pure(updated_node.test)
                and isinstance(updated_node.body, cst.IndentedBlock)
                and all(self._left(s) is None for s in updated_node.body.body)):
            return cst.RemovalSentinel.REMOVE
        return updated_node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        left = [self._left(s) for s in updated_node.body]
        kept = [s for s in left if s is not None]
        if not kept:
            return updated_node
        return updated_node.with_changes(body=kept)

    def _left(self, stmt: cst.BaseStatement) -> cst.BaseStatement | None:
        """What is left of `stmt` once the dead names are taken out of it (None: nothing)."""
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return stmt
        assign = stmt.body[0]
        pairs = _pairs(assign) if isinstance(assign, cst.Assign) else []
        live = [(t, v) for t, v in pairs if t.value not in self.names or not _pure(v)]
        if not pairs or len(live) == len(pairs):
            return stmt
        if not live:
            return None
        if len(live) == 1:
            (target, value), = live
            return stmt.with_changes(body=[assign.with_changes(targets=[cst.AssignTarget(target)], value=value)])
        return stmt.with_changes(body=[assign.with_changes(
            targets=[cst.AssignTarget(cst.Tuple([cst.Element(t) for t, _ in live], lpar=[], rpar=[]))],
            value=cst.Tuple([cst.Element(v) for _, v in live], lpar=[], rpar=[]))])


def without_identical_branches(statements: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The statements with every `if test: A else: A` (a test that changes nothing) made `A`."""
    block = cst.IndentedBlock(body=statements).visit(_MergeIdenticalBranches())
    return list(block.body)


class _MergeIdenticalBranches(Transformer):
    """`if test: A else: A` with a test that changes nothing becomes `A`: a rewrite made both arms the same."""

    def __init__(self) -> None:
        super().__init__()
        self._elifs: set[int] = set()  # an `elif` is its parent's else: it cannot become several statements
        self.merged = False

    def visit_If(self, node: cst.If) -> None:
        if isinstance(node.orelse, cst.If):
            self._elifs.add(id(node.orelse))

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.BaseStatement | cst.FlattenSentinel:
        orelse = updated_node.orelse
        if id(original_node) in self._elifs or not isinstance(orelse, cst.Else) or not _pure(updated_node.test):
            return updated_node
        if not (isinstance(updated_node.body, cst.IndentedBlock) and isinstance(orelse.body, cst.IndentedBlock)):
            return updated_node
        if not updated_node.body.deep_equals(orelse.body):
            return updated_node
        body = list(updated_node.body.body)
        body[0] = body[0].with_changes(leading_lines=[*updated_node.leading_lines, *body[0].leading_lines])
        self.merged = True
        return cst.FlattenSentinel(body)


