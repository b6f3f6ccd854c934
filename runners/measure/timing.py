"""Timing one call with device synchronisation at both boundaries, and when repeated timings are too spread to quote.

Standard library only: the batch summary reads the same verdict the reports give without importing torch.
"""
from __future__ import annotations

import time
from typing import Callable, Mapping, TypeVar

T = TypeVar("T")

# A timing figure whose slowest run exceeds its fastest by this factor is flagged: on a quiet machine
# repeated runs agree far better; a wider spread means contention (or a figure too small to time).
SPREAD = 1.5
STEADY_FIGURES = ("prefill_ms", "tpot_ms", "generation_s")


def timed(call: Callable[[], T], synchronize: Callable[[], None]) -> tuple[T, float]:
    """(result, seconds). Syncing before keeps earlier queued work out of this measurement;
    syncing after makes the timer wait for the work itself, not just its launch."""
    synchronize()
    start = time.perf_counter()
    result = call()
    synchronize()
    return result, time.perf_counter() - start


def speedup_unstable(speedup_range: Mapping[str, float], unstable_figures: list[str]) -> bool:
    """Whether a Decode speed-up cannot be quoted: the extreme runs put it more than SPREAD apart, or either side's
    per-token Decode time (tpot_ms) spread that much over its own runs. One run per side measures no spread, so it
    is never called unstable here; the reports say that it was one run."""
    low, high = speedup_range.get("min"), speedup_range.get("max")
    spread = bool(low) and high is not None and high > SPREAD * low
    return spread or any(figure.endswith(".tpot_ms") for figure in unstable_figures)


# The qualifier a printed speed figure carries when its report calls it unstable: the report's own words.
UNSTABLE_QUALIFIER = "unstable, not to be quoted"


def qualified(figure: str, unstable: bool | None) -> str:
    """A speed figure as every place that prints one shows it (the terminal's verify line, the batch table, its
    progress lines and summary.md): with the report's qualifier when the report calls the figure unstable, so no
    figure the report will not quote is printed bare anywhere else."""
    return f"{figure} ({UNSTABLE_QUALIFIER})" if unstable else figure
