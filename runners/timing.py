"""Timing one call with device synchronisation at both boundaries."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def timed(call: Callable[[], T], synchronize: Callable[[], None]) -> tuple[T, float]:
    """(result, seconds). Syncing before keeps earlier queued work out of this measurement;
    syncing after makes the timer wait for the work itself, not just its launch."""
    synchronize()
    start = time.perf_counter()
    result = call()
    synchronize()
    return result, time.perf_counter() - start
