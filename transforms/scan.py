"""`graphmode scan`: the static rules over many files, fast, one clear error per unreadable file.

Speed comes from three things: a byte-level pre-filter that spares the rules files which cannot hold a
finding (no model step, no compile call), the rules' single pass over each remaining file, and worker
processes when there are enough files to pay for them. A file the pre-filter spares is still read and
parsed (Python's own parser, fast): one that cannot be is an error line like any other, never "clean".
Files are decoded as Python decodes them (a PEP 263 coding line, else UTF-8), and anything that is not a
regular file (a FIFO named `x.py`) is reported and skipped, never opened.

Whether a codemod fixes a finding is known only by running it: the codemods say which kinds of hazard
they handle (`FIXES`, read by `may_fix`), not whether they recognise the idiom at that line. By default the
scan claims no fix (and imports no libcst); `check_fixes=True` runs the codemod pipeline over each
file with findings, as `graphmode adapt` would, and marks `autofix` exactly on the findings one of
its edits fixes (transforms.pipeline.fixed_by).
"""
from __future__ import annotations

import ast
import functools
import io
import os
import stat
import time
import tokenize
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from graphmode.transforms.findings import Finding
from graphmode.transforms.rules import scan_source

# The codemods' package, whose sources `_fixers` reads.
_CODEMODS_FOLDER = Path(__file__).parent / "codemods"

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
    parsed: int = 0  # files that passed the pre-filter and went through the rules
    spared: int = 0  # files with no model step or compile call: parsed, not checked by the rules
    findings: list[Finding] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    seconds: float = 0.0
    fixes_checked: bool = False  # the codemods were run: `autofix` and `fixed_by` are known, not guessed
    fixed_by: dict[Finding, str] = field(default_factory=dict)  # finding (autofix=True) -> the codemod that fixes it


def may_fix(code: str) -> tuple[str, ...]:
    """The codemods that handle this kind of hazard (they may still not recognise a given line), in the order
    they run; () when only a person can fix it. Each codemod's `FIXES` is the one statement of this."""
    return _fixers().get(code, ())


@functools.cache
def _fixers() -> dict[str, tuple[str, ...]]:
    """Rule code -> the codemods whose `FIXES` name it, in `CHAIN` order. Read from the codemods' source (the
    literal `NAME` and `FIXES` of each class `CHAIN` lists) rather than imported: importing them loads libcst,
    which a scan without `check_fixes` never does. tests/test_rules.py checks this against the imported CHAIN."""
    package = ast.parse((_CODEMODS_FOLDER / "__init__.py").read_text(encoding="utf-8"))
    modules = _codemod_modules(package)
    chain = next(stmt.value for stmt in package.body
                 if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "CHAIN")
    found: dict[str, list[str]] = {}
    for element in chain.elts:
        values = _class_assignments(element.id, modules[element.id])
        for code in _literal_fixes(element.id, values["FIXES"]):
            found.setdefault(code, []).append(ast.literal_eval(values["NAME"]))
    return {code: tuple(names) for code, names in found.items()}


def _codemod_modules(package: ast.Module) -> dict[str, Path]:
    """Each codemod class the package imports -> its file under the package:
    graphmode.transforms.codemods.<idiom>.<module> -> <idiom>/<module>.py."""
    return {alias.asname or alias.name: Path(*stmt.module.split(".")[3:]).with_suffix(".py")
            for stmt in package.body if isinstance(stmt, ast.ImportFrom)
            and (stmt.module or "").startswith("graphmode.transforms.codemods.") for alias in stmt.names}


def _class_assignments(class_name: str, file: Path) -> dict[str, ast.expr]:
    """The names a codemod class's body assigns (NAME, FIXES...) -> their value's expression, from its source."""
    module = ast.parse((_CODEMODS_FOLDER / file).read_text(encoding="utf-8"))
    codemod = next(s for s in module.body if isinstance(s, ast.ClassDef) and s.name == class_name)
    return {target.id: stmt.value for stmt in codemod.body if isinstance(stmt, ast.Assign)
            for target in stmt.targets if isinstance(target, ast.Name)}


def _literal_fixes(class_name: str, fixes: ast.expr) -> Iterable[str]:
    """The rule codes a FIXES expression names: `frozenset({"GM101", ...})`, or `frozenset()` for a fusion, which
    fixes none."""
    if not (isinstance(fixes, ast.Call) and len(fixes.args) <= 1 and not fixes.keywords):
        raise ValueError(f"{class_name}.FIXES is not written `frozenset({{...}})`")
    return ast.literal_eval(fixes.args[0]) if fixes.args else ()


def fix_note(finding: Finding, result: ScanResult) -> str:
    """What the text output says about fixing one finding: checked, or only possible."""
    candidates = may_fix(finding.code)
    if finding in result.fixed_by:
        return f"autofix: {result.fixed_by[finding]}"
    if not candidates:
        return ""
    if result.fixes_checked:
        return "no codemod fixes it here"
    names = ", ".join(candidates[:-1]) + (" or " if len(candidates) > 1 else "") + candidates[-1]
    return f"codemod: {names} may fix"


def finding_record(finding: Finding, result: ScanResult) -> dict:
    """One finding for the JSON output: its fields, the codemods that may fix it, and, when the fixes
    were checked, the one that does (`autofix` is true only then)."""
    return {**finding.to_dict(), "may_fix": list(may_fix(finding.code)), "fix_checked": result.fixes_checked,
            "fixed_by": result.fixed_by.get(finding)}


