"""graphmode's comments and docstrings worded for a file the chain gave no entry class.

The codemods and the helper code say where the static buffers are sized: by `setup_caches`, which split_decode
writes on the entry class beside `prefill` and `decode`. Without an entry class (`graphmode fix` on a file with no
`*ForCausalLM` / `*LMHeadModel` class and no `--entry-class`) there is no `setup_caches`, so those words would
promise a method the file lacks. Here they name what does exist: each buffer module's `graphmode_resize`. Only text
graphmode wrote changes: docstrings that carry its marker, and comments the original does not have.
"""
from __future__ import annotations

import re

import libcst as cst

from graphmode.transforms.codemods.lib.helper_names import SETUP
from graphmode.transforms.cstutil import is_docstring
from graphmode.transforms.dispatch import Transformer
from graphmode.transforms.output.tidy import MARKER

RESIZE = "graphmode_resize"
_NONE = "this file has none"
# The helper code's account of what `setup_caches` does for graphmode_resize, said as what it would do; any other
# mention names graphmode_resize itself (what sizes, allocates or builds the buffers).
_PHRASES = {
    f"(the model's `{SETUP}` calls it)": f"(an entry class's `{SETUP}` would call it; {_NONE})",
    f"(called by the model's `{SETUP}`)": f"(an entry class's `{SETUP}` would call it; {_NONE})",
    f"(`{SETUP}` passes one of the model's parameters)":
        f"(an entry class's `{SETUP}` would pass one of the model's parameters; {_NONE})",
}


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
    """The text with each phrase of `_PHRASES` replaced (a docstring may break a line inside one), and every other
    mention of `setup_caches` made one of graphmode_resize."""
    parts: list[str] = [text]  # the text split at the phrases; a phrase's place holds its replacement, marked
    for phrase, replacement in _PHRASES.items():
        spread = re.compile(r"\s+".join(map(re.escape, phrase.split())))
        parts = [piece for part in parts for piece in (
            [part] if isinstance(part, _Said) else _between(spread.split(part), _Said(replacement)))]
    return "".join(part if isinstance(part, _Said) else part.replace(f"`{SETUP}`", f"`{RESIZE}`").replace(
        SETUP, f"`{RESIZE}`") for part in parts)


class _Said(str):
    """A replacement already made: not reworded again."""


def _between(pieces: list[str], said: _Said) -> list[str]:
    """The pieces with `said` between each two: where the phrase they were split at stood."""
    return [item for index, piece in enumerate(pieces) for item in ([said, piece] if index else [piece])]


class _Reword(Transformer):
    def __init__(self, original: str) -> None:
        super().__init__()
        self.original = original
        self.graphmodes: list[bool] = [False]  # per enclosing class or function: graphmode wrote it

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.graphmodes.append(self.graphmodes[-1] or _marked(node))

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.graphmodes.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.graphmodes.append(self.graphmodes[-1] or _marked(node))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.graphmodes.pop()
        return updated_node

    def leave_Comment(self, original_node: cst.Comment, updated_node: cst.Comment) -> cst.Comment:
        if SETUP not in updated_node.value or updated_node.value in self.original:
            return updated_node  # none to reword, or the model's own comment
        return updated_node.with_changes(value=_reworded(updated_node.value))

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        """The docstrings of what graphmode wrote: a class or function whose docstring carries its marker, and the
        methods of such a class (the helper code's)."""
        if not (self.graphmodes[-1] and is_docstring(updated_node)):
            return updated_node
        docstring = updated_node.body[0].value
        if not (isinstance(docstring, cst.SimpleString) and SETUP in docstring.value):
            return updated_node
        expr = updated_node.body[0]
        return updated_node.with_changes(body=[expr.with_changes(value=docstring.with_changes(
            value=_reworded(docstring.value)))])


def _marked(owner: cst.ClassDef | cst.FunctionDef) -> bool:
    """The docstring carries graphmode's marker (before line-wrap, a line may break inside it)."""
    body = owner.body.body if isinstance(owner.body, cst.IndentedBlock) else []
    if not body or not is_docstring(body[0]) or not isinstance(body[0].body[0].value, cst.SimpleString):
        return False
    return MARKER in " ".join(body[0].body[0].value.value.split())
