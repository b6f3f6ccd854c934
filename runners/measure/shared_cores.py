"""Targets of one batch that share this machine's cores: their work overlaps, their timing runs never do.

A batch running several targets side by side on a host without accelerators names a lock file in GRAPHMODE_CORES_LOCK.
Every worker process a target starts holds a shared claim on it for as long as it runs (probe, trace, battery, ...);
a timing run asks for the cores alone, so it starts once every other target's running worker has ended, and while it
runs no other worker starts. Without the variable (one target at a time, or one accelerator per target) nothing waits.
A timing run waits at most GRAPHMODE_CORES_WAIT_S; past it, it runs beside the others and is counted, so its
report can say its figures were not taken alone.

Writers come first (a turnstile, the classic readers-writer scheme over two flock files): a timing run waiting for the
cores blocks new shared claims, so a busy neighbour cannot starve it. POSIX flock only; the standard library only.
"""
from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

LOCK_ENV = "GRAPHMODE_CORES_LOCK"
# How long a timing run waits for the cores alone before it runs beside the others anyway (a neighbour may hang
# until its own time limit): its target's report then calls the speed-up unstable and says why.
WAIT_ENV = "GRAPHMODE_CORES_WAIT_S"
DEFAULT_WAIT_S = 600.0
_POLL_S = 0.1

_waits_given_up = 0  # this process's timing runs that ran beside other targets' work


def waits_given_up() -> int:
    """How many of this process's claims alone gave up waiting so far (verify reads the difference over its runs)."""
    return _waits_given_up


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def _lock(fd: int, mode: int, deadline: float | None) -> bool:
    """flock `fd` in `mode`, polling until `deadline` (time.monotonic; None: no limit); whether it got the lock."""
    if deadline is None:
        fcntl.flock(fd, mode)
        return True
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)


@contextmanager
def claim(alone: bool, environ: Mapping[str, str] | None = None) -> Iterator[bool | None]:
    """Holds the cores, shared or alone, for the block when a batch shares them out. Yields None when it does not
    (nothing to wait for), True once held, and False for a claim alone that waited its limit out (WAIT_ENV) and runs
    beside the others. A shared claim waits as long as it takes: a claim alone lasts one worker, within its limit."""
    global _waits_given_up
    environ = os.environ if environ is None else environ
    path = environ.get(LOCK_ENV)
    if not path:
        yield None
        return
    deadline = time.monotonic() + float(environ.get(WAIT_ENV, DEFAULT_WAIT_S)) if alone else None
    turnstile, fd = _open(path + ".turnstile"), _open(path)
    try:
        # A shared claim only passes the turnstile; a claim alone keeps it until it holds the cores, so that no new
        # shared claim slips in while it waits for the running ones to end.
        held = _lock(turnstile, fcntl.LOCK_EX, deadline) and _lock(fd, fcntl.LOCK_EX if alone else fcntl.LOCK_SH,
                                                                   deadline)
        os.close(turnstile)  # closing a file releases its lock
        turnstile = -1
        if not held:
            _waits_given_up += 1
        yield held
    finally:
        for handle in (turnstile, fd):
            if handle >= 0:
                os.close(handle)


def without_claim(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for a worker: the lock is its parent's to take, never a worker's own (a worker waiting for a
    claim its parent holds alone would wait forever)."""
    return {key: value for key, value in environ.items() if key != LOCK_ENV}
