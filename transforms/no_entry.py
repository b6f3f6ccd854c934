"""graphmode's comments and docstrings worded for a file the chain gave no entry class.

The codemods and the helper code say where the static buffers are sized: by `setup_caches`, which split_decode
writes on the entry class beside `prefill` and `decode`. Without an entry class (`graphmode fix` on a file with no
`*ForCausalLM` / `*LMHeadModel` class and no `--entry-class`) there is no `setup_caches`, so those words would
promise a method the file lacks. Here they name what does exist: each buffer module's `graphmode_resize`. Only text
graphmode wrote changes: docstrings that carry its marker, and comments the original does not have.
"""
from __future__ import annotations

import libcst as cst

from graphmode.transforms.codemods.split_decode import SETUP
from graphmode.transforms.cstutil import is_docstring
from graphmode.transforms.dispatch import Transformer
from graphmode.transforms.tidy import MARKER

RESIZE = "graphmode_resize"
# The helper code's account of who calls graphmode_resize; any other mention names graphmode_resize itself.
_CALLER = (f"(the model's `{SETUP}` calls it)", f"(called by the model's `{SETUP}`)")
_NO_CALLER = f"(an entry class's `{SETUP}` would call it; this file has none)"


def without_entry_promises(module: cst.Module, original: str) -> cst.Module:
    """`module` with graphmode's mentions of `setup_caches` reworded, when the module defines none."""
    if any(isinstance(node, cst.FunctionDef) and node.name.value == SETUP for node in _definitions(module)):
        return module
    return module.visit(_Reword(original))


def _definitions(module: cst.Module) -> list[cst.CSTNode]:
    """Top-level functions and the methods of top-level classes: where split_decode writes `setup_caches`."""
    found: list[cst.CSTNode] = []
    for stmt in module.body:
        found.append(stmt)
        if isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
            found += stmt.body.body
    return found


def _reworded(text: str) -> str:
    parts = [text]
    for caller in _CALLER:
        parts = [piece for part in parts for piece in ([None] if part is None else _between(part.split(caller)))]
    return "".join(_NO_CALLER if part is None else part.replace(f"`{SETUP}`", f"`{RESIZE}`").replace(
        SETUP, f"`{RESIZE}`") for part in parts)


def _between(pieces: list[str]) -> list[str | None]:
    """The pieces with None between each two: where the phrase they were split at stood."""
    return [item for index, piece in enumerate(pieces) for item in ([None, piece] if index else [piece])]


class _Reword(Transformer):
    def __init__(self, original: str) -> None:
        super().__init__()
        self.original = original

    def leave_Comment(self, original_node: cst.Comment, updated_node: cst.Comment) -> cst.Comment:
        if SETUP not in updated_node.value or updated_node.value in self.original:
            return updated_node  # none to reword, or the model's own comment
        return updated_node.with_changes(value=_reworded(updated_node.value))

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        if not is_docstring(updated_node):
            return updated_node
        docstring = updated_node.body[0].value
        if not (isinstance(docstring, cst.SimpleString) and MARKER in docstring.value and SETUP in docstring.value):
            return updated_node
        expr = updated_node.body[0]
        return updated_node.with_changes(body=[expr.with_changes(value=docstring.with_changes(
            value=_reworded(docstring.value)))])
