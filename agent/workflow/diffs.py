"""Each planned change's part of the diff, for the person who approves it.

The design step runs every codemod over each file and gets one unified diff per file. A change's part is the
hunks whose original lines meet one of the change's edits (a hunk where two changes meet shows under both).
Hunks no edit names are the code the changes add together (helper classes and size constants at the top of a
file); they are shown with the whole diff, not under one change.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


@dataclass(frozen=True)
class Hunk:
    path: str
    first: int  # original lines the hunk covers (context included); an insertion covers the line before it
    last: int
    text: str


def hunks(path: str, diff: str) -> list[Hunk]:
    """The hunks of one file's unified diff, without the `---`/`+++` header."""
    found: list[Hunk] = []
    lines: list[str] = []
    span = (0, 0)
    for line in diff.splitlines(keepends=True):
        match = _HUNK.match(line)
        if match:
            if lines:
                found.append(Hunk(path, *span, "".join(lines)))
            start, count = int(match.group(1)), int(match.group(2) or 1)
            span, lines = (start, start + max(count, 1) - 1), [line]
        elif lines:
            lines.append(line)
    if lines:
        found.append(Hunk(path, *span, "".join(lines)))
    return found


def change_diffs(file_diffs: dict[str, str], edits: dict[str, list[dict]]) -> dict[str, str]:
    """Change id -> its hunks as a diff (file headers included), from each file's diff and each change's edits
    (`{"path", "start_line", "end_line"}` in original lines)."""
    every = [h for path, diff in file_diffs.items() for h in hunks(path, diff)]
    out: dict[str, str] = {}
    for change, spans in edits.items():
        mine = [h for h in every if any(s["path"] == h.path and s["start_line"] <= h.last and h.first <= s["end_line"]
                                         for s in spans)]
        out[change] = _as_diff(mine)
    return out


def _as_diff(selected: list[Hunk]) -> str:
    parts: list[str] = []
    current = None
    for hunk in selected:
        if hunk.path != current:
            parts.append(f"--- a/{hunk.path}\n+++ b/{hunk.path}\n")
            current = hunk.path
        parts.append(hunk.text if hunk.text.endswith("\n") else hunk.text + "\n")
    return "".join(parts)
