"""The parameters a planned change is built with: shown at confirmation, revised there without free text.

A person revises one at the prompt (`e C4 max_seq_len=4096`) or with `graphmode resume ID --revise
C4.max_seq_len=4096`, and design runs again with the new value. A parameter is the session's, not one change's: one
static length sizes every buffer, so a revision made on C4 holds for every change that shows that parameter.

What a change shows is what its codemod is built with: one whose buffers `setup_caches` sizes by the static length
and batch (`SIZES_BUFFERS`; verification sets the static path up at that length), a fusion the backend's fused
operators, the ones that look the model class up that class. The dims the traced run saw a cache grow along are
shown beside them, as evidence (a trace is revised by running it again, not by typing).
"""
from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphmode.agent.errors import UserError
from graphmode.agent.targets.sources import read_source
from graphmode.agent.workflow.state import Change, RunState
from graphmode.transforms.codemods import CODEMODS


def _positive_int(text: str) -> int:
    if not (text.isascii() and text.isdecimal()) or int(text) < 1:
        raise ValueError(f"{text!r} is not a positive whole number")
    return int(text)


def _class_name(text: str) -> str:
    if not text.isidentifier():
        raise ValueError(f"{text!r} is not a class name")
    return text


def _fused_ops(text: str) -> str:
    if text not in ("cpu", "cuda", "npu"):
        raise ValueError(f"{text!r}: one of cpu, cuda, npu")
    return text


@dataclass(frozen=True)
class Parameter:
    name: str
    meaning: str  # what the value decides, for the design and the prompt
    parse: Callable[[str], Any]  # the typed value, or ValueError saying why not


PARAMETERS: dict[str, Parameter] = {p.name: p for p in (
    Parameter("max_seq_len", "the positions (prompt and generated) every static buffer holds", _positive_int),
    Parameter("max_batch_size", "the batch every static buffer holds", _positive_int),
    Parameter("entry_class", "the model class that gets the prefill/decode entry points", _class_name),
    Parameter("fused_ops", "whose fused operators the fusions write: cpu, cuda or npu (the backend's choice)",
              _fused_ops),
)}

# The codemods that look the model class up: the entries go onto it, and the caches it carries are found from it.
_ENTRY_READERS = frozenset({"split_decode", "added_cache", "carried_cache", "static_positions"})


def parameters_of(change: Change) -> list[str]:
    """The revisable parameters `change` is built with, in PARAMETERS' order."""
    codemod = CODEMODS.get(change.codemod)
    shown = []
    if codemod is not None and codemod.SIZES_BUFFERS:
        shown += ["max_seq_len", "max_batch_size"]
    if change.codemod in _ENTRY_READERS:
        shown.append("entry_class")
    if codemod is not None and codemod.FUSION:
        shown.append("fused_ops")
    return shown


def traced_dims(change: Change, evidence_caches: list, evidence_cache_writes: list) -> list[str]:
    """"model.py:40: dim 2" for each cache write the traced run saw grow on a line this change edits."""
    grown = [(file, line, str(dim)) for file, line, dim in evidence_caches]
    grown += [(file, line, ", ".join(map(str, dims))) for file, line, dims, _ in evidence_cache_writes]
    return [f"{file}:{line}: dim {dims}" for file, line, dims in grown
            if any(e["path"] == file and e["start_line"] <= line <= e["end_line"] for e in change.edits)]


def parse_revision(plan: list[Change], text: str, classes: set[str] | None = None,
                   backend_ops: str | None = None) -> tuple[str, Any]:
    """`C4.max_seq_len=4096` or `C4 max_seq_len=4096` -> ("max_seq_len", 4096); ValueError with what is wrong
    and what would be right. `classes`: the classes the sources define (an entry class must be one of them);
    `backend_ops`: the fused operators the session's backend runs (torch_npu's only under an NPU backend)."""
    head, sep, value = text.strip().partition("=")
    change_id, _, name = head.strip().replace(" ", ".", 1).partition(".")
    change_id, name, value = change_id.strip().upper(), name.strip(), value.strip()
    if not sep or not name or not value:
        raise ValueError(f"{text!r}: write CHANGE.PARAMETER=VALUE, e.g. C1.max_seq_len=4096")
    change = next((c for c in plan if c.id == change_id), None)
    if change is None:
        raise ValueError(f"{text!r}: no change {change_id} in this design (it has "
                         f"{', '.join(c.id for c in plan) or 'none'})")
    own = parameters_of(change)
    if name not in own:
        has = f"its parameters: {', '.join(own)}" if own else "it has no parameter to revise"
        raise ValueError(f"{text!r}: {change_id} (`{change.codemod}`) is not built with {name}; {has}")
    try:
        parsed = PARAMETERS[name].parse(value)
    except ValueError as error:
        raise ValueError(f"{text!r}: {name} {error}") from None
    if name == "entry_class" and classes is not None and parsed not in classes:
        raise ValueError(f"{text!r}: no class {parsed} in the sources (they define "
                         f"{', '.join(sorted(classes)) or 'none'})")
    if name == "fused_ops" and parsed == "npu" and backend_ops not in (None, "npu"):
        raise ValueError(f"{text!r}: torch_npu's operators run only under an NPU backend (npugraph_ex, ge); this "
                         f"session's backend runs {backend_ops}'s")
    return name, parsed


def source_classes(state: RunState) -> set[str]:
    """The classes the target's sources define (any depth), read without running anything; files that cannot be
    read or parsed add none."""
    found: set[str] = set()
    for relative in state.sources:
        try:
            tree = ast.parse(read_source(Path(state.options.target), relative))
        except (UserError, SyntaxError, ValueError):
            continue
        found |= {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    return found
