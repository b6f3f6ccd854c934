"""Harnesses graphmode writes from a model's calling convention: for `graphmode init` (into the user's folder, on
request) and for a graphmode.toml that names a convention (into the run folder, never the user's)."""
from __future__ import annotations

import shutil
from pathlib import Path

from graphmode.agent.errors import UserError
from graphmode.agent.output import render, swapped_in, write_atomic
from graphmode.transforms.conventions import CONVENTIONS, TODO, UNKNOWN, Detection, detect, harness_context


def render_harness(folder: Path, convention: str | None) -> tuple[str, Detection, int]:
    """(harness text, detection, lines marked TODO) for the model sources in `folder`; bad input when no model
    class or no convention is found."""
    found = detect(folder, convention)
    if found.model_class is None:
        raise UserError(f"{folder}: {found.reason}")
    if found.convention == UNKNOWN:
        raise UserError(f"{folder}: the calling convention is unknown: {found.reason}; name one with --convention "
                        f"{'|'.join(CONVENTIONS)}")
    context = harness_context(folder.resolve().name, found)
    # Rendered twice: the header says how many lines carry the TODO marker, which only the rendered text knows.
    todo = sum(TODO in line for line in render("harness.py.j2", **context, todo_count=0).splitlines())
    return render("harness.py.j2", **context, todo_count=todo), found, todo


def convention_harness(folder: Path, convention: str, file: Path) -> tuple[str, Detection]:
    """The harness `graphmode init` would write for `convention` ("auto": the detected one), for a target file;
    refused unless it needs no person's edits."""
    if convention not in (*CONVENTIONS, "auto"):
        raise UserError(f"{file}: [target] convention must be one of {', '.join(CONVENTIONS)} or auto, got "
                        f"{convention!r}")
    text, found, todo = render_harness(folder, None if convention == "auto" else convention)
    if todo:
        raise UserError(f"{file}: the harness for convention {found.convention} needs {todo} line(s) filled in by a "
                        f"person: run `graphmode init {folder} --convention {found.convention}`, fill the lines marked "
                        "TODO(graphmode), and drop convention from [target]")
    return text, found


def write_convention_target(folder: Path, dest: Path, harness: str) -> Path:
    """A copy of the folder's Python files with the written harness beside them, swapped in whole: the user's
    folder gets nothing."""
    with swapped_in(dest) as staging:
        for source in folder.glob("*.py"):
            shutil.copyfile(source, staging / source.name)
        write_atomic(staging / "harness.py", harness)
    return dest
