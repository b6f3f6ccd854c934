"""`graphmode scan`: the static rules over many files, fast, one clear error per unreadable file.

Speed comes from three things: a byte-level pre-filter that skips files which cannot hold a finding
(no model step, no compile call), the rules' single pass over each remaining file, and worker
processes when there are enough files to pay for them.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from transforms.findings import Finding
from transforms.rules import scan_source

# A finding needs a model step (a method these words name) or a compile call; a file with none of
# these bytes is skipped unread by the parser.
_MUST_CONTAIN = (b"def forward", b"def decode", b"def prefill", b"def _forward", b"compile")
_SKIPPED_FOLDERS = frozenset({"__pycache__", ".git", ".hg", ".tox", ".venv", "venv", "node_modules", ".mypy_cache"})
_PARALLEL_FROM = 32  # files; below this, starting workers costs more than it saves


@dataclass(frozen=True)
class FileError:
    path: str
    message: str


@dataclass
class ScanResult:
    files: int = 0  # Python files found
    parsed: int = 0  # files that passed the pre-filter and were parsed
    findings: list[Finding] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    seconds: float = 0.0


def python_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Every .py file under the given files and folders, in a stable order; raises for a missing path."""
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        if path.is_file():
            yield path
            continue
        for folder, subfolders, names in os.walk(path):
            subfolders[:] = sorted(d for d in subfolders if d not in _SKIPPED_FOLDERS)
            for name in sorted(names):
                if name.endswith(".py"):
                    yield Path(folder) / name


def scan_file(path: Path) -> tuple[list[Finding], FileError | None, bool]:
    """Findings of one file, or the reason it could not be scanned; and whether it was parsed."""
    try:
        data = path.read_bytes()
    except OSError as error:
        return [], FileError(str(path), f"cannot read: {error.strerror}"), False
    if not any(marker in data for marker in _MUST_CONTAIN):
        return [], None, False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        return [], FileError(str(path), f"not UTF-8 text ({error.reason} at byte {error.start})"), False
    try:
        return scan_source(text, str(path)), None, True
    except SyntaxError as error:
        return [], FileError(str(path), f"{error.lineno or 1}:{error.offset or 1}: syntax error: {error.msg}"), True
    except (RecursionError, ValueError) as error:  # absurdly nested code; a NUL byte
        return [], FileError(str(path), f"cannot parse: {type(error).__name__}: {error}"), True


def scan_paths(paths: Iterable[Path], jobs: int | None = None) -> ScanResult:
    started = time.perf_counter()
    files = list(python_files(paths))
    jobs = jobs or os.cpu_count() or 1
    result = ScanResult(files=len(files))
    if jobs > 1 and len(files) >= _PARALLEL_FROM:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            outcomes = list(pool.map(scan_file, files, chunksize=max(1, len(files) // (jobs * 8))))
    else:
        outcomes = [scan_file(f) for f in files]
    for findings, error, parsed in outcomes:
        result.findings += findings
        result.parsed += parsed
        if error is not None:
            result.errors.append(error)
    result.seconds = time.perf_counter() - started
    return result
