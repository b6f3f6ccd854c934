"""`import X` added where libcst's AddImportsVisitor adds it, without its cost.

The visitor deep-copies the tree to resolve metadata and walks all of it with matchers before it looks at the top
of the module: on a 1,000-line file, more than every codemod of the chain together. For the one kind of import
the codemods ask for, a plain `import X`, this does the same at the top alone: it is left out when the import
block at the top of the module (after a docstring or a `__strict__` flag) already imports X; else it goes at the
end of that block, and the first statement after it is given a blank line before it when it has none.
tests/test_pipeline_shortcuts.py holds the two to the same text.
"""
from __future__ import annotations

import libcst as cst
from libcst.codemod.visitors import ImportItem


def is_plain(item: ImportItem) -> bool:
    return item.obj_name is None and item.alias is None and item.relative == 0


def with_plain_imports(module: cst.Module, modules: list[str]) -> cst.Module:
    body = list(module.body)
    start = 1 if body and _is_docstring_or_strict_flag(body[0]) else 0
    end = start
    while end < len(body) and _is_import_line(body[end]):
        end += 1
    present = {name.evaluated_name for stmt in body[start:end] if isinstance(stmt.body[0], cst.Import)
               for name in stmt.body[0].names if name.asname is None}
    missing = sorted(set(modules) - present)
    if not missing:
        return module
    after = body[end:]
    if after:
        first = after[0]
        if not first.leading_lines:
            after[0] = first.with_changes(leading_lines=(cst.EmptyLine(),))
        elif first.leading_lines[0].comment is not None:
            after[0] = first.with_changes(leading_lines=(cst.EmptyLine(), *first.leading_lines))
    added = [cst.parse_statement(f"import {name}", config=module.config_for_parsing) for name in missing]
    return module.with_changes(body=(*body[:end], *added, *after))


def _is_import_line(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 \
        and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom))


def _is_docstring_or_strict_flag(stmt: cst.BaseStatement) -> bool:
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return False
    small = stmt.body[0]
    if isinstance(small, cst.Expr):
        return isinstance(small.value, cst.SimpleString)
    return isinstance(small, cst.Assign) and len(small.targets) == 1 \
        and isinstance(small.targets[0].target, cst.Name) and small.targets[0].target.value == "__strict__"
