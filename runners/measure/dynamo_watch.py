"""Counting what Dynamo compiles, why it recompiles, and whether it gave up.

Measured on torch 2.13 (tests/test_runners.py keeps these honest):
- `counters["stats"]["unique_graphs"]` grows by one per FX graph handed to a backend, for
  torch.compile'd functions and explain alike, so its delta counts compiled graphs.
  `counters["frames"]` is NOT a usable alternative: it only moves for some entry paths
  (explain moved it, torch.compile'd calls did not).
- `torch._dynamo.reset()` clears compiled code but not the counters: always use deltas.
- The guard failure behind a recompile is only published through the "recompiles" logging
  artifact ("Recompiling function ... triggered by the following guard failure(s)"). The
  `fail_on_recompile` stance's RuntimeError names only the function, not the guard.
- Hitting `recompile_limit` (8) logs one warning from torch._dynamo.convert_frame. Without
  fullgraph, Dynamo then runs that frame eagerly for good, with no error; with
  fullgraph=True it raises FailOnRecompileLimitHit on every later call instead.
"""
from __future__ import annotations

import inspect
import linecache
import logging
import re
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch._dynamo.utils import counters

_RECOMPILES_LOGGER = "torch._dynamo.guards.__recompiles"
_CONVERT_FRAME_LOGGER = "torch._dynamo.convert_frame"

_HEADER = re.compile(r"Recompiling function (?P<func>\S+) in (?P<file>.+):(?P<line>\d+)")
_FAILURE = re.compile(r"^\s*- \d+/\d+: (?P<reason>.*)$")
_USER_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_LOG_ITEM = re.compile(r"^\s*- ")
@dataclass
class SourceReason:
    """A reason Dynamo gave (graph break or guard failure) and the user line it points at.

    `code` is that line's source text (the construct a person reads), and `inside` the innermost frame Dynamo stopped
    in ("file:line") when that is another frame than the one reported (library code the reported line called)."""
    reason: str
    file: str
    line: int | None
    function: str = ""
    code: str = ""
    inside: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _relative(file: str, root: Path | None) -> str:
    if root is None:
        return file
    try:
        return str(Path(file).resolve().relative_to(root.resolve()))
    except ValueError:
        return file


def _inside(file: str, root: Path | None) -> bool:
    if root is None:
        return False
    try:
        return Path(file).resolve().is_relative_to(root.resolve())
    except (OSError, ValueError):
        return False
def pick_frame(frames: list[tuple[str, int, str]], root: Path | None,
               own: frozenset[str] | set[str] = frozenset()) -> tuple[str, int, str] | None:
    """The frame to name for a break or guard: the innermost inside `root` (the sources being adapted); else the
    innermost in one of `own`, the files that define the model's own module classes (a model whose code is not in
    `root`, such as transformers' modeling file); else the innermost outside torch and the standard library (a break
    inside torch.nn's `__setattr__` is the caller's construct); else the innermost. `frames` run outermost first."""
    own = {_resolved(file) for file in own}
    for keep in (lambda f: _inside(f[0], root), lambda f: _resolved(f[0]) in own, lambda f: not is_library(f[0])):
        chosen = [f for f in frames if keep(f)]
        if chosen:
            return chosen[-1]
    return frames[-1] if frames else None


def _resolved(file: str) -> str:
    try:
        return str(Path(file).resolve())
    except (OSError, ValueError):
        return file


_TORCH_DIR = Path(torch.__file__).resolve().parent
_STDLIB_DIR = Path(sysconfig.get_paths()["stdlib"]).resolve()


def is_library(file: str) -> bool:
    """torch's own code or the standard library's (not a package installed beside it, transformers included)."""
    path = Path(_resolved(file))
    if path.is_relative_to(_TORCH_DIR):
        return True
    return path.is_relative_to(_STDLIB_DIR) and not {"site-packages", "dist-packages"} & set(path.parts)


