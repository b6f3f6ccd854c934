"""Progress lines from inside a long step (verify's runs) to whoever shows them (the command line).

The workflow's nodes cannot reach the terminal: they run inside LangGraph and may be resumed in another
process. A node hands its lines to `say`; the command line sets the listener for the length of a session.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

_listener: Callable[[str], None] | None = None


def say(line: str) -> None:
    if _listener is not None:
        _listener(line)


@contextmanager
def listening(listener: Callable[[str], None]) -> Iterator[None]:
    global _listener
    previous, _listener = _listener, listener
    try:
        yield
    finally:
        _listener = previous
