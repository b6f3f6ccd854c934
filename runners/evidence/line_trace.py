"""Which lines of the user's sources one call runs, by `sys.settrace`.

The verifier traces one eager call of the adapted `decode`, so the report can tell a reviewer which of
the findings left for a person sit on lines Decode really runs, and which are in code it never
reaches (flash-attention paths, training branches, other heads): static rules cannot know that.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def lines_run(call: Callable[[], Any], folder: Path) -> tuple[Any, dict[str, list[int]]]:
    """call()'s result, and {path relative to folder: sorted line numbers run} for files under folder."""
    prefix = str(Path(folder).resolve()) + os.sep
    hits: dict[str, set[int]] = {}

    def in_frame(frame, event, _arg):
        if event == "line":
            hits[frame.f_code.co_filename].add(frame.f_lineno)
        return in_frame

    def on_call(frame, _event, _arg):
        # Only frames of the user's files get a line tracer: torch's own code runs untraced, at full speed.
        filename = frame.f_code.co_filename
        if not filename.startswith(prefix):
            return None
        hits.setdefault(filename, set()).add(frame.f_code.co_firstlineno)
        return in_frame

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        result = call()
    finally:
        sys.settrace(previous)
    return result, {os.path.relpath(name, prefix): sorted(lines) for name, lines in hits.items()}