def model_files(model: torch.nn.Module) -> frozenset[str]:
    """The files that define the classes of `model`'s modules that hold modules of their own, torch's left out: where
    the model's own code is, wherever it is installed. A leaf module's class alone does not make its file the
    model's (a library's activation or norm helper: a break inside it is the model's line that called it), while a
    leaf defined beside the model's layers is in their file anyway."""
    files = set()
    for module in model.modules():
        if next(module.children(), None) is None:
            continue
        try:
            file = inspect.getsourcefile(type(module))
        except (OSError, TypeError):
            continue
        if file and not is_library(file):
            files.add(_resolved(file))
    return frozenset(files)


def short_path(file: str) -> str:
    """An installed package's file from its package folder on (transformers/models/…/modeling_x.py); others as
    given."""
    parts = Path(file).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            index = len(parts) - 1 - parts[::-1].index(marker)
            return "/".join(parts[index + 1:])
    return file


def code_excerpt(code: str, limit: int = 100) -> str:
    code = " ".join((code or "").split())
    return code if len(code) <= limit else code[:limit - 3].rstrip() + "..."


def parse_recompile_message(message: str, root: Path | None = None,
                            own: frozenset[str] | set[str] = frozenset()) -> SourceReason:
    """The newest guard failure in one "Recompiling function" log message.

    Dynamo lists the failures of every cached entry, newest first; the first one is the
    guard the current call just failed. Its user stack (when Dynamo gives one) points at the
    line that created the guard, which beats the function's first line. Of that stack, the
    innermost frame inside `root` wins (a guard created in torch.nn code is the user's call).
    Guards on a frame's own arguments carry no user stack: the frame's header line is kept
    (for a resume function, the line Dynamo resumed at).
    """
    lines = message.splitlines()
    header = _HEADER.search(lines[0]) if lines else None
    func = header["func"] if header else ""
    file = header["file"] if header else ""
    line = int(header["line"]) if header else None
    reason, code, inside = "", "", ""
    for index, text in enumerate(lines[1:], start=1):
        failure = _FAILURE.match(text)
        if failure:  # the first one: the newest
            # Dynamo appends "  # <source line>  # <path>:<line> in <fn>"; keep the guard itself.
            reason = re.split(r"\s{2,}#", failure["reason"], maxsplit=1)[0].strip()
            frames = _user_frames(lines[index + 1:])
            picked = pick_frame(frames, root, own)
            if picked is not None:
                file, line, code = picked
                inside = _inside_text(frames, picked)
            break
    if not code and file and line:  # a guard on the frame's own arguments: the header's line (where it resumed)
        code = linecache.getline(file, line).strip()
    return SourceReason(reason or message.strip(), _relative(file, root), line, func, code_excerpt(code), inside)


def _inside_text(frames: list[tuple[str, int, str]], picked: tuple[str, int, str]) -> str:
    """The innermost frame as "file:line" when it is not the picked one (library code the picked line called)."""
    innermost = frames[-1]
    return "" if innermost == picked else f"{short_path(innermost[0])}:{innermost[1]}"


def _user_frames(lines: list[str]) -> list[tuple[str, int, str]]:
    """A guard failure's user stack, from the lines after it: outermost first, up to the next entry's failure, each
    (file, line, its source text: the line after the `File ...` one, as Python's tracebacks print it)."""
    frames: list[tuple[str, int, str]] = []
    for follow in lines:
        if _FAILURE.match(follow):
            break
        frame = _USER_FRAME.search(follow)
        if frame:
            frames.append((frame["file"], int(frame["line"]), ""))
        elif frames and not frames[-1][2] and follow.strip():
            # Each line of the message carries the log's "    - " in front of the traceback's own indent.
            frames[-1] = (*frames[-1][:2], _LOG_ITEM.sub("", follow, count=1).strip())
    return frames


