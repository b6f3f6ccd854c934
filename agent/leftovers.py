"""Which of the items left for a person sit on lines the adapted Decode really runs.

Rules and codemods judge by reading the source; the verifier traces one eager Decode step of the
adapted model (runners/line_trace.py). An item on a line Decode never runs (a flash-attention path,
a training branch, another head) does not stand between the model and graph mode; the report says so.
"""
from __future__ import annotations

from pathlib import Path

from transforms.pipeline import original_to_adapted


def mark_decode_runs(manual: list[dict], decode_lines: dict[str, list[int]], target: Path,
                     adapted_dir: Path) -> list[dict]:
    """Copies of the items, each with `decode_runs`: True or False, or None when nothing was traced."""
    if not decode_lines:
        return [{**item, "decode_runs": None} for item in manual]
    maps: dict[str, dict[int, int]] = {}
    marked = []
    for item in manual:
        path = item["path"]
        if path not in maps:
            original = (target / path).read_text(encoding="utf-8")
            adapted_file = adapted_dir / path
            adapted = adapted_file.read_text(encoding="utf-8") if adapted_file.is_file() else original
            maps[path] = original_to_adapted(original, adapted)
        line = maps[path].get(item["line"])
        runs = None if line is None else line in set(decode_lines.get(path, ()))
        marked.append({**item, "decode_runs": runs})
    return marked
