"""graphmode's helper code in a module of its own beside the adapted file, `graphmode_static.py`, imported from there.

The codemods insert the helpers they need into the file they rewrite (`helper_statements`), where the next codemod
of the chain finds them (`defined_at_top`). Pasted there, they would be most of the file: 292 of 601 lines of
examples/legacy_llm's, above the model's own code. So at the end of the chain `move_helpers_out` takes every
inserted definition out of the file again and adds one import of the names the file uses, with its other imports,
the way the model imports its own siblings: relative (`from .graphmode_static import ...`) where the file imports
relatively (a Hub remote-code folder, whose loader copies relatively imported files along; a model package of
transformers), plain otherwise (a folder whose harness puts it on sys.path). Every writer of adapted files writes
the module beside them (`helper_modules`): the same text for every file (`helper_module_text`), so the adapted
files of one folder share one copy, and it imports only torch.
"""
from __future__ import annotations

import ast
import difflib
from pathlib import PurePosixPath

import libcst as cst

from graphmode.transforms.codemods.lib.helper_code import helper_module_text, helper_names
from graphmode.transforms.cstutil import is_docstring, walk
from graphmode.transforms.output.helper_module_name import FILE_NAME, MODULE_NAME
from graphmode.transforms.output.line_wrap import MIN_LIMIT



def move_helpers_out(module: cst.Module, original: cst.Module, original_text: str) -> cst.Module:
    """`module` without the helper definitions the chain inserted (those `original` does not define itself), and
    with one import of the ones it uses after its leading imports, wrapped to the original's longest line."""
    own = {s.name.value for s in original.body if isinstance(s, (cst.ClassDef, cst.FunctionDef))}
    helpers = helper_names() - own
    body = [s for s in module.body
            if not (isinstance(s, (cst.ClassDef, cst.FunctionDef)) and s.name.value in helpers)]
    if len(body) == len(module.body):
        return module
    module = module.with_changes(body=body)
    used = sorted(helpers & _names(module, _as_written(original, original_text, helpers)))
    if not used:
        return module
    limit = max([MIN_LIMIT, *(len(line) for line in original_text.splitlines())])
    relative = _imports_relatively(original)
    statement = cst.parse_statement(_import_line(used, "." if relative else "", limit))
    index = _after_imports(body)
    if index and not (relative and _relative_import(body[index - 1])):
        statement = statement.with_changes(leading_lines=[cst.EmptyLine()])  # a group of its own, as isort has it
    return module.with_changes(body=[*body[:index], statement, *body[index:]])


def imports_helper_module(source: str) -> bool:
    """The text imports graphmode's helper module at its top level: it is graphmode's output."""
    return MODULE_NAME in source and any(
        isinstance(s, ast.ImportFrom) and s.module == MODULE_NAME for s in ast.parse(source).body)


def helper_modules(adapted: dict[str, str]) -> dict[str, str]:
    """The helper module to write beside the adapted files (path relative to the output folder -> text): one in
    each folder that holds a file importing it."""
    return {(PurePosixPath(path).parent / FILE_NAME).as_posix(): helper_module_text()
            for path, text in adapted.items() if imports_helper_module(text)}


def helper_module_diffs(adapted: dict[str, str]) -> str:
    """The helper modules `helper_modules` writes, as new files in a unified diff (after the files' own diffs)."""
    return "".join(
        "".join(difflib.unified_diff([], text.splitlines(keepends=True), fromfile="/dev/null", tofile=f"b/{path}"))
        for path, text in sorted(helper_modules(adapted).items()))


def _names(module: cst.Module, passed_over: set[int] = frozenset()) -> set[str]:
    """Every name the module reads or defines; an attribute's name (`self.x`) is not one. The nodes whose ids are
    `passed_over` are not walked (`_as_written`)."""
    def skip(node: cst.CSTNode) -> list[cst.CSTNode] | None:
        if id(node) in passed_over:
            return []
        return _attribute_values(node)

    return {node.value for node in walk(module, skip) if isinstance(node, cst.Name)}


def _attribute_values(node: cst.CSTNode) -> list[cst.CSTNode] | None:
    return [node.value] if isinstance(node, cst.Attribute) else None


def _as_written(original: cst.Module, original_text: str, helpers: frozenset[str]) -> set[int]:
    """The ids of the original's statements and of the methods of its classes, whose names `_names` need not read
    where the original's text holds none of the helpers' names (a name of its code is a word of its text): the
    adapted module holds most of them as the same nodes, and a walk of the whole module was most of this pass."""
    if any(name in original_text for name in helpers):
        return set()
    held = {id(statement) for statement in original.body}
    for statement in original.body:
        if isinstance(statement, cst.ClassDef) and isinstance(statement.body, cst.IndentedBlock):
            held.update(id(method) for method in statement.body.body if isinstance(method, cst.FunctionDef))
    return held


def _imports_relatively(module: cst.Module) -> bool:
    # An import inside a function says nothing of how the file is loaded.
    return any(isinstance(node, cst.ImportFrom) and node.relative
               for node in walk(module, lambda node: [] if isinstance(node, cst.FunctionDef) else None))


def _relative_import(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.ImportFrom) \
        and bool(statement.body[0].relative)


def _import_line(names: list[str], dots: str, limit: int) -> str:
    """One `from graphmode_static import ...` statement: one line where it fits, else the names packed into lines
    inside brackets, hanging (a line of its own for each bracket) or aligned after the opening bracket, whichever
    takes fewer lines (hanging where they tie)."""
    head = f"from {dots}{MODULE_NAME} import "
    if len(head) + len(", ".join(names)) <= limit:
        return head + ", ".join(names) + "\n"
    hanging = ["(", *_packed(names, "    ", limit), ")"]
    aligned = _packed(names, " " * (len(head) + 1), limit, closing=")")
    if len(aligned) < len(hanging) and len(head) + 1 + len(aligned[0].lstrip()) <= limit:
        return head + "(" + "\n".join(aligned)[len(head) + 1:] + "\n"
    return head + "\n".join(hanging) + "\n"


def _packed(names: list[str], indent: str, limit: int, closing: str = "") -> list[str]:
    """The names, comma-separated, in as few lines of at most `limit` characters at `indent` as they fit; the last
    ends in `closing` (else in a comma)."""
    lines, line = [], ""
    for index, name in enumerate(names):
        item = name + (closing if index == len(names) - 1 else ",")
        if line and len(indent) + len(line) + 1 + len(item) > limit:
            lines.append(indent + line)
            line = ""
        line = f"{line} {item}" if line else item
    return [*lines, indent + line]


def _after_imports(body: list[cst.BaseStatement]) -> int:
    """Where the import goes: after the file's leading imports (and blocks of imports alone, such as an `if` of
    optional ones), before its first other statement, so that no import comes after code (E402)."""
    index = 1 if body and is_docstring(body[0]) else 0
    while index < len(body) and _imports_only(body[index]):
        index += 1
    return index


def _imports_only(statement: cst.CSTNode) -> bool:
    """An import statement, or an `if`/`try` block whose statements are imports (or `pass`) alone."""
    if not isinstance(statement, (cst.SimpleStatementLine, cst.If, cst.Try)):
        return False
    for node in walk(statement, lambda n: [] if isinstance(n, cst.BaseSmallStatement) else None):
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)) or (
                isinstance(node, cst.BaseSmallStatement) and not isinstance(node, (cst.Import, cst.ImportFrom,
                                                                                    cst.Pass))):
            return False
    return True