class _Collector(logging.Handler):
    def __init__(self, keep: Callable[[logging.LogRecord], bool]) -> None:
        super().__init__(level=logging.DEBUG)
        self.keep = keep
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.keep(record):
            self.messages.append(record.getMessage())


@dataclass
class CompileWatch:
    """Collects compiled graphs, recompiles and recompile-limit hits since the last mark()."""
    root: Path | None = None  # report files relative to this folder when inside it
    own: frozenset[str] = frozenset()  # the model's own files (model_files): named before library code
    _recompiles: _Collector = field(init=False)
    _limits: _Collector = field(init=False)
    _graphs_at_mark: int = field(init=False, default=0)
    _recompiles_at_mark: int = field(init=False, default=0)
    _limits_at_mark: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._recompiles = _Collector(lambda r: r.getMessage().startswith("Recompiling function"))
        self._limits = _Collector(lambda r: "hit config." in r.getMessage())

    def __enter__(self) -> "CompileWatch":
        # The artifact must be switched on or Dynamo never formats the message.
        torch._logging.set_logs(recompiles=True)
        recompiles = logging.getLogger(_RECOMPILES_LOGGER)
        recompiles.addHandler(self._recompiles)
        # Ours only: torch's own handler would print every recompile to stderr again.
        recompiles.propagate = False
        logging.getLogger(_CONVERT_FRAME_LOGGER).addHandler(self._limits)
        self.mark()
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(_RECOMPILES_LOGGER).removeHandler(self._recompiles)
        logging.getLogger(_RECOMPILES_LOGGER).propagate = True
        logging.getLogger(_CONVERT_FRAME_LOGGER).removeHandler(self._limits)

    def mark(self) -> None:
        """Starts a new counting window (e.g. after warm-up)."""
        self._graphs_at_mark = counters["stats"]["unique_graphs"]
        self._recompiles_at_mark = len(self._recompiles.messages)
        self._limits_at_mark = len(self._limits.messages)

    @property
    def graphs(self) -> int:
        """FX graphs compiled since mark()."""
        return counters["stats"]["unique_graphs"] - self._graphs_at_mark

    @property
    def recompile_messages(self) -> list[str]:
        return self._recompiles.messages[self._recompiles_at_mark:]

    @property
    def recompiles(self) -> list[SourceReason]:
        """One entry per guard failure that made Dynamo recompile a frame (or try to)."""
        return [parse_recompile_message(m, self.root, self.own) for m in self.recompile_messages]

    @property
    def limit_hit(self) -> bool:
        return len(self._limits.messages) > self._limits_at_mark


def explain_breaks(fn: Callable[..., Any], *args: Any, root: Path | None = None,
                   own: frozenset[str] | set[str] = frozenset()) -> tuple[int, list[SourceReason]]:
    """Graph breaks in one call of fn(*args), with the user line each comes from.

    explain() really runs fn (side effects included) and resets Dynamo first; it is
    followed by another reset here so its cache entries cannot serve the real compile.
    """
    out = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    return out.graph_break_count, [_break_reason(item, root, own) for item in out.break_reasons]


def _break_reason(item: Any, root: Path | None, own: frozenset[str] | set[str] = frozenset()) -> SourceReason:
    """One graph break: the first line of its reason, at the frame pick_frame names (the line to change: a break
    inside torch.nn code is reached from a line of the model, which is the one to report), with that line's text
    and the innermost frame it stopped in."""
    stack = list(getattr(item, "user_stack", None) or [])
    frames = [(f.filename, f.lineno, f.line or "") for f in stack]
    picked = pick_frame(frames, root, own)
    first_line = str(item.reason).strip().splitlines()[0] if str(item.reason).strip() else "unknown"
    if picked is None:
        return SourceReason(first_line, "", None, "")
    frame = stack[frames.index(picked)]
    return SourceReason(first_line, _relative(frame.filename, root), frame.lineno, frame.name,
                        code_excerpt(frame.line or ""), _inside_text(frames, picked))
