"""Failures of a verification laid at the door of a change the person declined.

A graph break or a recompile the adapted run saw points at a line of the adapted sources. Mapped back to the
original's line (transforms.pipeline.original_to_adapted, inverted), it falls inside the edits a planned change
would have made there: when that change was declined, the report names it ("C1 `hoist_item`, which you declined,
rewrites model.py:141, where Decode broke its graph").
"""
from __future__ import annotations

from pathlib import Path

from graphmode.agent.errors import UserError
from graphmode.agent.sources import read_source
from graphmode.agent.state import RunState
from graphmode.transforms.pipeline import original_to_adapted


def declined_causes(state: RunState) -> list[dict]:
    """[{"change", "codemod", "title", "path", "line" (the original's), "adapted_line", "what"}] for every graph
    break or recompile of the adapted run on a line a declined change would have rewritten; [] when none."""
    verification = state.verification
    declined = [c for c in state.plan if c.id not in set(state.approved or [])]
    if verification is None or not verification.ran or not declined:
        return []
    seen = [(r, "graph break") for r in verification.break_reasons]
    seen += [(r, "recompile") for r in (verification.adapted or {}).get("recompile_details", [])]
    to_original: dict[str, dict[int, int]] = {}
    causes: list[dict] = []
    for reason, what in seen:
        path, line = reason.get("file"), reason.get("line")
        if not path or line is None or Path(path).is_absolute():
            continue  # library code (an absolute path) is no line of the target's sources
        if path not in to_original:
            to_original[path] = _adapted_to_original(state, path)
        original_line = to_original[path].get(line)
        for change in declined if original_line is not None else []:
            if any(edit["path"] == path and edit["start_line"] <= original_line <= edit["end_line"]
                   for edit in change.edits):
                cause = {"change": change.id, "codemod": change.codemod, "title": change.title, "path": path,
                         "line": original_line, "adapted_line": line, "what": what}
                if cause not in causes:
                    causes.append(cause)
    return causes


def _adapted_to_original(state: RunState, path: str) -> dict[int, int]:
    try:
        original = read_source(Path(state.options.target), path)
        adapted = (Path(state.adapted_dir) / path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, UserError):
        return {}
    return {new: old for old, new in original_to_adapted(original, adapted).items()}
