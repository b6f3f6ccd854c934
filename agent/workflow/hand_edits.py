"""Which files of an adapted folder differ from what graphmode wrote there, read from the changes.diff written beside
them (`graphmode adapt`'s run folder, `graphmode fix`'s output folder).

A file's diff against the original is made again, the way graphmode made it (difflib's unified diff, `a/` and `b/`
paths), and set against its section of changes.diff: a file whose diff is not the one graphmode wrote was edited
after graphmode wrote it (or the original changed since). A file changes.diff does not name that differs from the
original was edited too, and a file it names that is gone was removed.
"""
from __future__ import annotations

import difflib
from pathlib import Path

NEW_FILE = "/dev/null"


def written_diffs(changes_diff: str) -> dict[str, str]:
    """changes.diff cut into each file's section, by the file's path (its `+++ b/PATH` line)."""
    sections: dict[str, str] = {}
    lines = changes_diff.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines)
              if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ b/")]
    for start, end in zip(starts, [*starts[1:], len(lines)]):
        path = lines[start + 1][len("+++ b/"):].rstrip("\n")
        sections[path] = "".join(lines[start:end])
    return sections


def file_diff(original: Path | None, adapted: Path, relative: str) -> str:
    """`adapted` against `original` (None: a new file), as graphmode writes a file's diff; `relative` is the path
    changes.diff names it by."""
    old = original.read_text(encoding="utf-8").splitlines(keepends=True) if original is not None else []
    return "".join(difflib.unified_diff(old, adapted.read_text(encoding="utf-8").splitlines(keepends=True),
                                        fromfile=f"a/{relative}" if original is not None else NEW_FILE,
                                        tofile=f"b/{relative}"))


def edited_files(original_dir: Path, adapted_dir: Path, changes_diff: Path, prefix: str = "") -> list[dict[str, str]]:
    """Every file of `adapted_dir` that is not as graphmode wrote it: {"path", "how"} with how "edited" or
    "removed", by path. `prefix`: where changes.diff puts `adapted_dir`'s files (`graphmode fix FOLDER` writes them
    under the folder's name, "FOLDER/")."""
    written = {path[len(prefix):]: text for path, text in
               written_diffs(changes_diff.read_text(encoding="utf-8")).items() if path.startswith(prefix)}
    found = [{"path": path.relative_to(adapted_dir).as_posix(), "how": "edited"}
             for path in sorted(p for p in adapted_dir.rglob("*.py") if "__pycache__" not in p.parts)
             if not _as_written(path, path.relative_to(adapted_dir).as_posix(), original_dir, written, prefix)]
    found += [{"path": relative, "how": "removed"} for relative in sorted(written)
              if not (adapted_dir / relative).is_file()]
    return sorted(found, key=lambda item: item["path"])


def _as_written(path: Path, relative: str, original_dir: Path, written: dict[str, str], prefix: str) -> bool:
    """`path` (`relative` in the adapted folder) is as graphmode wrote it: its diff from the original is the one
    changes.diff holds, or, where graphmode left the file as it was, it is the original's bytes."""
    original = original_dir / relative
    if relative in written:
        return file_diff(original if original.is_file() else None, path, prefix + relative) == written[relative]
    return original.is_file() and original.read_bytes() == path.read_bytes()
