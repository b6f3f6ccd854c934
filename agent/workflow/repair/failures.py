"""The failures of a verification, at the original's lines, each with the planned change that owns its line.

A graph break or a recompile the adapted run saw points at a line of the adapted sources. Mapped back to the
original's line (transforms.pipeline.original_to_adapted, inverted), it falls inside the edits of a planned change,
or of none. A change a person declined is named with it in the report and at the next confirmation ("C1
`hoist_item`, which you declined, rewrites model.py:141, where Decode broke its graph"); a line no change owns is
something the adapted run revealed, which the repair round plans (agent.workflow.repair).
"""
from __future__ import annotations

from pathlib import Path

from graphmode.agent.errors import UserError
from graphmode.agent.targets.sources import read_source
from graphmode.agent.workflow.state import RunState
from graphmode.transforms.pipeline import original_to_adapted


def mapped_failures(state: RunState) -> list[dict]:
    """[{"what": "graph break" | "recompile", "reason" (the first), "path", "line" (the original's), "adapted_line",
    "count" (how often it was seen there), "change" (the id of the planned change whose edits hold the line, or
    None), "codemod", "title", "approved"}] for every line of the target's sources where the adapted run broke its
    graph or recompiled; library code and lines the adapted file added (with no original line) are left out."""
    verification = state.verification
    if verification is None or not verification.ran:
        return []
    seen = [(r, "graph break") for r in verification.break_reasons]
    seen += [(r, "recompile") for r in (verification.adapted or {}).get("recompile_details", [])]
    to_original: dict[str, dict[int, int]] = {}
    failures: list[dict] = []
    for reason, what in seen:
        path, line = reason.get("file"), reason.get("line")
        if not path or line is None or Path(path).is_absolute():
            continue  # library code (an absolute path) is no line of the target's sources
        if path not in to_original:
            to_original[path] = _adapted_to_original(state, path)
        original_line = to_original[path].get(line)
        if original_line is None:
            continue
        owners = [c for c in state.plan if any(e["path"] == path and e["start_line"] <= original_line <= e["end_line"]
                                               for e in c.edits)]
        # A declined change first: it is the one a person can still do something about.
        owner = next((c for c in owners if c.id not in set(state.approved or [])), owners[0] if owners else None)
        same = next((f for f in failures if (f["what"], f["path"], f["adapted_line"]) == (what, path, line)), None)
        if same is not None:  # one line recompiling on several guards is one failure, seen `count` times
            same["count"] += 1
            continue
        failures.append({"what": what, "reason": str(reason.get("reason") or reason.get("guard") or ""),
                         "path": path, "line": original_line, "adapted_line": line, "count": 1,
                         "change": owner.id if owner else None, "codemod": owner.codemod if owner else None,
                         "title": owner.title if owner else None,
                         "approved": owner is not None and owner.id in set(state.approved or [])})
    return failures


def declined_causes(state: RunState) -> list[dict]:
    """[{"change", "codemod", "title", "path", "line" (the original's), "adapted_line", "what"}] for every graph
    break or recompile of the adapted run on a line a declined change would have rewritten; [] when none."""
    return causes_among(mapped_failures(state))


def causes_among(failures: list[dict]) -> list[dict]:
    """declined_causes, from failures already mapped (mapped_failures)."""
    causes: list[dict] = []
    for failure in failures:
        if failure["change"] is None or failure["approved"]:
            continue
        cause = {key: failure[key] for key in ("change", "codemod", "title", "path", "line", "adapted_line", "what")}
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
