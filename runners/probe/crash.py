"""What really stopped a compiled run: the innermost exception, and the line of the user's code.

Dynamo and its backends wrap the error that stopped them, and the wrapper's first line says nothing
("BackendCompilerFailed: backend='aot_eager' raised:"). Measured on torch 2.13 (tests/test_probe.py):
a Decode that runs under `@torch.inference_mode()` raises BackendCompilerFailed `from None`; the real
error is its `inner_exception` (also its suppressed `__context__`), RuntimeError("Cannot set
version_counter for inference tensor"), and the user's line is only in that error's message, under
"Original traceback:" (Dynamo's own errors say "from user code:"), never in a Python traceback.
"""
from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from graphmode.runners.measure.dynamo_watch import _USER_FRAME, _inside

# Where a compiler error's message starts the user-code stack it was tracing (outermost first).
_STACK_MARKERS = ("Original traceback:", "from user code:")
_MAX_MESSAGE = 400


@dataclass(frozen=True)
class Crash:
    """The innermost exception of a chain and the user line it happened at."""
    type: str  # the innermost exception's class name, e.g. "RuntimeError"
    message: str  # its first line, plus Dynamo's "Explanation:" line when it gives one
    file: str | None  # relative to the target folder; None when no frame was inside it
    line: int | None
    wrapped_in: list[str] = field(default_factory=list)  # the outer exceptions' class names, outermost first

    @property
    def cause(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type

    @property
    def where(self) -> str | None:
        return f"{self.file}:{self.line}" if self.file and self.line else None

    def text(self) -> str:
        """One line: 'Type: message (at file:line)'."""
        return f"{self.cause} (at {self.where})" if self.where else self.cause

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cause": self.cause, "where": self.where, "text": self.text()}


def exception_chain(exc: BaseException) -> list[BaseException]:
    """exc and the exceptions behind it, outermost first.

    Each step follows `__cause__`, else a Dynamo wrapper's `inner_exception`, else `__context__`. A
    context that `raise ... from None` hid is followed only when torch hid it: torch's wrappers hide
    the real error that way, while user code that says `from None` means its context does not matter.
    """
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        inner = getattr(current, "inner_exception", None)
        if current.__cause__ is not None:
            current = current.__cause__
        elif isinstance(inner, BaseException):
            current = inner
        elif current.__context__ is not None and (
                not current.__suppress_context__ or type(current).__module__.startswith("torch")):
            current = current.__context__
        else:
            current = None
    return chain


def _message(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return ""
    text = lines[0]
    explanation = next((line for line in lines[1:] if line.startswith("Explanation:")), None)
    if explanation:
        text += f"; {explanation}"
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE - 3] + "..."


def _frames(exc: BaseException) -> list[tuple[str, int, str]]:
    """The frames one exception knows of, outermost first: its Python traceback, then the user-code
    stack a compiler error quotes in its message (deeper: it is what was being traced), then the
    `real_stack` Dynamo attaches to some of its errors."""
    frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    message = str(exc)
    starts = [message.find(marker) for marker in _STACK_MARKERS if marker in message]
    if starts:
        frames += [(m["file"], int(m["line"]), "") for m in _USER_FRAME.finditer(message[min(starts):])]
    frames += [(f.filename, f.lineno or 0, f.name) for f in getattr(exc, "real_stack", None) or ()]
    return frames


def describe_crash(exc: BaseException, folder: Path) -> Crash:
    """The innermost exception of exc's chain, and the innermost frame inside `folder` of the first
    exception, from the innermost out, that has one (frames in torch or graphmode are not the user's)."""
    folder = Path(folder).resolve()
    chain = exception_chain(exc)
    innermost = chain[-1]
    file = line = None
    for current in reversed(chain):
        inside = [f for f in _frames(current) if _inside(f[0], folder)]
        if inside:
            file, line = str(Path(inside[-1][0]).resolve().relative_to(folder)), inside[-1][1]
            break
    return Crash(type(innermost).__name__, _message(innermost), file, line,
                 [type(e).__name__ for e in chain[:-1]])
