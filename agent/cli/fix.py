"""`graphmode fix PATH... [--diff] [--jobs N] [--out DIR]`: the rewrites alone, written as copies or shown.

With --diff, each file's diff is printed as soon as it and the files before it (by path) are done, so the output is
the same whatever --jobs finishes first, and an interrupted run keeps every diff printed so far.

The originals are never touched. Without `--diff`, OUT gets an adapted copy of every file a codemod changed
(at its place under the folder given), graphmode_static.py beside the copies that import it, `changes.diff` with
every change, and `fix.json` with each file's result; all of it is written into a new folder that replaces OUT
only once complete, so an interrupted run leaves the last complete output (or none), never a mix.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from graphmode.agent.errors import UserError
from graphmode.transforms.fix import FileFix, files_to_fix, fix_files

# Exit status: the worst outcome over the files.
EXIT_CLEAN, EXIT_MANUAL, EXIT_UNREADABLE, EXIT_CRASHED = 0, 1, 2, 3
_MARKER = "fix.json"  # a folder holding one was written by `graphmode fix`, and may be replaced by it


def run_fix(paths: list[Path], out: Path, show_diff: bool, jobs: int | None, entry_class: str | None,
            console: Console, errors: Console) -> int:
    try:
        files = files_to_fix(paths)
    except FileNotFoundError as error:
        raise UserError(str(error)) from None
    if not show_diff:
        _check_out(out, paths)
    started = time.perf_counter()
    files.sort(key=lambda file: file[1])
    # Each file is said (its items, errors and, with --diff, its diff) as soon as it and every file before it are
    # done: the order is the files' whatever --jobs finishes first, and an interrupted run keeps what was said.
    in_order = InOrder([relative for _, relative in files],
                       lambda result: _say(result, show_diff, console, errors))
    results = _run(files, jobs, entry_class, errors, in_order.add)
    results.sort(key=lambda r: r.relative)
    if show_diff:
        # Imported once files are read: the module reads libcst, which a refused command never imports.
        from graphmode.transforms.output.helper_module import helper_module_diffs

        sys.stdout.write(helper_module_diffs(_adapted(results)))
        sys.stdout.flush()
    else:
        _write(out, results, time.perf_counter() - started)
    errors.print(_summary(results, time.perf_counter() - started, None if show_diff else out), soft_wrap=True,
                 markup=False)
    return max((_exit_status(r) for r in results), default=EXIT_CLEAN)


class InOrder:
    """Hands results on in a fixed order while they arrive in any: each one once every result before it is in."""

    def __init__(self, order: list[str], hand_on: Callable[[FileFix], None]):
        self._order = order
        self._hand_on = hand_on
        self._waiting: dict[str, FileFix] = {}
        self._next = 0

    def add(self, result: FileFix) -> None:
        self._waiting[result.relative] = result
        while self._next < len(self._order) and self._order[self._next] in self._waiting:
            self._hand_on(self._waiting.pop(self._order[self._next]))
            self._next += 1


def _say(result: FileFix, show_diff: bool, console: Console, errors: Console) -> None:
    """One file's items for a person, its errors and, with --diff, its diff, flushed at once."""
    for item in result.manual:
        console.print(f"{result.path}:{item['line']}: {item['codemod']} {item['reason']}", soft_wrap=True,
                      markup=False)
    if result.no_entry:
        listed = f" (candidates: {', '.join(result.candidates)})" if result.candidates else ""
        named = f"no class `{result.entry_class}` in it" if result.entry_class else "no entry class found"
        errors.print(f"{result.path}: no entry points added: {named}; rerun with `--entry-class NAME`{listed}",
                     soft_wrap=True, markup=False)
    if result.status in ("unreadable", "crashed"):
        kind = "error" if result.status == "unreadable" else "internal error (a codemod bug)"
        errors.print(f"{result.path}: {kind}: {result.error}", soft_wrap=True, markup=False)
    if show_diff:
        sys.stdout.write(result.diff)
    sys.stdout.flush()


def _exit_status(result: FileFix) -> int:
    if result.status == "crashed":
        return EXIT_CRASHED
    if result.status == "unreadable":
        return EXIT_UNREADABLE
    return EXIT_MANUAL if result.manual else EXIT_CLEAN


def _run(files: list[tuple[Path, str]], jobs: int | None, entry_class: str | None, errors: Console,
         done: Callable[[FileFix], None]) -> list[FileFix]:
    if not errors.is_terminal or len(files) < 2:
        return list(fix_files(files, entry_class, jobs, done=done))
    columns = (TextColumn("fix"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    with Progress(*columns, console=errors, transient=True) as progress:
        task = progress.add_task("", total=len(files))
        return list(fix_files(files, entry_class, jobs,
                              done=lambda r: (done(r), progress.update(task, advance=1, description=r.relative))))


def _check_out(out: Path, paths: list[Path]) -> None:
    resolved = out.resolve()
    for given in paths:
        folder = given.resolve()
        if folder.is_dir() and (resolved == folder or folder in resolved.parents):
            raise UserError(f"--out {out}: the output must be outside {given} (a second run would rewrite the copies)")
    if out.exists() and not (out.is_dir() and (out / _MARKER).is_file()):
        raise UserError(f"--out {out}: exists and was not written by `graphmode fix`; choose another folder")


def _write(out: Path, results: list[FileFix], seconds: float) -> None:
    from graphmode.transforms.output.helper_module import helper_module_diffs, helper_modules

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        adapted = _adapted(results)
        for relative, text in {**adapted, **helper_modules(adapted)}.items():
            copy = staging / relative
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(text, encoding="utf-8")
        (staging / "changes.diff").write_text("".join(r.diff for r in results) + helper_module_diffs(adapted),
                                              encoding="utf-8")
        summary = {"files": len(results), "seconds": round(seconds, 2), "counts": _counts(results),
                   "results": [r.record() for r in results]}
        (staging / _MARKER).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            staging.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _adapted(results: list[FileFix]) -> dict[str, str]:
    """The rewritten files' texts by their places under OUT."""
    return {r.relative: r.adapted for r in results if r.status == "rewritten"}


def _counts(results: list[FileFix]) -> dict[str, int]:
    counts = {status: 0 for status in ("rewritten", "unchanged", "unreadable", "crashed")}
    for result in results:
        counts[result.status] += 1
    counts["manual_items"] = sum(len(r.manual) for r in results)
    return counts


def _summary(results: list[FileFix], seconds: float, out: Path | None) -> str:
    counts = _counts(results)
    where = f"; copies and changes.diff in {out}" if out is not None and counts["rewritten"] else ""
    return (f"{len(results)} files in {seconds:.1f} s: {counts['rewritten']} rewritten, "
            f"{counts['unchanged']} unchanged, {counts['unreadable']} unreadable, {counts['crashed']} crashed; "
            f"{counts['manual_items']} items for a person{where}")
