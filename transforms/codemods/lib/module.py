"""Module-level insertions shared by the codemods that create static buffers."""
from __future__ import annotations

import libcst as cst

from graphmode.transforms.codemods.base import GraphCodemod
from graphmode.transforms.cstutil import code_of, find_method, is_docstring, self_attribute_name, walk
from graphmode.transforms.dispatch import Transformer
from graphmode.transforms.parsed import ParsedSource


def _is_import(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
    )


def defined_at_top(module: cst.Module, name: str) -> bool:
    for stmt in module.body:
        if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)) and stmt.name.value == name:
            return True
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign) and any(
                    isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets
                ):
                    return True
    return False


def insert_after_imports(module: cst.Module, statements: list[cst.BaseStatement]) -> cst.Module:
    """Places statements after the leading docstring and import block, separated by blank lines."""
    body = list(module.body)
    index = 0
    while index < len(body) and (
        _is_import(body[index]) or (index == 0 and is_docstring(body[index]))
    ):
        index += 1
    first = statements[0]
    # PEP 8: two blank lines before a top-level definition, one before anything else.
    # Two nodes, not one twice: the chain hands the tree on to the next codemod, whose tables are keyed by node.
    gap = [cst.EmptyLine() for _ in range(2 if isinstance(first, (cst.ClassDef, cst.FunctionDef)) else 1)]
    statements = [first.with_changes(leading_lines=[*gap, *first.leading_lines]), *statements[1:]]
    return module.with_changes(body=[*body[:index], *statements, *body[index:]])


def append_to_init(cls: cst.ClassDef, statements: list[cst.BaseStatement], comment: str) -> cst.ClassDef:
    """Appends statements to the end of `__init__`, the first one preceded by a comment."""
    init = find_method(cls, "__init__")
    assert init is not None, "callers check for __init__ first"
    first = statements[0].with_changes(
        leading_lines=[cst.EmptyLine(indent=True, comment=cst.Comment(f"# graphmode: {comment}"))]
    )
    body = init.body.with_changes(body=[*init.body.body, first, *statements[1:]])
    return replace_method(cls, "__init__", init.with_changes(body=body))


def replace_method(cls: cst.ClassDef, name: str, new: cst.FunctionDef) -> cst.ClassDef:
    body = [new if isinstance(s, cst.FunctionDef) and s.name.value == name else s for s in cls.body.body]
    return cls.with_changes(body=cls.body.with_changes(body=body))


def self_attributes(cls: cst.ClassDef) -> set[str]:
    """Names assigned as `self.X = ...` or registered as buffers anywhere in the class."""
    found: set[str] = set()
    # A walk, not a CSTVisitor's visit: the same attributes and calls, without a look-up of handlers at every node.
    for node in walk(cls):
        kind = type(node)
        if kind is cst.Attribute:
            if isinstance(node.value, cst.Name) and node.value.value == "self":
                found.add(node.attr.value)
        elif kind is cst.Call:
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "register_buffer" and node.args:
                arg = node.args[0].value
                if isinstance(arg, cst.SimpleString):
                    found.add(arg.evaluated_value)
    return found


class BufferCodemod(GraphCodemod):
    """A codemod that rewrites methods one at a time and adds static buffers, which `setup_caches` sizes."""

    def __init__(self, context, options) -> None:
        super().__init__(context, options)
        self._changed = False

    def passes_over(self, qualname: str) -> bool:
        # The rewrites start at leave_ClassDef and read the methods from there; a function's body holds nothing
        # for them unless a class is defined inside it.
        return not self.source.classes_in_functions

    def rewrite_method(self, cls: cst.ClassDef, updated: cst.ClassDef, method: cst.FunctionDef,
                       body: list[cst.BaseStatement]) -> cst.ClassDef | None:
        """The class with this method rewritten, or None when the idiom is not there."""
        raise NotImplementedError

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        for method in original_node.body.body:
            if isinstance(method, cst.FunctionDef) and isinstance(method.body, cst.IndentedBlock):
                rewritten = self.rewrite_method(original_node, updated_node, method, list(method.body.body))
                if rewritten is not None:
                    updated_node, self._changed = rewritten, True
        return updated_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return self.finish_module(updated_node) if self._changed else updated_node

    def finish_module(self, module: cst.Module) -> cst.Module:
        """The module once a method was rewritten: where a codemod inserts the helpers its rewrite calls."""
        return module


def moves_to_device(stmt: cst.BaseStatement, attribute: str) -> bool:
    """`self.A = self.A.to(...)` on a line of its own: a no-op once `A` is a buffer that follows the model."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return False
    assign = stmt.body[0]
    value = assign.value
    return (len(assign.targets) == 1 and self_attribute_name(assign.targets[0].target) == attribute
            and isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "to" and self_attribute_name(value.func.value) == attribute)


class ReplaceNodes(Transformer):
    """Replaces chosen nodes and removes chosen statements, both named by identity in the tree visited."""

    def __init__(self, replace: dict[cst.CSTNode, cst.CSTNode], drop: set[cst.CSTNode]) -> None:
        self.replace, self.drop = replace, drop

    def on_leave(self, original_node, updated_node):
        if original_node in self.drop:
            return cst.RemoveFromParent()
        return self.replace.get(original_node, updated_node)


def remove_imports_if_unused(module: cst.Module, names: set[str], source: ParsedSource | None = None) -> cst.Module:
    """The module without its top-level `from X import name` of these names where nothing else in it reads them any
    more (the helpers a rewrite replaced); an import left with no names goes. With the source the module was
    rewritten from, a statement or a method kept from it whose text holds none of the names is not walked."""
    if not names:
        return module

    def holds_none(text: str | None) -> bool:
        return text is not None and not any(name in text for name in names)

    def skip(node: cst.CSTNode) -> list[cst.CSTNode] | None:
        if isinstance(node, cst.ImportFrom):
            return []  # the imported names themselves are not reads
        if source is not None and type(node) is cst.FunctionDef and holds_none(source.method_text(node)):
            return []  # a method of a class the rewrite changed elsewhere
        return None

    used: set[str] = set()
    for statement in module.body:
        if source is not None and holds_none(source.statement_text(statement)):
            continue
        used |= {n.value for n in walk(statement, skip) if isinstance(n, cst.Name)}
    unused = names - used
    if not unused:
        return module
    body = []
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 \
                and isinstance(stmt.body[0], cst.ImportFrom) and not isinstance(stmt.body[0].names, cst.ImportStar):
            imported = stmt.body[0]
            kept = [a for a in imported.names if a.asname is not None or code_of(a.name) not in unused]
            if not kept:
                continue
            if len(kept) != len(imported.names):
                kept[-1] = kept[-1].with_changes(comma=imported.names[-1].comma)
                stmt = stmt.with_changes(body=[imported.with_changes(names=kept)])
        body.append(stmt)
    return module.with_changes(body=body)


def transform_statements(module: cst.Module, transformer: cst.CSTTransformer,
                         statements: set[cst.CSTNode]) -> cst.Module:
    """`module.visit(transformer)` for a transformer that changes nothing outside these top-level statements: the
    others are neither walked nor rebuilt. The transformer sees no `Module` node."""
    body: list[cst.BaseStatement] = []
    for statement in module.body:
        if statement not in statements:
            body.append(statement)
            continue
        result = statement.visit(transformer)
        if isinstance(result, cst.FlattenSentinel):
            body.extend(result.nodes)
        elif not isinstance(result, cst.RemovalSentinel):
            body.append(result)
    return module.with_changes(body=body)