def python_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Every .py file under the given files and folders, in a stable order; raises for a missing path."""
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        if not path.is_dir():  # a file, or something that is not one: _scan_file says which
            yield path
            continue
        for folder, subfolders, names in os.walk(path):
            subfolders[:] = sorted(d for d in subfolders if d not in _SKIPPED_FOLDERS)
            for name in sorted(names):
                if name.endswith(".py"):
                    yield Path(folder) / name


def scan_file(path: Path, check_fixes: bool = False, entry_class: str | None = None
              ) -> tuple[list[Finding], FileError | None, bool, dict[Finding, str]]:
    """Findings of one file, or the reason it could not be scanned; whether it was parsed; and, with
    `check_fixes`, the findings a codemod fixes (with autofix=True, in the list too) -> that codemod."""
    findings, error, parsed = _scan_file(path)
    if not check_fixes or not any(may_fix(f.code) for f in findings):
        return findings, error, parsed, {}
    try:
        fixed = _fixed(decode_source(path.read_bytes()), findings, entry_class)
    except Exception as exc:  # noqa: BLE001 - a codemod failing on one file must not end the scan
        return findings, FileError(str(path), f"fixes not checked: {type(exc).__name__}: {exc}"), parsed, {}
    marked = {i: replace(findings[i], autofix=True) for i in fixed}
    return ([marked.get(i, f) for i, f in enumerate(findings)], error, parsed,
            {marked[i]: name for i, name in fixed.items()})


def _fixed(source: str, findings: list[Finding], entry_class: str | None) -> dict[int, str]:
    """Index of each finding one of the codemods' edits fixes -> that codemod, running every codemod
    over the file as `graphmode adapt` would (libcst is imported here only)."""
    from graphmode.transforms.codemods import Options
    from graphmode.transforms.pipeline import adapt_source, fixed_by

    path = findings[0].path
    adaptation = adapt_source(source, path, None, Options(entry_class=entry_class))
    found = {i: fixed_by(f, adaptation.edits) for i, f in enumerate(findings)}
    return {i: name for i, name in found.items() if name is not None}


def decode_source(data: bytes) -> str:
    """Source bytes as Python reads them: the encoding a PEP 263 coding line (or a BOM) names, else UTF-8.
    Raises SyntaxError for an unknown encoding, UnicodeDecodeError for bytes that are not in it."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    text = data.decode(encoding)
    return text[1:] if text.startswith("\ufeff") else text


def _scan_file(path: Path) -> tuple[list[Finding], FileError | None, bool]:
    """Findings of one file, or the reason it could not be scanned; and whether the rules ran over it."""
    read = _read_source(path)
    if isinstance(read, FileError):
        return [], read, False
    data, text = read
    if not any(marker in data for marker in _MUST_CONTAIN):
        # No model step: no rule can fire, but a file that does not parse is still an error, not clean.
        return [], _parse_error(path, text), False
    try:
        return scan_source(text, str(path)), None, True
    except SyntaxError as error:
        return [], FileError(str(path), f"{error.lineno or 1}:{error.offset or 1}: syntax error: {error.msg}"), True
    except (RecursionError, ValueError) as error:  # absurdly nested code; a NUL byte
        return [], FileError(str(path), f"cannot parse: {type(error).__name__}: {error}"), True


def _read_source(path: Path) -> tuple[bytes, str] | FileError:
    """A regular file's bytes and its text, or why they cannot be had."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return FileError(str(path), "not a regular file (a FIFO, socket or device); skipped unread")
        data = path.read_bytes()
    except OSError as error:
        return FileError(str(path), f"cannot read: {error.strerror}")
    try:
        return data, decode_source(data)
    except SyntaxError as error:  # detect_encoding: an unknown coding name
        return FileError(str(path), f"cannot decode: {error.msg}")
    except UnicodeDecodeError as error:
        return FileError(str(path), f"not {error.encoding} text ({error.reason} at byte {error.start})")


def _parse_error(path: Path, text: str) -> FileError | None:
    """Why the file's text does not parse, None when it does."""
    try:
        ast.parse(text, str(path))
    except SyntaxError as error:
        return FileError(str(path), f"{error.lineno or 1}:{error.offset or 1}: syntax error: {error.msg}")
    except (RecursionError, ValueError, MemoryError) as error:
        return FileError(str(path), f"cannot parse: {type(error).__name__}: {error}")
    return None


def scan_paths(paths: Iterable[Path], jobs: int | None = None, check_fixes: bool = False,
               entry_class: str | None = None) -> ScanResult:
    """Every finding under `paths`. `check_fixes`: run the codemods too, to mark what they fix;
    `entry_class` is the model class a harness would build (the one that gets prefill/decode entries)."""
    started = time.perf_counter()
    files = list(python_files(paths))
    jobs = jobs or os.cpu_count() or 1
    result = ScanResult(files=len(files), fixes_checked=check_fixes)
    scan_one = partial(scan_file, check_fixes=check_fixes, entry_class=entry_class)
    if jobs > 1 and len(files) >= _PARALLEL_FROM:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            outcomes = list(pool.map(scan_one, files, chunksize=max(1, len(files) // (jobs * 8))))
    else:
        outcomes = [scan_one(f) for f in files]
    for findings, error, parsed, fixed in outcomes:
        result.findings += findings
        result.parsed += parsed
        result.spared += not parsed and error is None
        result.fixed_by.update(fixed)
        if error is not None:
            result.errors.append(error)
    result.seconds = time.perf_counter() - started
    return result
