"""The target's sources as graphmode reads them: which files (the harness's SOURCES), and their text, checked."""
from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst

from graphmode.agent.errors import UserError


def declared_sources(target: Path) -> list[str]:
    """The harness's SOURCES, read without running it; every .py but the harness when absent."""
    harness = target / "harness.py"
    module = cst.parse_module(read_source(target, "harness.py"))
    for stmt in module.body:
        names = _sources_assigned(stmt)
        if names is None:
            continue
        missing = [n for n in names if not (target / n).is_file()]
        if missing:
            raise UserError(f"{harness}: SOURCES names {', '.join(missing)}, which does not exist")
        return names
    return sorted(p.name for p in target.glob("*.py") if p.name != "harness.py")


def _sources_assigned(stmt: cst.CSTNode) -> list[str] | None:
    """The file names a `SOURCES = [...]` statement lists (its string literals); None for any other statement."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)):
        return None
    assign = stmt.body[0]
    if getattr(assign.targets[0].target, "value", None) != "SOURCES" or not isinstance(assign.value, cst.List):
        return None
    return [e.value.evaluated_value for e in assign.value.elements if isinstance(e.value, cst.SimpleString)]


def read_source(target: Path, relative: str) -> str:
    """A source's text; a file that is not UTF-8 or does not parse is bad input, said with its position."""
    path = target / relative
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    try:
        ast.parse(text, filename=str(path))  # Python's own message and position, as the user knows them
    except SyntaxError as error:
        raise UserError(f"{path}:{error.lineno}:{error.offset or 1}: syntax error: {error.msg}") from None
    return text
