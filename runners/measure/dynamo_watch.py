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

import logging
import re
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


@dataclass
class SourceReason:
    """A reason Dynamo gave (graph break or guard failure) and the user line it points at."""
    reason: str
    file: str
    line: int | None
    function: str = ""

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


def pick_frame(frames: list[tuple[str, int, str]], root: Path | None) -> tuple[str, int, str] | None:
    """The innermost frame inside `root`, else the innermost frame; `frames` run outermost first."""
    inside = [f for f in frames if _inside(f[0], root)]
    return (inside or frames or [None])[-1]


def parse_recompile_message(message: str, root: Path | None = None) -> SourceReason:
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
    reason = ""
    for index, text in enumerate(lines[1:], start=1):
        failure = _FAILURE.match(text)
        if failure:  # the first one: the newest
            # Dynamo appends "  # <source line>  # <path>:<line> in <fn>"; keep the guard itself.
            reason = re.split(r"\s{2,}#", failure["reason"], maxsplit=1)[0].strip()
            picked = pick_frame(_user_frames(lines[index + 1:]), root)
            if picked is not None:
                file, line = picked[0], picked[1]
            break
    return SourceReason(reason or message.strip(), _relative(file, root), line, func)


def _user_frames(lines: list[str]) -> list[tuple[str, int, str]]:
    """A guard failure's user stack, from the lines after it: outermost first, up to the next entry's failure."""
    frames = []
    for follow in lines:
        if _FAILURE.match(follow):
            break
        frame = _USER_FRAME.search(follow)
        if frame:
            frames.append((frame["file"], int(frame["line"]), ""))
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
        return [parse_recompile_message(m, self.root) for m in self.recompile_messages]

    @property
    def limit_hit(self) -> bool:
        return len(self._limits.messages) > self._limits_at_mark


def explain_breaks(fn: Callable[..., Any], *args: Any,
                   root: Path | None = None) -> tuple[int, list[SourceReason]]:
    """Graph breaks in one call of fn(*args), with the user line each comes from.

    explain() really runs fn (side effects included) and resets Dynamo first; it is
    followed by another reset here so its cache entries cannot serve the real compile.
    """
    out = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    return out.graph_break_count, [_break_reason(item, root) for item in out.break_reasons]


def _break_reason(item: Any, root: Path | None) -> SourceReason:
    """One graph break: the first line of its reason, at the innermost frame in the user's folder (the line to
    change: a break inside torch.nn code is reached from a user line, which is the one to report)."""
    stack = list(getattr(item, "user_stack", None) or [])
    picked = pick_frame([(f.filename, f.lineno, f.name) for f in stack], root)
    frame = next(f for f in stack if (f.filename, f.lineno, f.name) == picked) if picked else None
    first_line = str(item.reason).strip().splitlines()[0] if str(item.reason).strip() else "unknown"
    if frame is None:
        return SourceReason(first_line, "", None, "")
    return SourceReason(first_line, _relative(frame.filename, root), frame.lineno, frame.name)
