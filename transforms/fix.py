"""`graphmode fix`: the codemods alone over many files, with no harness and nothing run.

What `graphmode adapt` plans without runtime evidence: every codemod in chain order over each file, the entry
points given to the file's causal-LM class (or the class named with `--entry-class`). A file is read, rewritten
in memory and handed back as text; writing and printing are the caller's. Files go to worker processes when
there are several: a file takes the codemods a second or more, and nothing is shared between files.
"""
from __future__ import annotations

import ast
import os
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from graphmode.transforms.scan import decode_source, python_files

_HEADS = ("ForCausalLM", "LMHeadModel")


@dataclass
class FileFix:
    path: str  # as given (or found under a given folder)
    relative: str  # where its adapted copy goes under the output folder
    status: str  # "rewritten", "unchanged", "unreadable" (cannot read, decode or parse), "crashed" (a codemod bug)
    entry_class: str | None = None
    applied: list[str] = field(default_factory=list)
    edits: int = 0
    manual: list[dict] = field(default_factory=list)  # {"line", "codemod", "reason"}, lines of the original
    error: str = ""
    # Rewritten without an entry class (none found, or the one named is not in the file): nothing enters the static
    # path. The file's nn.Module classes no other class of it uses, the likely model classes.
    no_entry: bool = False
    candidates: list[str] = field(default_factory=list)
    seconds: float = 0.0
    diff: str = ""
    adapted: str = ""

    def record(self) -> dict:
        """What fix.json keeps of it: everything but the texts."""
        return {k: v for k, v in asdict(self).items() if k not in ("diff", "adapted")}


def entry_class_of(source: str) -> str | None:
    """The class a causal-LM harness would build: the shortest-named *ForCausalLM / *LMHeadModel; None without."""
    heads = [n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name.endswith(_HEADS)]
    return min(heads, key=len) if heads else None


def _top_level_classes(source: str) -> set[str]:
    return {n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}


def unused_module_classes(source: str) -> tuple[list[str], int]:
    """The top-level `nn.Module` classes (a base named `Module`, or one of them) whose names no other class of the
    file uses, in order, and the line of the first (1 without any): the classes a harness could build."""
    classes = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    modules = _module_classes(classes)
    used = {name for c in classes for name in _names_used_by(c)}
    unused = [c for c in classes if c.name in modules and c.name not in used]
    return [c.name for c in unused], unused[0].lineno if unused else 1


def _names_used_by(cls: ast.ClassDef) -> set[str]:
    """The names a class's code reads, its own name left out."""
    return {node.id for node in ast.walk(cls) if isinstance(node, ast.Name) and node.id != cls.name}


def _module_classes(classes: list[ast.ClassDef]) -> set[str]:
    """The classes with a base named `Module`, and their subclasses wherever they sit in the file."""
    modules: set[str] = set()
    while True:
        found = {c.name for c in classes if any(_base_name(b) in ("Module", *modules) for b in c.bases)}
        if found == modules:
            return modules
        modules = found


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def fix_file(path: Path, relative: str, entry_class: str | None = None) -> FileFix:
    """One file through the codemods. Never raises for a bad file: its status says what went wrong."""
    from graphmode.transforms.codemods import Options
    from graphmode.transforms.pipeline import adapt_source

    started = time.perf_counter()
    result = FileFix(path=str(path), relative=relative, status="unreadable")
    try:
        source = decode_source(path.read_bytes())
        entry = entry_class or entry_class_of(source)
    except OSError as error:
        result.error = f"cannot read: {error.strerror}"
        return result
    except SyntaxError as error:
        result.error = f"{error.lineno or 1}:{error.offset or 1}: syntax error: {error.msg}"
        return result
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        result.error = f"cannot decode or parse: {type(error).__name__}: {error}"
        return result
    result.entry_class = entry
    try:
        adaptation = adapt_source(source, relative, None, Options(entry_class=entry))
    except Exception as error:  # noqa: BLE001 - a codemod failing on one file must not end the run
        result.status = "crashed"
        frame = traceback.extract_tb(error.__traceback__)[-1]
        result.error = f"{type(error).__name__}: {error} (at {Path(frame.filename).name}:{frame.lineno})"
        result.seconds = time.perf_counter() - started
        return result
    result.status = "rewritten" if adaptation.changed else "unchanged"
    result.applied = adaptation.applied
    result.edits = len(adaptation.edits)
    result.manual = [{"line": m.line, "codemod": m.codemod, "reason": m.reason} for m in adaptation.manual]
    if adaptation.changed and entry not in _top_level_classes(source):
        # The static path is written but has no `prefill`/`decode` (nor `setup_caches`): a person names the class.
        result.no_entry = True
        result.candidates, line = unused_module_classes(source)
        listed = f" (candidates: {', '.join(result.candidates)})" if result.candidates else ""
        named = f"no class `{entry}` here" if entry else "no entry class found"
        result.manual.insert(0, {"line": line, "codemod": "split_decode", "reason": (
            f"not applied: {named}, so no `prefill`/`decode` enters the static path; name the model class with "
            f"`--entry-class NAME`{listed}")})
    if adaptation.changed:
        result.diff, result.adapted = adaptation.diff(), adaptation.adapted
    result.seconds = time.perf_counter() - started
    return result


def files_to_fix(paths: list[Path]) -> list[tuple[Path, str]]:
    """(file, path relative to the output folder), each file once. The places are relative to the folder that holds
    every path given, so no two files share one: a folder's files keep theirs under the folder's name, one file is its
    own name, and `a/model.py b/model.py` stay `a/model.py` and `b/model.py`. Raises FileNotFoundError for a missing
    path."""
    files: dict[Path, Path] = {}  # resolved -> as given
    for given in paths:
        for path in python_files([given]):
            files.setdefault(path.resolve(), path)
    if not files:
        return []
    anchor = Path(os.path.commonpath([str(given.resolve().parent) for given in paths]))
    return [(path, resolved.relative_to(anchor).as_posix()) for resolved, path in files.items()]


def fix_files(files: list[tuple[Path, str]], entry_class: str | None = None, jobs: int | None = None,
              done: Callable[[FileFix], None] | None = None) -> Iterator[FileFix]:
    """Each file's result, as they finish (in the order given with one job). `done` is called with each first."""
    jobs = max(1, jobs or os.cpu_count() or 1)
    if jobs == 1 or len(files) < 2:
        for path, relative in files:
            result = fix_file(path, relative, entry_class)
            if done:
                done(result)
            yield result
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(fix_file, path, relative, entry_class) for path, relative in files]
        try:
            for future in as_completed(futures):
                result = future.result()
                if done:
                    done(result)
                yield result
        except BaseException:
            for future in futures:
                future.cancel()
            raise
